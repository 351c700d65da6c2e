#!/usr/bin/env bash
# test_server.sh - acceptance tests for `mlxcel serve` against the chat
# fixture (real Qwen tokenizer + ChatML template, random weights: the text is
# gibberish but deterministic under greedy decoding).
#
#  - greedy chat completion == `mlxcel generate --chat MSG --temp 0 -n N`
#  - streamed deltas concatenated == the non-streamed text; [DONE] at the end
#  - usage: prompt_tokens == tokens of the rendered prompt, completion_tokens
#  - a stop string from the middle of the output cuts exactly (both modes)
#  - 8 concurrent streaming clients (more than --parallel: some queue) all
#    get complete greedy-equal answers (continuous batching)
#  - OpenAI-style 4xx errors, --api-key, graceful SIGTERM
#
# Needs MLXCEL_BIN, MLXCEL_FIXTURES (skips with 77 without), curl and jq.
set -u
export LC_ALL=C.UTF-8
# OpenMP workers that spin between parallel regions crawl when the CPUs are
# shared (ctest -j, CI): sleep instead
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -n "${MLXCEL_FIXTURES:-}" ] || { echo "SKIP: MLXCEL_FIXTURES is not set"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
F=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
[ -d "$F" ] || { echo "FAIL: $F is missing"; exit 1; }
for t in curl jq; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }

# Starts a server on a free loopback port (--port 0; the port is read from
# its first log line), waits for /health; sets PORT and SPID.
start_server() {
  local log=$1; shift
  "$BIN" serve -m "$F" --port 0 "$@" 2>"$log" &
  SPID=$!
  PIDS+=("$SPID")
  PORT=
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the server did not come up:" >&2
  cat "$log" >&2
  exit 1
}

start_server "$T/server.log" --ctx-size 1024 --parallel 4 --queue 16 --cors-origin '*' --metrics
URL=http://127.0.0.1:$PORT
echo "server on port $PORT"

