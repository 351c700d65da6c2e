#!/usr/bin/env bash
# test_bench_batch.sh - `mlxcel bench --batch N` on models/kjv-moe (CPU):
# the JSON report has the batched decode's fields, its per-sequence rate is
# the aggregate / N and min <= median <= max; the text report names the
# batch; without --batch neither appears (the report is as before); a bad
# --batch exits 2.  Speeds are not judged (the machine is shared).
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
M=${MLXCEL_SRC:-.}/models/kjv-moe
if [ ! -x "$BIN" ]; then
    echo "SKIP: $BIN not built"
    exit 77
fi
if [ ! -f "$M/config.json" ]; then
    echo "SKIP: $M not found (set MLXCEL_SRC)"
    exit 77
fi
if ! command -v python3 >/dev/null; then
    echo "SKIP: python3 is needed to read the JSON report"
    exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mlxcel_bench_batch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$1"; fi; }

"$BIN" bench -m "$M" -p 6 -n 3 -r 2 --batch 3 --bw-mb 0 -t 2 --json >"$TMP/b.json" 2>"$TMP/b.err"
check '[ $? -eq 0 ]'
python3 - "$TMP/b.json" <<'PY' >"$TMP/b.check" 2>&1
import json, sys
o = json.load(open(sys.argv[1]))
assert o["batch"] == 3, o.get("batch")
agg, lo, hi = o["batch_decode_tok_s"], o["batch_decode_tok_s_min"], o["batch_decode_tok_s_max"]
assert 0 < lo <= agg <= hi, (lo, agg, hi)
per = o["batch_decode_tok_s_per_seq"]
assert abs(per - agg / 3) <= 1e-12 * agg, (per, agg)
assert o["decode_tok_s"] > 0 and o["prefill_tok_s"] > 0
print("ok")
PY
check "grep -qx ok '$TMP/b.check' || { cat '$TMP/b.check' >&2; false; }"
check "grep -q 'batch of 3 done' '$TMP/b.err'"

"$BIN" bench -m "$M" -p 6 -n 3 -r 1 --batch 2 --bw-mb 0 -t 2 >"$TMP/b.txt" 2>/dev/null
check '[ $? -eq 0 ]'
check "grep -Eq '^decode batch 2 +[0-9.]+ tok/s median .*1 runs' '$TMP/b.txt'"
check "grep -Eq '^  per sequence +[0-9.]+ tok/s median \\(aggregate / 2\\)' '$TMP/b.txt'"

# without --batch: the report as before
"$BIN" bench -m "$M" -p 6 -n 3 -r 1 --bw-mb 0 -t 2 --json >"$TMP/p.json" 2>/dev/null
check '[ $? -eq 0 ]'
check "! grep -q batch '$TMP/p.json'"
"$BIN" bench -m "$M" -p 6 -n 3 -r 1 --bw-mb 0 -t 2 >"$TMP/p.txt" 2>/dev/null
check "! grep -q 'batch' '$TMP/p.txt'"

for v in 0 x -2; do
    "$BIN" bench -m "$M" --batch "$v" >/dev/null 2>"$TMP/bad.err"
    check "[ $? -eq 2 ]"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
