#!/usr/bin/env bash
# Bad input through the CLI: every case must exit non-zero (not a crash:
# status < 128) with a single line on stderr naming the problem.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
if [ -z "${MLXCEL_FIXTURES:-}" ]; then
  echo "SKIP: MLXCEL_FIXTURES is not set; bad-input tests copy fixture checkpoints" >&2
  exit 77
fi
FX=$MLXCEL_FIXTURES
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0

# expect NAME EXPECTED_SUBSTRING -- command...
expect() {
  local name=$1 want=$2; shift 3
  local err rc lines
  err=$("$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"; then
    pass=$((pass + 1))
    echo "ok   $name: $err"
  else
    fail=$((fail + 1))
    echo "FAIL $name (exit $rc, $lines lines, wanted '$want'):"
    printf '%s\n' "$err" | head -5
  fi
}

# usage NAME EXPECTED_SUBSTRING -- command...: a usage error, exit status 2
usage() {
  local name=$1 want=$2; shift 3
  local err rc lines
  err=$("$@" 2>&1 >/dev/null </dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"; then
    pass=$((pass + 1))
    echo "ok   $name: $err"
  else
    fail=$((fail + 1))
    echo "FAIL $name (exit $rc, $lines lines, wanted exit 2 and '$want'):"
    printf '%s\n' "$err" | head -5
  fi
}

fresh() {   # fresh copy of a fixture checkpoint into $T/$2
  rm -rf "$T/$2"; mkdir -p "$T/$2"
  cp "$FX/$1"/config.json "$FX/$1"/*.safetensors "$T/$2"/
  rm -f "$T/$2/reference.safetensors"
  [ -f "$FX/$1/model.safetensors.index.json" ] && cp "$FX/$1/model.safetensors.index.json" "$T/$2"/
  true
}

# a safetensors file from a header string and N data bytes
mkst() {  # path header nbytes
  local len=${#2}
  perl -e 'print pack("Q<", $ARGV[0]), $ARGV[1], "\0" x $ARGV[2]' "$len" "$2" "$3" > "$1"
}

fresh qwen3_moe_tiny trunc
f=$T/trunc/model.safetensors; truncate -s $(( $(stat -c %s "$f") / 2 )) "$f"
expect truncated "model.safetensors" -- "$BIN" inspect -m "$T/trunc"

fresh qwen3_moe_tiny hdrlen
perl -e 'print pack("Q<", 1<<40)' > "$T/hdrlen/model.safetensors"
expect "header length beyond file" "model.safetensors" -- "$BIN" inspect -m "$T/hdrlen"

fresh qwen3_moe_tiny garbage
{ perl -e 'print pack("Q<", 64)'; head -c 64 /dev/urandom; } > "$T/garbage/model.safetensors"
expect "garbage header" "model.safetensors" -- "$BIN" inspect -m "$T/garbage"

mkdir -p "$T/offs"; cp "$FX/qwen3_moe_tiny/config.json" "$T/offs/"
mkst "$T/offs/model.safetensors" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 8
expect "offsets out of range" "'a'" -- "$BIN" inspect -m "$T/offs"

mkdir -p "$T/overlap"; cp "$FX/qwen3_moe_tiny/config.json" "$T/overlap/"
mkst "$T/overlap/model.safetensors" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}' 24
expect "overlapping tensors" "overlap" -- "$BIN" inspect -m "$T/overlap"

fresh qwen3_moe_tiny dtype
perl -0777 -pi -e 's/"lm_head.weight":\{"dtype":"U32"/"lm_head.weight":{"dtype":"I32"/' "$T/dtype/model.safetensors"
expect "wrong dtype for a quantized weight" "lm_head" -- "$BIN" inspect -m "$T/dtype"

fresh qwen3_moe_tiny shape
perl -0777 -pi -e 's/"lm_head.scales":\{"dtype":"BF16","shape":\[4096,2\]/"lm_head.scales":{"dtype":"BF16","shape":[2048,4]/' "$T/shape/model.safetensors"
expect "wrong shape for a quantized weight" "lm_head" -- "$BIN" inspect -m "$T/shape"

fresh qwen2_moe_tiny_chat shard
rm "$T/shard/model-00002-of-00002.safetensors"
expect "shard missing from the index" "model-00002-of-00002.safetensors" -- "$BIN" inspect -m "$T/shard"

fresh qwen3_moe_tiny json
echo '{"model_type": "qwen3_moe", "hidden_size": ' > "$T/json/config.json"
expect "invalid config JSON" "config.json" -- "$BIN" inspect -m "$T/json"

fresh qwen3_moe_tiny bits
perl -0777 -pi -e 's/"bits": 4/"bits": 7/g' "$T/bits/config.json"
expect "unsupported bits" "7" -- "$BIN" inspect -m "$T/bits"

fresh qwen3_moe_tiny mtype
perl -0777 -pi -e 's/"model_type": "qwen3_moe"/"model_type": "gpt_neox"/' "$T/mtype/config.json"
expect "unknown model_type" "qwen2_moe" -- "$BIN" inspect -m "$T/mtype"

expect "missing directory" "$T/none" -- "$BIN" inspect -m "$T/none"
expect "token id out of range" "4096" -- "$BIN" generate -m "$FX/qwen3_moe_tiny" --prompt-ids 1,4096 -n 2 --ids-only
expect "malformed token ids" "--prompt-ids" -- "$BIN" generate -m "$FX/qwen3_moe_tiny" --prompt-ids 1,x,3 -n 2 --ids-only
expect "unknown option" "--bogus" -- "$BIN" generate --bogus
expect "context too small" "context" -- "$BIN" generate -m "$FX/qwen3_moe_tiny" --prompt-ids 1,2,3,4 -c 3 -n 2 --ids-only

# text input (tokenizer of the chat fixture)
CHAT=$FX/qwen2_moe_tiny_chat
expect "invalid UTF-8 prompt" "UTF-8" -- "$BIN" generate -m "$CHAT" -p "$(printf 'abc\xff\xfe')" -n 2
expect "empty prompt" "empty" -- "$BIN" generate -m "$CHAT" -p "" -n 2
expect "prompt longer than the context" "context" -- "$BIN" generate -m "$CHAT" -p "one two three four five six" -c 4 -n 2
expect "detokenize id out of range" "999999" -- "$BIN" detokenize -m "$CHAT" --ids 1,999999
expect "tokenize without a tokenizer" "tokenizer.json" -- "$BIN" tokenize -m "$FX/qwen3_moe_tiny" -p hi
fresh qwen3_moe_tiny wordpiece
echo '{"version":"1.0","model":{"type":"WordPiece","vocab":{"a":0}},"normalizer":null,"pre_tokenizer":null,"decoder":null,"added_tokens":[]}' > "$T/wordpiece/tokenizer.json"
expect "unsupported tokenizer.json kind" "WordPiece" -- "$BIN" generate -m "$T/wordpiece" -p "hi" -n 2

# usage errors: one line, exit 2, the likely option or command suggested
Q=$FX/qwen3_moe_tiny
usage "mistyped command" "did you mean 'generate'?" -- "$BIN" generat
usage "unknown command" "unknown command 'frobnicate'" -- "$BIN" frobnicate
usage "help for a mistyped command" "did you mean 'inspect'?" -- "$BIN" help inspct
usage "mistyped top-level option" "did you mean '--version'?" -- "$BIN" --verison
usage "mistyped option (transposition)" "did you mean '--temp'?" -- "$BIN" generate -m "$Q" --tmep 0
usage "mistyped option (long form)" "did you mean '--temperature'?" -- "$BIN" generate --temprature 0
usage "abbreviated option" "did you mean '--max-tokens'?" -- "$BIN" generate --max 3
usage "mistyped chat option" "did you mean '--system'?" -- "$BIN" chat --sytem x
usage "mistyped serve option" "did you mean '--port'?" -- "$BIN" serve --prot 8080
usage "mistyped synth option" "did you mean '--preset'?" -- "$BIN" synth --prset x
usage "mistyped tokenize option" "did you mean '--file'?" -- "$BIN" tokenize --fiel x
usage "mistyped inspect option" "did you mean '--json'?" -- "$BIN" inspect --jsn
usage "mistyped bench option" "did you mean '--repeats'?" -- "$BIN" bench --repeat 3
usage "no suggestion when nothing is close" "see --help" -- "$BIN" generate --zzzzzzzz
usage "stray argument" "unexpected argument 'hello'" -- "$BIN" generate hello
usage "option without its value" "needs a value" -- "$BIN" generate -m "$Q" -p
usage "-n below -1" "-n" -- "$BIN" generate -m "$Q" --prompt-ids 1 -n -2
usage "--system with a raw prompt" "--system needs --chat" -- "$BIN" generate -m "$CHAT" -p hi --system x
usage "two prompt sources" "exactly one of" -- "$BIN" generate -m "$CHAT" -p hi -f /dev/null
usage "prompt file missing" "$T/none.txt" -- "$BIN" generate -m "$CHAT" -f "$T/none.txt"
usage "prompt file is a directory" "$T" -- "$BIN" generate -m "$CHAT" -f "$T"
printf 'a\0b' > "$T/nul.txt"
usage "prompt file with a NUL byte" "NUL" -- "$BIN" generate -m "$CHAT" -f "$T/nul.txt"
usage "chat with two first messages" "at most one of" -- "$BIN" chat -m "$CHAT" -p hi -f /dev/null

# mlxcel template: bad arguments are usage errors, a template's own error is not
TOK=$FX/tokenizers/mixtral
echo '[{"role": "user", "content": "hi"}]' > "$T/msgs.json"
usage "template without --messages" "--messages FILE are required" -- "$BIN" template -m "$TOK"
usage "template of a missing folder" "$T/none: not a directory" -- "$BIN" template -m "$T/none" --messages "$T/msgs.json"
usage "template --kwarg without =" "expected KEY=JSON" -- "$BIN" template -m "$TOK" --messages "$T/msgs.json" --kwarg flag
usage "template --kwarg value not JSON" "not JSON" -- "$BIN" template -m "$TOK" --messages "$T/msgs.json" --kwarg enable_thinking=flase
echo '[{"role": "user", "content": "hi"}' > "$T/cut.json"
usage "template messages not JSON" "invalid JSON at byte" -- "$BIN" template -m "$TOK" --messages "$T/cut.json"
echo '{"role": "user", "content": "hi"}' > "$T/one.json"
usage "template messages not a list" "expected a JSON array" -- "$BIN" template -m "$TOK" --messages "$T/one.json"
echo '[{"role": "user", "content": "hi"}, {"content": "no role"}]' > "$T/norole.json"
usage "template message without a role" "message 1" -- "$BIN" template -m "$TOK" --messages "$T/norole.json"
usage "template tools not a list" "--tools" -- "$BIN" template -m "$TOK" --messages "$T/msgs.json" --tools "$T/one.json"
echo '[{"role": "assistant", "content": "first"}]' > "$T/order.json"
expect "template raises an exception" "conversation roles must alternate" -- "$BIN" template -m "$TOK" --messages "$T/order.json"
echo '{% if %}' > "$T/broken.jinja"
expect "template with a syntax error" "syntax error" -- "$BIN" template -m "$TOK" --messages "$T/msgs.json" --template "$T/broken.jinja"

# chat reads stdin when it is not a terminal, keeps going after /reset
out=$(printf 'Hello\n/reset\nHi again\n/exit\n' | "$BIN" chat -m "$CHAT" --temp 0 -n 3 2>/dev/null); rc=$?
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" -ge 1 ]; then
  pass=$((pass + 1)); echo "ok   chat over a pipe"
else
  fail=$((fail + 1)); echo "FAIL chat over a pipe (exit $rc): $out"
fi

# Out of memory said up front (MLXCEL_MEM_AVAILABLE stands in for the
# machine): the KV cache of --ctx-size (x --parallel) does not fit.
KJV=${MLXCEL_SRC:-.}/models/kjv-moe
expect "generate: KV cache over the available memory" "are available (MLXCEL_MEM_AVAILABLE); lower --ctx-size" -- \
  env MLXCEL_MEM_AVAILABLE=2M "$BIN" generate -m "$KJV" -p "In the beginning" -n 2 --ctx-size 2048
expect "serve: slots over the available memory" "lower --ctx-size or --parallel" -- \
  env MLXCEL_MEM_AVAILABLE=64M "$BIN" serve -m "$KJV" --port 0 --parallel 16 --ctx-size 2048

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
