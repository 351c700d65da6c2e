#!/usr/bin/env bash
# test_server_tools.sh - tool calling through `mlxcel serve` on the chat
# fixture (random weights, real Qwen tokenizer), with curl and jq:
#
#  - its own ChatML template has no tool format: tools are refused (400
#    tools_unsupported) unless tool_choice is "none"
#  - with Qwen3's template (the fixtures' tokenizers/qwen3, through
#    --chat-template-file): tool_choice "required" and a named function give
#    a valid call even from random weights (constrained decoding), streamed
#    and not, the same call for the same seed; text the model writes in the
#    hermes format (made exact with a GBNF grammar) is split into content and
#    calls, and a stream never shows a call's markup as content; an earlier
#    call and its result render back through the template; errors
#  - with a Mistral-style template of our own (tests/data/mistral_tools.jinja):
#    the [TOOL_CALLS] format, 9-character call ids
#
# Needs MLXCEL_BIN, MLXCEL_FIXTURES (skips with 77 without), curl and jq.
set -u
export LC_ALL=C.UTF-8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -n "${MLXCEL_FIXTURES:-}" ] || { echo "SKIP: MLXCEL_FIXTURES is not set"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
SRC=${MLXCEL_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
F=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
Q3=$MLXCEL_FIXTURES/tokenizers/qwen3/tokenizer_config.json
for f in "$F" "$Q3"; do [ -e "$f" ] || { echo "FAIL: $f is missing"; exit 1; }; done
for t in curl jq; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

T=$(mktemp -d)
SPID=
cleanup() {
  [ -n "$SPID" ] && kill "$SPID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@" >/dev/null; then ok; else bad "$what"; fi; }

# Starts a server (stopping the previous one) on a free loopback port.
start_server() {
  [ -n "$SPID" ] && { kill "$SPID"; wait "$SPID" 2>/dev/null; }
  "$BIN" serve -m "$F" --port 0 --ctx-size 1024 --parallel 2 "$@" 2>"$T/server.log" &
  SPID=$!
  PORT=
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/server.log" | head -1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$SPID" 2>/dev/null || break
    PORT=
    sleep 0.1
  done
  [ -n "$PORT" ] || { echo "FAIL: the server did not come up:" >&2; cat "$T/server.log" >&2; exit 1; }
  URL=http://127.0.0.1:$PORT
}

post() { curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$URL$1"; }
stream() { curl -sN -H 'Content-Type: application/json' --data-binary "$1" "$URL/v1/chat/completions" | sed -n 's/^data: {/{/p' >"$T/chunks"; }
expect_err() {  # status code body
  local st
  st=$(post /v1/chat/completions "$3")
  if [ "$st" = "$1" ] && [ "$(jq -r .error.code "$T/body")" = "$2" ]; then ok
  else bad "$(printf '%.90s' "$3") -> $st (want $1 $2): $(head -c 300 "$T/body")"; fi
}

TOOLS='[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
     "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
     "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]'
# The arguments JSON ($1) follows the schema of function $2.
ARGS_VALID='if $f == "get_weather" then
    (type == "object") and (keys - ["city", "days", "unit"] | length == 0) and
    (.city | type == "string" and length <= 12) and (.days | type == "number" and floor == .) and
    ((.unit // "c") | . == "c" or . == "f")
  elif $f == "ping" then . == {} else false end'
req() {  # extra fields (jq object)
  jq -cn --argjson t "$TOOLS" "{messages: [{role: \"user\", content: \"What is the weather in Paris?\"}],
    tools: \$t, max_tokens: 200, temperature: 1} + $1"
}
# Tool calls reassembled from the chunks in $T/chunks, as the OpenAI SDKs do
# (id, type and name from the first delta of an index, arguments appended).
stream_calls() {
  jq -s '[.[] | .choices[]? | .delta.tool_calls? // [] | .[]] | group_by(.index) |
    map({index: .[0].index, id: .[0].id, type: .[0].type, name: .[0].function.name,
         arguments: (map(.function.arguments // "") | join(""))})' "$T/chunks"
}
stream_content() { jq -j '.choices[]? | .delta.content // empty' "$T/chunks"; }
stream_finish() { jq -rs '[.[] | .choices[]? | .finish_reason | select(.)] | join(",")' "$T/chunks"; }

# ---- a template without a tool format ----
start_server
check "props: no tool format" [ "$(curl -s "$URL/props" | jq -c .tool_call_format)" = null ]
expect_err 400 tools_unsupported "$(req '{}')"
check "the message says what to do" grep -q -- "--chat-template-file" "$T/body"
expect_err 400 tools_unsupported "$(req '{tool_choice: "required"}')"
st=$(post /v1/chat/completions "$(req '{tool_choice: "none", max_tokens: 4}')")
check "tool_choice none: plain chat ($st)" [ "$st" = 200 ]

# ---- Qwen3's template: the hermes format ----
jq -r .chat_template "$Q3" >"$T/qwen3.jinja"
start_server --chat-template-file "$T/qwen3.jinja"
check "props: hermes" [ "$(curl -s "$URL/props" | jq -r .tool_call_format)" = hermes ]
check "props: the template in use" [ "$(curl -s "$URL/props" | jq -r .chat_template | head -1)" = "{%- if tools %}" ]

for seed in 1 2 3; do
  st=$(post /v1/chat/completions "$(req "{tool_choice: \"required\", seed: $seed}")")
  check "required seed $seed: status $st" [ "$st" = 200 ]
  check "required seed $seed: one call, finish tool_calls, content null: $(jq -c .choices[0].message "$T/body")" jq -e '
    .choices[0] | .finish_reason == "tool_calls" and .message.content == null and
    (.message.tool_calls | length == 1) and (.message.tool_calls[0] | .type == "function" and
     (.id | test("^call_[A-Za-z0-9]{24}$")))' "$T/body"
  f=$(jq -r '.choices[0].message.tool_calls[0].function.name' "$T/body")
  check "required seed $seed: arguments of '$f' follow its schema: $(jq -r '.choices[0].message.tool_calls[0].function.arguments' "$T/body")" \
    jq -e --arg f "$f" ".choices[0].message.tool_calls[0].function.arguments | fromjson | $ARGS_VALID" "$T/body"
done

NAMED='{tool_choice: {type: "function", function: {name: "get_weather"}}, seed: 7}'
st=$(post /v1/chat/completions "$(req "$NAMED")")
jq -c '.choices[0].message.tool_calls[0].function | {name, arguments}' "$T/body" >"$T/named"
check "named: get_weather with valid arguments: $(cat "$T/named")" \
  jq -e --arg f get_weather ".name == \$f and (.arguments | fromjson | $ARGS_VALID)" "$T/named"
stream "$(req "$NAMED + {stream: true, stream_options: {include_usage: true}, logprobs: true}")"
check "named streamed: the same call as non-streamed ($(stream_calls | jq -c .))" \
  [ "$(stream_calls | jq -c '.[0] | {name, arguments}')" = "$(cat "$T/named")" ]
check "named streamed: one call with an id, no content, finish tool_calls" \
  [ "$(stream_calls | jq -r 'length == 1 and (.[0].id | startswith("call_")) and .[0].type == "function"'),$(stream_content | wc -c),$(stream_finish)" = "true,0,tool_calls" ]
check "named streamed: a logprobs entry for every token" \
  [ "$(jq -s '[.[] | .choices[]? | .logprobs.content? // [] | .[]] | length' "$T/chunks")" = "$(jq -s '[.[] | select(.usage)][0].usage.completion_tokens' "$T/chunks")" ]

st=$(post /v1/chat/completions "$(req '{tool_choice: "required", n: 2, seed: 11}')")
check "n=2 required: a call in each choice" jq -e '[.choices[] | .finish_reason == "tool_calls" and (.message.tool_calls | length == 1)] == [true, true]' "$T/body"

# auto: what the model writes is parsed.  A grammar makes the random model
# write a reply with text and two calls.
REPLY=$'Sure.\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
G=$(jq -Rn --arg r "$REPLY" '"root ::= " + ($r | tojson)')
EXPECT='[{"name":"ping","arguments":"{}"},{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}]'
st=$(post /v1/chat/completions "$(req "{grammar: $G}")")
check "auto: content and two calls ($(jq -c .choices[0].message "$T/body"))" \
  [ "$(jq -c '.choices[0] | [.finish_reason, .message.content, (.message.tool_calls | map(.function))]' "$T/body")" = "[\"tool_calls\",\"Sure.\",$EXPECT]" ]
check "auto: distinct ids" jq -e '.choices[0].message.tool_calls | map(.id) | unique | length == 2' "$T/body"
stream "$(req "{grammar: $G, stream: true}")"
check "auto streamed: content 'Sure.' ($(stream_content))" [ "$(stream_content)" = "Sure." ]
check "auto streamed: the calls, indexes 0 and 1" [ "$(stream_calls | jq -c 'map({name, arguments})')" = "$EXPECT" ]
check "auto streamed: indexes" [ "$(stream_calls | jq -c 'map(.index)')" = "[0,1]" ]
check "auto streamed: finish tool_calls" [ "$(stream_finish)" = tool_calls ]
# a block that is not a call stays text, exactly
BADREPLY='See <tool_call>{"nom": 1}</tool_call> ok'
G2=$(jq -Rn --arg r "$BADREPLY" '"root ::= " + ($r | tojson)')
st=$(post /v1/chat/completions "$(req "{grammar: $G2}")")
check "auto: not a call, kept as text" [ "$(jq -c '.choices[0] | [.finish_reason, .message.content, .message.tool_calls]' "$T/body")" = "$(jq -cn --arg r "$BADREPLY" '["stop", $r, null]')" ]
stream "$(req "{grammar: $G2, stream: true}")"
check "auto streamed: not a call, kept as text" [ "$(stream_content)" = "$BADREPLY" ]
# free text from the random model: a plain answer
st=$(post /v1/chat/completions "$(req '{temperature: 0, max_tokens: 12}')")
check "auto, greedy: a text answer ($st)" jq -e '.choices[0] | (.message.content | type == "string") and .message.tool_calls == null and .finish_reason != "tool_calls"' "$T/body"

# an earlier call (arguments as the JSON string OpenAI clients send) and its
# result go back through the template as Qwen3's template writes them
CONV=$(jq -cn --argjson t "$TOOLS" '{tools: $t, messages: [{role: "user", content: "Weather in Paris?"},
  {role: "assistant", content: null, tool_calls: [{id: "call_1", type: "function",
    function: {name: "get_weather", arguments: "{\"city\":\"Paris\",\"days\":2}"}}]},
  {role: "tool", tool_call_id: "call_1", content: "sunny"}]}')
st=$(post /apply-template "$CONV")
jq -r .prompt "$T/body" >"$T/prompt"
check "round trip: the call rendered with object arguments" \
  grep -qzF "$(printf '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call><|im_end|>\n')" "$T/prompt"
check "round trip: the result as a tool_response" \
  grep -qzF "$(printf '<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n')" "$T/prompt"
st=$(post /v1/chat/completions "$(jq -c '. + {max_tokens: 3}' <<<"$CONV")")
check "round trip: a chat completion after a tool result ($st)" [ "$st" = 200 ]

expect_err 400 invalid_value "$(req '{tool_choice: {type: "function", function: {name: "nope"}}}')"
expect_err 400 invalid_value "$(req '{tool_choice: "always"}')"
expect_err 400 invalid_value "$(req '{tool_choice: {type: "function"}}')"
expect_err 400 invalid_value '{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}'
expect_err 400 invalid_value '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}'
expect_err 400 invalid_value '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval", "function": {"name": "f"}}]}'
expect_err 400 invalid_type "$(req '{parallel_tool_calls: 1}')"
expect_err 400 unsupported_value '{"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}'
expect_err 400 invalid_value "$(req '{tool_choice: "required", response_format: {type: "json_object"}}')"
check "forced call and response_format: says why" grep -q "only one of" "$T/body"
PAT='[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}}}}]'
expect_err 400 unsupported_schema "$(jq -cn --argjson t "$PAT" '{messages: [{role: "user", content: "x"}], tools: $t, tool_choice: "required"}')"
check "unsupported schema: names the tool and the keyword" grep -q "tools\[0\].function.parameters.*'pattern'" "$T/body"
st=$(post /v1/chat/completions "$(jq -cn --argjson t "$PAT" '{messages: [{role: "user", content: "x"}], tools: $t, max_tokens: 2}')")
check "the same tools with auto need no grammar ($st)" [ "$st" = 200 ]

# ---- a Mistral-style template: the [TOOL_CALLS] format ----
start_server --chat-template-file "$SRC/tests/data/mistral_tools.jinja"
check "props: mistral" [ "$(curl -s "$URL/props" | jq -r .tool_call_format)" = mistral ]
st=$(post /v1/chat/completions "$(req '{tool_choice: "required", seed: 5}')")
check "mistral required: a valid call with a 9-character id ($(jq -c .choices[0].message "$T/body"))" jq -e "
  .choices[0] | .finish_reason == \"tool_calls\" and (.message.tool_calls | length == 1) and
  (.message.tool_calls[0] | (.id | test(\"^[A-Za-z0-9]{9}\$\")) and
   (.function.name as \$f | .function.arguments | fromjson | $ARGS_VALID))" "$T/body"
MREPLY='[TOOL_CALLS] [{"name": "ping", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]'
G3=$(jq -Rn --arg r "$MREPLY" '"root ::= " + ($r | tojson)')
st=$(post /v1/chat/completions "$(req "{grammar: $G3}")")
check "mistral auto: two calls" [ "$(jq -c '.choices[0] | [.finish_reason, .message.content, (.message.tool_calls | map(.function))]' "$T/body")" = "[\"tool_calls\",null,$EXPECT]" ]
stream "$(req "{grammar: $G3, stream: true}")"
check "mistral auto streamed: no content, the calls" [ "$(stream_content | wc -c) $(stream_calls | jq -c 'map({name, arguments})')" = "0 $EXPECT" ]
MCONV=$(jq -c '.messages[1].tool_calls[0].id = "abcDEF123" | .messages[2].tool_call_id = "abcDEF123"' <<<"$CONV")
st=$(post /apply-template "$MCONV")
jq -r .prompt "$T/body" >"$T/prompt"
check "mistral round trip: the call as an object ($(cat "$T/prompt"))" \
  grep -qF '[/INST][TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]' "$T/prompt"
check "mistral round trip: the result with its call id" \
  grep -qF '[TOOL_RESULTS] {"content": "sunny", "call_id": "abcDEF123"}[/TOOL_RESULTS]' "$T/prompt"

# ---- the option's errors ----
"$BIN" serve -m "$F" --port 0 --chat-template-file "$T/missing.jinja" 2>"$T/err" >/dev/null
rc=$?
check "--chat-template-file missing: exit 1 ($rc)" [ "$rc" = 1 ]
check "--chat-template-file missing: names the file ($(cat "$T/err"))" grep -q "missing.jinja" "$T/err"
printf '{%% if %%}' >"$T/bad.jinja"
"$BIN" serve -m "$F" --port 0 --chat-template-file "$T/bad.jinja" 2>"$T/err" >/dev/null
rc=$?
check "--chat-template-file with a syntax error: exit 1 ($rc)" [ "$rc" = 1 ]
check "--chat-template-file with a syntax error: names the file ($(cat "$T/err"))" grep -q "bad.jinja: chat template syntax error" "$T/err"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
