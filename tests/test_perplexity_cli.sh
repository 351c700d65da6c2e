#!/usr/bin/env bash
# `mlxcel perplexity` end to end on the qwen2_moe_tiny_chat fixture (random
# weights, the real Qwen tokenizer): the result and its JSON, the base file
# and its size, a run against its own base (KL exactly 0, 100 % same top
# token), the fused MoE decode kernel against the gather path and against
# whole-chunk prefill (same top token everywhere, KL below 1e-6), and the
# refusals, each a one-line message naming what is wrong.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
if [ -z "${MLXCEL_FIXTURES:-}" ]; then
  echo "SKIP: MLXCEL_FIXTURES is not set; these tests run the qwen2_moe_tiny_chat fixture" >&2
  exit 77
fi
FX=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
[ -d "$FX" ] || { echo "FAIL: $FX is missing" >&2; exit 1; }
command -v jq >/dev/null || { echo "FAIL: jq is needed (scripts/deps.sh installs it)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1 ($2)"; fi; }   # NAME CONDITION
# JSON field as a number, or "null"
J() { jq -r "$2" "$1"; }
# awk comparisons of floats: le A B
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

# 354 tokens with the Qwen tokenizer: 5 chunks of 64
cat > "$T/text.txt" <<'EOF'
The lighthouse keeper climbed the stairs every evening at dusk, counting the steps as his father had taught him. There were one hundred and twelve of them, worn smooth in the middle by a century of boots. At the top he trimmed the wick, polished the great lens with a soft cloth, and checked the clockwork that turned the light. Ships far out at sea would see the beam sweep across the water every ten seconds, and they would know where the rocks were.
In winter the storms came from the west. Waves broke against the tower and threw spray as high as the gallery rail. The keeper wrote in his log each night: the wind, the state of the sea, the ships he saw, and whether the light had burned steadily. Most nights the entries were short. Some nights he wrote a page, because the storm would not let him sleep and the pen kept his hands busy.
When the supply boat came in spring, it brought oil, flour, letters and news. The keeper read the letters slowly, one a day, to make them last. His sister wrote about the harvest and the new school in the village. His old friend wrote about the railway that was coming, and how the town would change when the trains arrived. The keeper wondered whether anyone would still need a lighthouse when the world moved so fast.
Years later an engineer arrived with plans for an electric lamp. It would turn by itself and would need no wick and no oil. The keeper showed him the stairs, the lens and the clockwork, and the engineer made careful notes. Before he left he asked the keeper what he would do when the light no longer needed him. The keeper said he would keep the log anyway, because somebody ought to remember the weather.
EOF
P() { "$BIN" perplexity -m "$FX" -f "$T/text.txt" "$@"; }
V=151936

# --- the plain run ---
P --ctx 64 --json > "$T/a.json" 2> "$T/a.err"; rc=$?
check "json run exits 0" "[ $rc -eq 0 ]"
check "json: 354 tokens, 5 chunks, 155 scored" \
  "[ \"\$(J $T/a.json '[.n_tokens,.chunks,.first,.scored]|@csv')\" = '354,5,32,155' ]"
check "json: PPL = exp(mean NLL), finite, with an uncertainty" \
  "J $T/a.json '(.ppl > 1) and (.ppl_err > 0) and (((.mean_nll|exp) - .ppl | fabs) < 1e-9 * .ppl)' | grep -qx true"
check "a progress line per chunk on stderr" "[ \$(grep -c '^\[[1-5]/5\] PPL = ' $T/a.err) -eq 5 ]"
P --ctx 64 > "$T/a.txt" 2>/dev/null
check "text: one line 'PPL = x ± y' on stdout" \
  "[ \$(wc -l < $T/a.txt) -eq 1 ] && grep -qE '^PPL = [0-9]+\.[0-9]+ ± [0-9]+\.[0-9]+$' $T/a.txt"
