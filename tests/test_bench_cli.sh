#!/usr/bin/env bash
# test_bench_cli.sh - `mlxcel bench` from the command line: the JSON report
# is consistent with itself (the roofline fraction is decode tok/s x bytes
# per token / the probed bandwidth, on the plain path and with
# --compare-fused, where it must use the fused runs, not all four), the text
# report names what it measured, bad options exit 2.  Speeds are not judged
# here (the machine is shared): only arithmetic that holds at any speed.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
FIX=${MLXCEL_FIXTURES:-}
if [ ! -x "$BIN" ]; then
    echo "SKIP: $BIN not built"
    exit 77
fi
if [ -z "$FIX" ] || [ ! -d "$FIX/qwen2_moe_tiny_chat" ]; then
    echo "SKIP: MLXCEL_FIXTURES is not set (or has no qwen2_moe_tiny_chat): no checkpoint to bench"
    exit 77
fi
if ! command -v python3 >/dev/null; then
    echo "SKIP: python3 is needed to read the JSON report"
    exit 77
fi
M="$FIX/qwen2_moe_tiny_chat"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mlxcel_bench_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$1"; fi; }

# One repeat: the report's roofline is exactly its decode rate x bytes per
# token / its bandwidth (with two fused runs per repeat, their mean).
for mode in plain compare; do
    extra=""
    [ $mode = compare ] && extra="--compare-fused"
    "$BIN" bench -m "$M" -p 8 -n 4 -r 1 --bw-mb 8 -t 2 --json $extra >"$TMP/$mode.json" 2>"$TMP/$mode.err"
    check '[ $? -eq 0 ]'
    python3 - "$TMP/$mode.json" "$mode" <<'PY' >"$TMP/$mode.check" 2>&1
import json, sys
o = json.load(open(sys.argv[1]))
mode = sys.argv[2]
need = ["prefill_tok_s", "decode_tok_s", "weight_bytes_per_token", "mem_bw_gbs", "roofline_fraction",
        "peak_rss_bytes", "kv_cache_bytes_per_token", "threads", "kernel", "precision"]
missing = [k for k in need if k not in o]
assert not missing, "missing keys %s" % missing
assert o["threads"] == 2, o["threads"]
assert o["mem_bw_gbs"] > 0 and o["decode_tok_s"] > 0
want = o["decode_tok_s"] * o["weight_bytes_per_token"] / (o["mem_bw_gbs"] * 1e9)
assert abs(o["roofline_fraction"] - want) <= 1e-9 * max(want, 1e-30), (o["roofline_fraction"], want)
if mode == "compare":
    f, g = o["decode_tok_s_fused"], o["decode_tok_s_gather"]
    assert o["decode_tok_s"] == f, "decode_tok_s is the fused (default) path's"
    assert abs(o["fused_over_gather"] - f / g) <= 1e-12 * f / g
else:
    assert "fused_over_gather" not in o
print("ok")
PY
    check "grep -qx ok '$TMP/$mode.check' || { cat '$TMP/$mode.check' >&2; false; }"
done

# The text report: the ratio and the roofline, logs on stderr only
"$BIN" bench -m "$M" -p 8 -n 4 -r 2 --bw-mb 8 --compare-fused >"$TMP/text" 2>"$TMP/text.err"
check '[ $? -eq 0 ]'
check "grep -q '^fused / gather' '$TMP/text'"
check "grep -q '^roofline' '$TMP/text'"
check "grep -q '^decode gather' '$TMP/text'"
check "! grep -q '^bench:' '$TMP/text'"
check "grep -q 'repeat 2/2 done' '$TMP/text.err'"

# bad input
"$BIN" bench >/dev/null 2>"$TMP/e1"
check '[ $? -eq 2 ] && grep -q "\-m DIR is required" "$TMP/e1"'
"$BIN" bench -m "$M" -r 0 >/dev/null 2>"$TMP/e2"
check '[ $? -eq 2 ]'
"$BIN" bench -m "$M" --nope >/dev/null 2>"$TMP/e3"
check '[ $? -eq 2 ]'
"$BIN" bench -m "$TMP/missing" >/dev/null 2>"$TMP/e4"
check '[ $? -eq 1 ] && grep -q "missing" "$TMP/e4"'
"$BIN" bench -m "$M" -p 8 -n 4 -c 11 >/dev/null 2>"$TMP/e5"   # below 8 + 4 + 2
check '[ $? -eq 2 ] && grep -q "ctx-size 11 is below" "$TMP/e5"'
# a larger context than the run needs: the header says so, the run works
"$BIN" bench -m "$M" -p 8 -n 4 -r 1 -c 300 --bw-mb 0 >"$TMP/ctx" 2>"$TMP/ctx.err"
check '[ $? -eq 0 ] && grep -q "context 300" "$TMP/ctx.err" && grep -q "^decode" "$TMP/ctx"'
"$BIN" bench --help >"$TMP/help"
check '[ $? -eq 0 ] && grep -q -- "--compare-fused" "$TMP/help"'

echo "test_bench_cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