# POSTs JSON ($2) to $1; body to $T/body, prints the status.
post() { curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$URL$1"; }

chat_req() {  # message, max_tokens, extra fields
  jq -cn --arg m "$1" --argjson n "$2" "{messages: [{role: \"user\", content: \$m}], temperature: 0, max_tokens: \$n} + ${3:-{\}}"
}

# Concatenated deltas of an SSE stream in file $1 (chat or completions).
stream_text() {
  sed -n 's/^data: //p' "$1" | grep -v '^\[DONE\]$' |
    jq -j 'select(.choices | length > 0) | .choices[0] | (.delta.content // .text // empty)'
}

N=24
MSG="What is the capital of France?"
"$BIN" generate -m "$F" --chat "$MSG" --temp 0 -n $N --stats >"$T/expect" 2>"$T/gen.err"
NPROMPT=$(sed -n 's/^prompt tokens: \([0-9]*\).*/\1/p' "$T/gen.err")
echo "generate: $(wc -c <"$T/expect") bytes, prompt $NPROMPT tokens"

# --- greedy chat completion == generate ---
st=$(post /v1/chat/completions "$(chat_req "$MSG" $N)")
check "chat status $st" [ "$st" = 200 ]
jq -j '.choices[0].message.content' "$T/body" >"$T/got"
check "greedy chat text equals generate's" cmp -s "$T/expect" "$T/got"
check "usage.prompt_tokens == $NPROMPT" [ "$(jq .usage.prompt_tokens "$T/body")" = "$NPROMPT" ]
finish=$(jq -r '.choices[0].finish_reason' "$T/body")
ngen=$(jq .usage.completion_tokens "$T/body")
check "finish_reason length with $N tokens (got $finish, $ngen)" [ "$finish $ngen" = "length $N" ]
check "total_tokens" [ "$(jq .usage.total_tokens "$T/body")" = $((NPROMPT + ngen)) ]
check "object and id" [ "$(jq -r '.object + " " + (.id | startswith("chatcmpl-") | tostring)' "$T/body")" = "chat.completion true" ]

# --- streamed == non-streamed ---
curl -sN -H 'Content-Type: application/json' \
  -d "$(chat_req "$MSG" $N '{stream: true, stream_options: {include_usage: true}}')" \
  "$URL/v1/chat/completions" >"$T/stream"
stream_text "$T/stream" >"$T/got_stream"
check "streamed text equals non-streamed" cmp -s "$T/got" "$T/got_stream"
check "stream ends with [DONE]" [ "$(grep -v '^$' "$T/stream" | tail -1)" = "data: [DONE]" ]
check "stream usage chunk" [ "$(sed -n 's/^data: {/{/p' "$T/stream" | jq -s '[.[] | select(.usage)][0].usage | "\(.prompt_tokens) \(.completion_tokens)"' -r)" = "$NPROMPT $N" ]
check "stream finish_reason" [ "$(sed -n 's/^data: {/{/p' "$T/stream" | jq -rs '[.[] | .choices[]? | .finish_reason | select(.)] | join(",")')" = length ]
check "stream role chunk" [ "$(sed -n 's/^data: {/{/p' "$T/stream" | head -1 | jq -r '.choices[0].delta.role')" = assistant ]

# --- stop string from the middle of the greedy output cuts exactly ---
text=$(cat "$T/expect")
len=${#text}
stop=
for off in $((len / 2)) $((len / 3)) $((len * 2 / 3)); do
  cand=${text:$off:3}
  [ -n "${cand// /}" ] && { stop=$cand; break; }
done
prefix=${text%%"$stop"*}
printf '%s' "$prefix" >"$T/prefix"
st=$(post /v1/chat/completions "$(chat_req "$MSG" $N "{stop: [\"zzzq\", $(jq -Rn --arg s "$stop" '$s')]}")")
jq -j '.choices[0].message.content' "$T/body" >"$T/got_stop"
check "stop '$stop' cuts to the prefix" cmp -s "$T/prefix" "$T/got_stop"
check "stop finish_reason" [ "$(jq -r '.choices[0].finish_reason' "$T/body")" = stop ]
curl -sN -d "$(chat_req "$MSG" $N "{stop: $(jq -Rn --arg s "$stop" '$s'), stream: true}")" \
  "$URL/v1/chat/completions" >"$T/stream_stop"
stream_text "$T/stream_stop" >"$T/got_stream_stop"
check "streamed stop never leaks" cmp -s "$T/prefix" "$T/got_stream_stop"

# --- /v1/completions with a raw prompt == generate -p ---
"$BIN" generate -m "$F" -p "Once upon a time" --temp 0 -n 12 >"$T/expect_p" 2>/dev/null
st=$(post /v1/completions '{"prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}')
jq -j '.choices[0].text' "$T/body" >"$T/got_p"
check "completions text equals generate -p" cmp -s "$T/expect_p" "$T/got_p"
check "completions object" [ "$(jq -r .object "$T/body")" = text_completion ]

# --- logprobs: shapes, and the values against the logits generate dumps ---
"$BIN" generate -m "$F" --chat "$MSG" --temp 0 -n 1 --dump-logits "$T/logits" >/dev/null 2>&1
# log-softmax of the first generated token (the argmax) by hand: max + log(sum exp)
ref=$(od -An -v -f "$T/logits" | tr -s ' ' '\n' | awk 'NF {x[n++] = $1; if (n == 1 || $1 > m) m = $1}
  END {for (i = 0; i < n; i++) s += exp(x[i] - m); printf "%.6f", -log(s)}')
st=$(post /v1/chat/completions "$(chat_req "$MSG" 4 '{logprobs: true, top_logprobs: 3}')")
check "chat logprobs status $st" [ "$st" = 200 ]
check "chat logprobs shape" jq -e '.choices[0].logprobs.content | length == 4 and all(
  (.token | type == "string") and (.logprob | type == "number") and (.bytes | type == "array") and
  (.top_logprobs | length == 3) and (.top_logprobs[0].logprob >= .top_logprobs[1].logprob))' "$T/body"
check "greedy token is the top alternative" jq -e '.choices[0].logprobs.content | all(.token == .top_logprobs[0].token and .logprob == .top_logprobs[0].logprob)' "$T/body"
jq -r '[.choices[0].logprobs.content[].bytes[]] | map(tostring) | join(" ")' "$T/body" >"$T/lpbytes"
jq -j '.choices[0].message.content' "$T/body" | od -An -v -tu1 | xargs >"$T/textbytes"
check "token bytes concatenate to the text" cmp -s "$T/lpbytes" "$T/textbytes"
got=$(jq '.choices[0].logprobs.content[0].logprob' "$T/body")
check "first logprob $got equals log-softmax of the dumped logits $ref" awk -v a="$got" -v b="$ref" 'BEGIN {d = a - b; exit !(d < 1e-3 && d > -1e-3)}'
curl -sN -d "$(chat_req "$MSG" 4 '{logprobs: true, top_logprobs: 2, stream: true}')" "$URL/v1/chat/completions" >"$T/lpstream"
check "streamed chat logprobs: 4 entries" [ "$(sed -n 's/^data: {/{/p' "$T/lpstream" | jq -s '[.[] | .choices[]? | .logprobs.content? // [] | .[]] | length')" = 4 ]
st=$(post /v1/completions '{"prompt": "Once upon a time", "temperature": 0, "max_tokens": 3, "logprobs": 2}')
check "completions logprobs shape" jq -e '.choices[0].logprobs | (.tokens | length == 3) and (.token_logprobs | length == 3) and
  (.top_logprobs | length == 3 and all(length >= 1 and length <= 2)) and .text_offset[0] == 0' "$T/body"
curl -sN -d '{"prompt": "Once upon a time", "temperature": 0, "max_tokens": 3, "logprobs": 1, "stream": true}' "$URL/v1/completions" >"$T/lpstream"
check "streamed completions logprobs" [ "$(sed -n 's/^data: {/{/p' "$T/lpstream" | jq -s '[.[] | .choices[]? | .logprobs.tokens? // [] | .[]] | length')" = 3 ]

# --- n > 1 (one prefill for all), several prompts, logit_bias, penalties ---
pt0=$(curl -s "$URL/metrics" | awk '$1 == "mlxcel_prompt_tokens_total" {print $2}')
st=$(post /v1/chat/completions "$(chat_req "A fresh question for n" 5 '{n: 3}')")
check "n=3 status $st" [ "$st" = 200 ]
check "n=3: three greedy-equal choices" jq -e '(.choices | length == 3) and ([.choices[].index] == [0, 1, 2]) and
  ([.choices[].message.content] | unique | length == 1) and .usage.completion_tokens == 15' "$T/body"
np=$(jq .usage.prompt_tokens "$T/body")
pt1=$(curl -s "$URL/metrics" | awk '$1 == "mlxcel_prompt_tokens_total" {print $2}')
check "n=3 prefilled the prompt once ($((pt1 - pt0)) tokens for a $np-token prompt)" [ $((pt1 - pt0)) -le $((np + 2)) ]
curl -sN -d "$(chat_req "A fresh question for n" 5 '{n: 2, stream: true}')" "$URL/v1/chat/completions" >"$T/nstream"
check "n=2 streamed: both indexes, each with a finish" [ "$(sed -n 's/^data: {/{/p' "$T/nstream" | jq -rs '[.[] | .choices[]? | select(.finish_reason) | .index] | join(",")')" = "0,1" ]
st=$(post /v1/completions '{"prompt": ["Once upon a time", "Hello"], "temperature": 0, "max_tokens": 12}')
check "two prompts: two choices" [ "$(jq '.choices | length' "$T/body")" = 2 ]
check "prompt list choice 0 equals generate -p" [ "$(jq -j '.choices[0].text' "$T/body")" = "$(cat "$T/expect_p")" ]
st=$(post /v1/completions '{"prompt": "Hello", "temperature": 0, "max_tokens": 3, "logit_bias": {"9707": 100}}')
check "logit_bias +100 forces the token" [ "$(jq -r '.choices[0].text' "$T/body")" = "HelloHelloHello" ]
st=$(post /v1/completions '{"prompt": "Hello", "temperature": 0, "max_tokens": 3, "frequency_penalty": 1.5, "presence_penalty": 0.5}')
check "penalties accepted ($st)" [ "$st" = 200 ]

# --- structured output: constrained decoding makes even random weights valid ---
SCHEMA='{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
  "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
  "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"], "additionalProperties": false}'
for seed in 1 2 3; do
  st=$(post /v1/chat/completions "$(chat_req "$MSG" 400 "{temperature: 1, seed: $seed, response_format: {type: \"json_schema\", json_schema: {name: \"p\", schema: $SCHEMA}}}")")
  jq -r '.choices[0].message.content' "$T/body" >"$T/json_out"
  check "json_schema seed $seed: finish stop ($(jq -r '.choices[0].finish_reason' "$T/body"))" [ "$(jq -r '.choices[0].finish_reason' "$T/body")" = stop ]
  check "json_schema seed $seed: valid against the schema: $(head -c 200 "$T/json_out")" jq -e '
    (keys - ["name", "age", "tags", "ok"] | length == 0) and (.name | type == "string" and length <= 12) and
    (.age | type == "number" and floor == .) and (.ok | type == "boolean") and
    ((.tags // []) | length <= 3 and all(. == "a" or . == "b"))' "$T/json_out"
done
curl -sN -d "$(chat_req "$MSG" 400 "{temperature: 1, seed: 9, stream: true, response_format: {type: \"json_schema\", json_schema: {name: \"p\", schema: $SCHEMA}}}")" \
  "$URL/v1/chat/completions" >"$T/jstream"
stream_text "$T/jstream" >"$T/json_out"
check "json_schema streamed: an object ($(head -c 120 "$T/json_out"))" jq -e 'type == "object" and (.age | type == "number")' "$T/json_out"
st=$(post /v1/chat/completions "$(chat_req "$MSG" 24 '{temperature: 0, response_format: {type: "json_object"}}')")
check "json_object: the output starts an object" grep -q '^{' <(jq -r '.choices[0].message.content' "$T/body")
st=$(post /v1/completions '{"prompt": "Count:", "max_tokens": 20, "temperature": 1, "seed": 4, "grammar": "root ::= [1-9] [0-9]{0,3} \" apples\""}')
check "GBNF grammar field" grep -qE '^[1-9][0-9]{0,3} apples$' <(jq -r '.choices[0].text' "$T/body")
"$BIN" generate -m "$F" -p "Answer:" -n 8 --temp 0.7 --seed 3 --json-schema '{"enum": ["yes", "no"]}' >"$T/cli_json" 2>/dev/null
check "generate --json-schema ($(cat "$T/cli_json"))" grep -qxE '"(yes|no)"' "$T/cli_json"
printf 'root ::= "A" [0-9]+ "Z"\n' >"$T/g.gbnf"
"$BIN" generate -m "$F" -p "x" -n 6 --temp 0.7 --seed 1 --grammar-file "$T/g.gbnf" >"$T/cli_g" 2>/dev/null
check "generate --grammar-file ($(cat "$T/cli_g"))" grep -qxE 'A[0-9]+Z?' "$T/cli_g"
"$BIN" generate -m "$F" -p "x" --json-schema '{"type": "string", "pattern": "a"}' >/dev/null 2>"$T/cli_err"
check "generate --json-schema unsupported keyword" grep -q "'pattern' is not supported" "$T/cli_err"

# --- 8 concurrent streaming clients (4 slots: batching plus queueing) ---
MSGS=("What is the capital of France?" "Tell me a story" "Write a poem about the sea" "Why is the sky blue?")
NC=16
for i in 0 1 2 3; do
  "$BIN" generate -m "$F" --chat "${MSGS[$i]}" --temp 0 -n $NC >"$T/cexp$i" 2>/dev/null
done
cpids=()
for c in $(seq 0 7); do
  i=$((c % 4))
  curl -sN -d "$(chat_req "${MSGS[$i]}" $NC '{stream: true}')" "$URL/v1/chat/completions" >"$T/cout$c" &
  cpids+=($!)
done
for p in "${cpids[@]}"; do wait "$p"; done
for c in $(seq 0 7); do
  i=$((c % 4))
  stream_text "$T/cout$c" >"$T/ctext$c"
  check "concurrent client $c greedy-equal" cmp -s "$T/cexp$i" "$T/ctext$c"
  check "concurrent client $c [DONE]" [ "$(grep -v '^$' "$T/cout$c" | tail -1)" = "data: [DONE]" ]
done

# --- tokenize / detokenize / models / health ---
st=$(post /tokenize '{"content": "Hello world"}')
check "tokenize status" [ "$st" = 200 ]
check "tokenize ids" jq -e '.tokens | length > 0 and all(type == "number")' "$T/body"
toks=$(jq -c .tokens "$T/body")
st=$(post /detokenize "{\"tokens\": $toks}")
check "detokenize round trip" [ "$(jq -r .content "$T/body")" = "Hello world" ]
check "models" [ "$(curl -s "$URL/v1/models" | jq -r '.data[0].id')" = qwen2_moe_tiny_chat ]

# --- HTTP details: CORS, HEAD, /v1/models/{id}, deep JSON, chunked 413 ---
curl -s -D "$T/hdr" -o "$T/body" -X OPTIONS -H 'Origin: http://example.test' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type' \
  "$URL/v1/chat/completions"
check "preflight 204" grep -q '^HTTP/1.1 204' "$T/hdr"
check "preflight allow-origin" grep -qi '^Access-Control-Allow-Origin: \*' "$T/hdr"
check "preflight allow-methods" grep -qi '^Access-Control-Allow-Methods: .*POST' "$T/hdr"
check "preflight allow-headers" grep -qi '^Access-Control-Allow-Headers: .*authorization' "$T/hdr"
curl -s -D "$T/hdr" -o /dev/null "$URL/v1/models"
check "CORS header on a GET" grep -qi '^Access-Control-Allow-Origin: \*' "$T/hdr"
check "HEAD /health" [ "$(curl -s -I -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]
check "HEAD /v1/models" [ "$(curl -s -I -o /dev/null -w '%{http_code}' "$URL/v1/models")" = 200 ]
check "GET /v1/models/{id}" [ "$(curl -s "$URL/v1/models/qwen2_moe_tiny_chat" | jq -r '.id + " " + .object')" = "qwen2_moe_tiny_chat model" ]
check "GET /v1/models/unknown 404" [ "$(curl -s -o "$T/body" -w '%{http_code}' "$URL/v1/models/gpt-9")" = 404 ]
check "model_not_found code" [ "$(jq -r .error.code "$T/body")" = model_not_found ]
deep=$(printf '[%.0s' $(seq 1 100))$(printf ']%.0s' $(seq 1 100))
st=$(curl -s -o "$T/body" -w '%{http_code}' --data-binary "$deep" "$URL/v1/chat/completions")
check "deep JSON -> 400 (got $st)" [ "$st" = 400 ]
check "deep JSON: too deeply nested" grep -q 'too deeply nested' "$T/body"
head -c 2000000 /dev/zero | tr '\0' 'a' >"$T/huge"
st=$(curl -s -o "$T/body" -w '%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary @"$T/huge" "$URL/v1/completions")
check "chunked oversized body -> 413 (got $st)" [ "$st" = 413 ]
check "chunked 413 code" [ "$(jq -r .error.code "$T/body")" = body_too_large ]

# --- llama-server extras: /props, /slots, /apply-template, /metrics ---
curl -s "$URL/props" >"$T/props"
check "props" jq -e '.model == "qwen2_moe_tiny_chat" and .n_ctx == 1024 and .total_slots == 4 and
  (.chat_template | contains("im_start")) and (.default_generation_settings.params.n_predict | type == "number")' "$T/props"
curl -s "$URL/slots" >"$T/slots"
check "slots" jq -e 'length == 4 and all(.state == "idle" and (.n_cached | type == "number"))' "$T/slots"
st=$(post /apply-template "$(jq -cn --arg m "$MSG" '{messages: [{role: "user", content: $m}]}')")
check "apply-template status $st" [ "$st" = 200 ]
jq -r .prompt "$T/body" >"$T/rendered"
check "apply-template prompt is ChatML" grep -q '^<|im_start|>assistant$' "$T/rendered"
st=$(post /tokenize "$(jq -cn --rawfile p "$T/rendered" '{content: ($p | rtrimstr("\n") + "\n")}')")
check "apply-template prompt tokenizes to the chat request's $NPROMPT tokens" [ "$(jq '.tokens | length' "$T/body")" = "$NPROMPT" ]
curl -s -D "$T/hdr" "$URL/metrics" >"$T/metrics"
check "metrics content type" grep -qi '^Content-Type: text/plain; version=0.0.4' "$T/hdr"
# every line a comment or "name{labels} value" (the Prometheus text format)
check "metrics lines parse" awk '/^#/ {next} !/^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.e+-]+$/ {bad=1} END {exit bad}' "$T/metrics"
check "metrics count requests" awk '$1 == "mlxcel_requests_total" && $2 >= 3 {f=1} END {exit !f}' "$T/metrics"
check "metrics count tokens" awk '$1 == "mlxcel_tokens_predicted_total" && $2 >= 24 {f=1} END {exit !f}' "$T/metrics"

# --- errors: OpenAI-style JSON, 4xx, never a crash ---
expect_err() {  # status path body [method]
  local want=$1 path=$2 body=$3 method=${4:-POST} st
  st=$(curl -s -o "$T/body" -w '%{http_code}' -X "$method" -H 'Content-Type: application/json' \
    --data-binary "$body" "$URL$path")
  if [ "$st" = "$want" ] && jq -e '.error.message | type == "string"' "$T/body" >/dev/null; then ok
  else bad "$method $path $(printf '%.60s' "$body") -> $st (want $want): $(head -c 200 "$T/body")"; fi
}
expect_err 400 /v1/chat/completions '{"messages": ['
expect_err 400 /v1/chat/completions '[1, 2]'
expect_err 400 /v1/chat/completions '{}'
expect_err 400 /v1/chat/completions '{"messages": "hi"}'
expect_err 400 /v1/chat/completions '{"messages": []}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": 1, "content": "x"}]}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": 5}]}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e12}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": "10"}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "top_p": 7}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "stop": 3}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "stop": [""]}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "n": 17}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 3}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "logit_bias": [1]}'
expect_err 400 /v1/completions '{"prompt": "x", "echo": true}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "required"}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "tools": {}}'
expect_err 400 /v1/completions '{"prompt": "x", "grammar": "root ::= undefined-rule"}'
check "grammar error code" [ "$(jq -r .error.code "$T/body")" = invalid_grammar ]
expect_err 400 /v1/completions '{"prompt": "x", "json_schema": {"type": "string", "pattern": "a+"}}'
check "unsupported schema keyword named" grep -q "'pattern' is not supported" "$T/body"
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}'
expect_err 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}'
expect_err 400 /v1/completions '{"prompt": "x", "suffix": "y"}'
expect_err 400 /v1/completions '{"prompt": "x", "best_of": 3}'
expect_err 400 /v1/completions '{"prompt": ["a", 5]}'
expect_err 400 /v1/completions '{"prompt": ["a", "b", "c", "d", "e"], "n": 16, "max_tokens": 1}'
expect_err 404 /v1/chat/completions '{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}'
expect_err 400 /v1/completions '{"prompt": 12}'
expect_err 400 /v1/completions '{"prompt": [1, -5]}'
expect_err 400 /v1/completions '{"prompt": [999999999]}'
expect_err 400 /v1/completions '{"prompt": ""}'
long=$(printf 'hello %.0s' $(seq 1 1500))
expect_err 400 /v1/completions "{\"prompt\": \"$long\", \"max_tokens\": 4}"
check "context_length_exceeded code" [ "$(jq -r .error.code "$T/body")" = context_length_exceeded ]
head -c 2000000 /dev/zero | tr '\0' 'a' >"$T/huge"
st=$(curl -s -o "$T/body" -w '%{http_code}' --data-binary @"$T/huge" "$URL/v1/completions")
check "huge body -> 413 (got $st)" [ "$st" = 413 ]
expect_err 400 /tokenize '{"content": 5}'
expect_err 400 /detokenize '{"tokens": ["a"]}'
expect_err 404 /v1/nothing '{}'
expect_err 405 /v1/chat/completions '' GET
expect_err 405 /health '{}' POST
# a generation still works after all that
st=$(post /v1/chat/completions "$(chat_req "$MSG" 4)")
check "still serving ($st)" [ "$st" = 200 ]

# --- a client that disconnects mid-stream frees its slot ---
curl -sN --max-time 1 -d "$(chat_req "$MSG" 400 '{stream: true}')" "$URL/v1/chat/completions" >/dev/null
sleep 1.5
busy=$(curl -s "$URL/health" | jq .slots_busy)
check "disconnected stream cancelled (slots_busy $busy)" [ "$busy" = 0 ]

# --- graceful shutdown ---
kill -TERM "$SPID"
for _ in $(seq 1 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
stopped() { ! kill -0 "$1" 2>/dev/null; }
check "SIGTERM stops the server" stopped "$SPID"
wait "$SPID"
check "exit status 0 after SIGTERM" [ $? = 0 ]
check "log line per request" grep -q '^serve: POST /v1/chat/completions 200 in=' "$T/server.log"

# --- --api-key, a full queue (503 + Retry-After), shutdown mid-stream ---
start_server "$T/server2.log" --ctx-size 4096 --parallel 1 --queue 0 --api-key s3cret
URL=http://127.0.0.1:$PORT
check "health without a key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]
check "401 without a key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models")" = 401 ]
check "401 with a wrong key" [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' "$URL/v1/models")" = 401 ]
check "200 with the key" [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' "$URL/v1/models")" = 200 ]
check "no CORS header without --cors-origin" bash -c "! curl -s -D - -o /dev/null -H 'Authorization: Bearer s3cret' '$URL/v1/models' | grep -qi '^Access-Control'"
check "metrics off -> 404" [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' "$URL/metrics")" = 404 ]
# one long stream holds the only slot; with no queue the next request is refused
curl -sN -H 'Authorization: Bearer s3cret' \
  -d "$(chat_req "$MSG" 4000 '{stream: true, ignore_eos: true}')" "$URL/v1/chat/completions" >"$T/long" &
LPID=$!
for _ in $(seq 1 100); do [ -s "$T/long" ] && break; sleep 0.1; done
st=$(curl -s -D "$T/hdr" -o "$T/body" -w '%{http_code}' -H 'Authorization: Bearer s3cret' \
  -d "$(chat_req "$MSG" 4)" "$URL/v1/chat/completions")
check "busy -> 503 (got $st)" [ "$st" = 503 ]
check "busy code" [ "$(jq -r .error.code "$T/body")" = server_busy ]
check "503 has Retry-After" grep -qi '^Retry-After: [0-9]' "$T/hdr"
# SIGTERM while it streams: the stream says it was cut by the shutdown
kill -TERM "$SPID"
wait "$LPID"
wait "$SPID"
check "exit 0 after SIGTERM mid-stream" [ $? = 0 ]
check "cut stream ends with [DONE]" [ "$(grep -v '^$' "$T/long" | tail -1)" = "data: [DONE]" ]
check "cut stream has a server_shutdown error event" [ "$(sed -n 's/^data: {/{/p' "$T/long" | jq -rs '[.[] | .error.code? | select(.)] | join(",")')" = server_shutdown ]
check "cut stream has no finish_reason" [ "$(sed -n 's/^data: {/{/p' "$T/long" | jq -rs '[.[] | .choices[]? | .finish_reason | select(.)] | length')" = 0 ]
check "shutdown in the log" grep -q '\[shutdown\]$' "$T/server2.log"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