P --ctx 64 --chunks 2 --json > "$T/b.json" 2>/dev/null
check "--chunks 2: 62 scored" "[ \"\$(J $T/b.json '[.chunks,.scored]|@csv')\" = '2,62' ]"

# --- base files and a run against its own base ---
P --ctx 64 --chunks 2 --kl-divergence-base "$T/full.kld" --json > "$T/f.json" 2>/dev/null
check "base (full) written, same PPL as without it" "[ \"\$(J $T/f.json .ppl)\" = \"\$(J $T/b.json .ppl)\" ]"
check "full base file: 128 + 4*128 + 62*(8 + 4*V) bytes" \
  "[ \$(stat -c %s $T/full.kld) -eq $((128 + 4 * 128 + 62 * (8 + 4 * V))) ]"
P --kl-divergence-base "$T/full.kld" --kl-divergence --json > "$T/fs.json" 2>/dev/null; rc=$?
check "self comparison (full) exits 0, ctx and chunks from the base" \
  "[ $rc -eq 0 ] && [ \"\$(J $T/fs.json '[.ctx,.chunks]|@csv')\" = '64,2' ]"
check "self comparison (full): KL exactly 0, 100 % same top, ΔPPL 0, RMS Δp 0" \
  "J $T/fs.json '.kl_divergence | (.kl_max == 0 and .kl_min == 0 and .kl_mean == 0 and .same_top_percent == 100 and .delta_ppl == 0 and .dp_rms_percent == 0 and .positions == 62)' | grep -qx true"
P --ctx 64 --chunks 2 --kl-divergence-base "$T/top.kld" --top-k 32 > /dev/null 2>&1
check "top-32 base file: 128 + 4*128 + 62*(16 + 8*32) bytes" \
  "[ \$(stat -c %s $T/top.kld) -eq $((128 + 4 * 128 + 62 * (16 + 8 * 32))) ]"
P --kl-divergence-base "$T/top.kld" --kl-divergence --json > "$T/ts.json" 2>/dev/null
check "self comparison (top-32): KL exactly 0, 100 % same top" \
  "J $T/ts.json '.kl_divergence | (.form == \"top-k\" and .top_k == 32 and .kl_max == 0 and .same_top_percent == 100 and .delta_ppl == 0)' | grep -qx true"
P --kl-divergence-base "$T/full.kld" --kl-divergence > "$T/fs.txt" 2>/dev/null
check "text comparison prints the statistics" \
  "grep -q '^mean KLD *= 0 ± 0' $T/fs.txt && grep -q '^same top token = 100.000 ± 0.000 %' $T/fs.txt && grep -q '^RMS Δp' $T/fs.txt && grep -q '^ΔPPL' $T/fs.txt"

# --- the fused decode kernel against the gather path and against prefill ---
# --batch 1 feeds one token per forward: the single-token decode path, where
# the fused MoE kernel runs unless MLXCEL_FUSED_MOE=0.  Both paths compute the
# same sums in another order in f32, so the logits differ by float rounding
# (the fixtures agree with transformers to ~1e-5), and the KL of two such
# distributions is about sum p*d^2/2 ~ 1e-10; 1e-6 leaves that 10^4 times
# over and is still far below what a real fault (a wrong expert, a lost
# shared expert: KL ~ 0.1) gives.  The most probable token must not change.
MLXCEL_FUSED_MOE=0 MLXCEL_TRACE_MOE=1 P --ctx 64 --chunks 2 --batch 1 --kl-divergence-base "$T/gather.kld" \
  > /dev/null 2> "$T/g.err"
check "base with MLXCEL_FUSED_MOE=0 ran the gather path only" "grep -qE '^moe-dispatch fused=0 gather=[1-9]' $T/g.err"
MLXCEL_TRACE_MOE=1 P --batch 1 --kl-divergence-base "$T/gather.kld" --kl-divergence --json > "$T/fg.json" 2> "$T/fg.err"
check "fused run ran the fused kernel only" "grep -qE '^moe-dispatch fused=[1-9][0-9]* gather=0' $T/fg.err"
check "fused vs gather: 100 % same top token, KL <= 1e-6" \
  "J $T/fg.json '.kl_divergence | (.same_top_percent == 100 and .kl_max <= 1e-6 and .kl_min >= -1e-12)' | grep -qx true"
