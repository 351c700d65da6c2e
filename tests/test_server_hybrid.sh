#!/usr/bin/env bash
# test_server_hybrid.sh - `mlxcel serve` with the hybrid families, whose
# sequences carry recurrent state (qwen3_next's DeltaNet matrices, lfm2_moe's
# convolution windows) beside the KV cache: synth's miniatures of both
# (random weights, a tokenizer covering every id), each request's greedy
# text when it runs alone, then
#  - several requests at once (batched decode steps, more than --parallel:
#    some queue), streamed or not, give exactly the texts they gave alone;
#  - a request whose prompt extends an earlier one (the slot's cache is
#    reused up to the point a recurrent state can be rewound to) and a
#    request after a stream cut short (its slot's state dropped mid-way)
#    give their texts alone.
# Needs MLXCEL_BIN, curl and jq (skips with 77 without them).
set -u
export LC_ALL=C.UTF-8
BIN=${MLXCEL_BIN:-build/mlxcel}
[ -x "$BIN" ] || { echo "SKIP: $BIN not built"; exit 77; }
for t in curl jq; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

T=$(mktemp -d "${TMPDIR:-/tmp}/mlxcel_server_hybrid.XXXXXX")
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
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }

# Starts a server on a free loopback port; sets URL and SPID.
start_server() {
  local model=$1 log=$2; shift 2
  "$BIN" serve -m "$model" --port 0 "$@" 2>"$log" &
  SPID=$!
  local port=
  for _ in $(seq 1 300); do
    port=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
      URL=http://127.0.0.1:$port
      return 0
    fi
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the server did not come up:" >&2
  cat "$log" >&2
  exit 1
}
stop_server() { kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=; }

req() {  # prompt, max_tokens, extra fields
  jq -cn --arg p "$1" --argjson n "$2" "{prompt: \$p, temperature: 0, max_tokens: \$n} + ${3:-{\}}"
}
# one completion's text into file $2
complete() { curl -s -H 'Content-Type: application/json' -d "$(req "$1" "$3")" "$URL/v1/completions" | jq -j '.choices[0].text' >"$2"; }
stream_text() {
  sed -n 's/^data: //p' "$1" | grep -v '^\[DONE\]$' | jq -j 'select(.choices | length > 0) | .choices[0].text // empty'
}

PROMPTS=("the quick brown fox jumps over" "a b c d e f g h i j k l m n o p" "once upon a time in a land" "1 2 3 4 5 6 7 8 9 10 11 12 13 14"
  "hello world" "repeat after me: red green blue red green blue")
N=16
for preset in qwen3-next-tiny lfm2-moe-tiny; do
  M=$T/$preset
  "$BIN" synth --preset "$preset" --out "$M" --quiet 2>"$T/synth.err" ||
    { bad "synth $preset: $(cat "$T/synth.err")"; continue; }
  start_server "$M" "$T/$preset.log" --parallel 3 --queue 16 --ctx-size 512

  # alone, one after another
  for i in "${!PROMPTS[@]}"; do complete "${PROMPTS[$i]}" "$T/alone$i" $N; done
  check "$preset: a non-empty greedy text" [ -s "$T/alone0" ]
  check "$preset: prompts give different texts" bash -c "! cmp -s '$T/alone0' '$T/alone1'"

  # at once: six requests on three slots, half of them streamed
  pids=()
  for i in "${!PROMPTS[@]}"; do
    if [ $((i % 2)) -eq 0 ]; then
      curl -sN -H 'Content-Type: application/json' -d "$(req "${PROMPTS[$i]}" $N '{stream: true}')" \
        "$URL/v1/completions" >"$T/sse$i" &
    else
      complete "${PROMPTS[$i]}" "$T/batch$i" $N &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for i in "${!PROMPTS[@]}"; do
    [ $((i % 2)) -eq 0 ] && stream_text "$T/sse$i" >"$T/batch$i"
    check "$preset: request $i at once = alone" cmp -s "$T/alone$i" "$T/batch$i"
  done

  # a prompt extending an earlier one: the slot's cached prefix, then more
  complete "${PROMPTS[0]}" "$T/pre" $N
  complete "${PROMPTS[0]} the lazy dog" "$T/ext1" $N
  stop_server
  start_server "$M" "$T/$preset.fresh.log" --parallel 1 --ctx-size 4096
  complete "${PROMPTS[0]} the lazy dog" "$T/ext0" $N
  check "$preset: an extended prompt on a warm slot = on a fresh server" cmp -s "$T/ext0" "$T/ext1"

  # a stream cut short, then the same request whole
  curl -sN --max-time 0.2 -H 'Content-Type: application/json' \
    -d "$(req "${PROMPTS[2]}" 3000 '{stream: true}')" "$URL/v1/completions" >"$T/cut" 2>/dev/null
  check "$preset: the stream was cut short" bash -c "! grep -q '\[DONE\]' '$T/cut'"
  complete "${PROMPTS[2]}" "$T/after" $N
  check "$preset: after a dropped stream = alone" cmp -s "$T/alone2" "$T/after"
  stop_server
done

echo "test_server_hybrid: $pass passed, $fail failed"
[ $fail -eq 0 ]
