#!/usr/bin/env bash
# test_server_bench.sh - aggregate decode throughput of `mlxcel serve` with
# 1, 2, 4, 8 concurrent clients (greedy, TOKENS tokens each, EOS ignored so
# every client generates exactly TOKENS).  A benchmark, not a test: it skips
# (77) unless MLXCEL_BENCH_MODEL names a checkpoint, e.g.
#
#   mlxcel synth --preset qwen1.5-moe-a2.7b --out /tmp/q15
#   MLXCEL_BENCH_MODEL=/tmp/q15 MLXCEL_BIN=build/mlxcel bash tests/test_server_bench.sh
#
# Prints a markdown table (docs/server.md has one).  CLIENTS and TOKENS
# override the defaults.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
M=${MLXCEL_BENCH_MODEL:-}
[ -n "$M" ] || { echo "SKIP: MLXCEL_BENCH_MODEL is not set (a benchmark, not a test)"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
CLIENTS=${CLIENTS:-1 2 4 8}
TOKENS=${TOKENS:-64}
T=$(mktemp -d)
SPID=
trap '[ -n "$SPID" ] && kill $SPID 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

"$BIN" serve -m "$M" --port 0 --ctx-size 512 --parallel 8 --queue 8 --timeout 600 2>"$T/log" &
SPID=$!
PORT=
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/log" | head -1)
  [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SPID 2>/dev/null || { cat "$T/log"; exit 1; }
  sleep 0.2
done
URL=http://127.0.0.1:$PORT/v1/completions
req() { printf '{"prompt": "%s", "max_tokens": %d, "temperature": 0, "ignore_eos": true}' "$1" "$2"; }
now() { date +%s.%N; }

# warm-up: pages the weights in
curl -s -d "$(req "warm up" 4)" "$URL" >/dev/null

echo "| clients | tokens each | wall (s) | aggregate tok/s | per-client tok/s | speed-up vs 1 |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
base=
for c in $CLIENTS; do
  t0=$(now)
  for i in $(seq 1 "$c"); do
    curl -s -d "$(req "Round $c, client $i: once upon a time" "$TOKENS")" "$URL" >"$T/out$i" &
  done
  wait $(jobs -p | grep -v "^$SPID\$") 2>/dev/null
  t1=$(now)
  total=0
  for i in $(seq 1 "$c"); do
    n=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$T/out$i")
    total=$((total + ${n:-0}))
  done
  agg=$(echo "$total / ($t1 - $t0)" | bc -l)
  [ -z "$base" ] && base=$agg
  printf '| %d | %d | %.1f | %.2f | %.2f | %.2fx |\n' "$c" "$TOKENS" "$(echo "$t1 - $t0" | bc -l)" \
    "$agg" "$(echo "$agg / $c" | bc -l)" "$(echo "$agg / $base" | bc -l)"
done
grep -c '^serve: POST /v1/completions 200' "$T/log" >/dev/null || cat "$T/log" >&2
kill -TERM $SPID
wait $SPID
SPID=