P --batch 1 --kl-divergence-base "$T/full.kld" --kl-divergence --json > "$T/dp.json" 2>/dev/null
check "decode steps vs whole-chunk prefill: 100 % same top token, KL <= 1e-6" \
  "J $T/dp.json '.kl_divergence | (.same_top_percent == 100 and .kl_max <= 1e-6 and .kl_min >= -1e-12)' | grep -qx true"
echo "  measured: fused vs gather max KL $(J $T/fg.json .kl_divergence.kl_max), decode vs prefill max KL $(J $T/dp.json .kl_divergence.kl_max)"

# --- refusals: exit 1 (2 for usage), one line on stderr naming the problem ---
expect() {   # NAME STATUS SUBSTRING -- command...
  local name=$1 want_rc=$2 want=$3; shift 4
  local err rc lines
  err=$("$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ $rc -eq "$want_rc" ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"; then
    ok "$name: $err"
  else
    bad "$name (exit $rc, $lines lines, wanted $want_rc and '$want'): $(printf '%s' "$err" | head -3)"
  fi
}
: > "$T/empty.txt"
head -c 300 "$T/text.txt" > "$T/short.txt"
sed 's/lighthouse/windmill/' "$T/text.txt" > "$T/other.txt"
cp "$T/full.kld" "$T/cut.kld"; truncate -s -1 "$T/cut.kld"
expect "missing text file" 1 "$T/nope.txt" -- "$BIN" perplexity -m "$FX" -f "$T/nope.txt"
expect "empty text file" 1 "empty" -- "$BIN" perplexity -m "$FX" -f "$T/empty.txt"
expect "text shorter than 2 x ctx" 1 "fewer than 2 x ctx = 512" -- P --ctx 256
expect "short file named" 1 "short.txt" -- "$BIN" perplexity -m "$FX" -f "$T/short.txt" --ctx 64
expect "base of another ctx" 1 "made with --ctx 64, this run uses --ctx 32" -- \
  P --ctx 32 --kl-divergence-base "$T/full.kld" --kl-divergence
expect "base of another text" 1 "differs" -- \
  "$BIN" perplexity -m "$FX" -f "$T/other.txt" --kl-divergence-base "$T/full.kld" --kl-divergence
expect "base with more chunks than this run" 1 "holds 2 chunks, this run has 1" -- \
  P --chunks 1 --kl-divergence-base "$T/full.kld" --kl-divergence
expect "truncated base" 1 "cut.kld" -- P --kl-divergence-base "$T/cut.kld" --kl-divergence
expect "not a base file" 1 "not a base file" -- P --kl-divergence-base "$T/text.txt" --kl-divergence
expect "missing base file" 1 "nope.kld" -- P --kl-divergence-base "$T/nope.kld" --kl-divergence
expect "--kl-divergence alone" 2 "--kl-divergence-base" -- P --kl-divergence
expect "--top-k when comparing" 2 "--top-k applies only" -- P --kl-divergence-base "$T/full.kld" --kl-divergence --top-k 8
expect "--top-k above the vocabulary limit" 2 "--top-k" -- P --kl-divergence-base "$T/x.kld" --top-k 5000
expect "no tokenizer" 1 "tokenizer.json" -- "$BIN" perplexity -m "$MLXCEL_FIXTURES/qwen3_moe_tiny" -f "$T/text.txt"
expect "unwritable base" 1 "$T/no/dir.kld" -- P --ctx 64 --kl-divergence-base "$T/no/dir.kld"
check "no partial base file left behind" "[ ! -e $T/no/dir.kld ]"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
