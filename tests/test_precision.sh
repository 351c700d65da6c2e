#!/usr/bin/env bash
# The fast precision (one int8 level of x per group) against the exact one
# on the trained demo model models/kjv-moe: `mlxcel perplexity
# --kl-divergence` over the held-out text, through prefill and through
# single-token decode steps.  Its quality was measured at mean KLD 0.0022,
# 97.3 % same top token and -0.013 % PPL (docs/quality.md): below the
# issue's gate for a default (0.002, 99 %), so exact stays the default; the
# bounds here are that measurement with generous margins, a guard against a
# broken fast kernel (a wrong scale or level gives KLD >> 0.1).  Also: the
# exact precision against itself through another kernel variant is
# float-close, and a bad --precision is a usage error.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
SRC=${MLXCEL_SRC:-.}
M=$SRC/models/kjv-moe
if [ ! -f "$M/eval/heldout.txt" ]; then
  echo "SKIP: $M/eval/heldout.txt is not there (the demo model is not in this tree)" >&2
  exit 77
fi
command -v jq >/dev/null || { echo "FAIL: jq is needed (scripts/deps.sh installs it)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
chunks=24 dchunks=2
if [ -n "${MLXCEL_SANITIZED:-}" ]; then chunks=2 dchunks=1; fi
K=()   # the kernel variant of the comparisons below (empty: the best this CPU runs)
ppl() { "${K[@]}" "$BIN" perplexity -m "$M" -f "$M/eval/heldout.txt" --ctx 256 "$@"; }

# The fast precision is a twin of the best variant where it has one
# (avx512vnni-fast); a CPU without one (AVX2 alone) runs its exact kernels
# under --precision fast.  Then: those give the exact logits, and the fast
# arithmetic is checked through the scalar twins (scalar-fast against
# scalar) over fewer chunks.
fk=$(ppl --chunks 1 --precision fast 2>&1 >/dev/null | sed -n 's/.*; kernel \([^,]*\),.*/\1/p' | head -n 1)
case "$fk" in
  *-fast) ;;
  *)
    echo "note: no fast kernel for this CPU (--precision fast takes '$fk'): the fast arithmetic is checked through MLXCEL_KERNEL=scalar"
    ppl --chunks 1 --kl-divergence-base "$T/xbase" > /dev/null 2> "$T/err" || bad "exact base run: $(tail -1 "$T/err")"
    ppl --chunks 1 --precision fast --kl-divergence-base "$T/xbase" --kl-divergence --json > "$T/x.json" 2> "$T/err"
    jq -e '.kl_divergence.kl_mean == 0 and .kl_divergence.same_top_percent == 100' "$T/x.json" > /dev/null &&
      ok "--precision fast with no fast kernel ($fk) gives the exact logits" ||
      bad "--precision fast with no fast kernel ($fk): $(jq -c '.kl_divergence' "$T/x.json" 2>/dev/null) $(tail -1 "$T/err")"
    K=(env MLXCEL_KERNEL=scalar)
    chunks=4 dchunks=1
    if [ -n "${MLXCEL_SANITIZED:-}" ]; then chunks=2; fi
    ;;
esac

# prefill: whole chunks through the tile kernels
ppl --chunks $chunks --kl-divergence-base "$T/base" > /dev/null 2> "$T/err" || bad "exact base run: $(tail -1 "$T/err")"
if ppl --chunks $chunks --precision fast --kl-divergence-base "$T/base" --kl-divergence --json > "$T/fast.json" 2> "$T/err"; then
  k=$(jq '.kl_divergence' "$T/fast.json")
  echo "fast vs exact, prefill: $(echo "$k" | jq -c '{kl_mean, same_top_percent, delta_ppl_percent}')"
  echo "$k" | jq -e '.kl_mean > 0 and .kl_mean < 0.01' > /dev/null && ok "prefill mean KLD $(echo "$k" | jq .kl_mean) in (0, 0.01)" ||
    bad "prefill mean KLD $(echo "$k" | jq .kl_mean) not in (0, 0.01)"
  echo "$k" | jq -e '.same_top_percent > 95' > /dev/null && ok "prefill same top token > 95 %" || bad "prefill same top token $(echo "$k" | jq .same_top_percent) %"
  echo "$k" | jq -e '(.delta_ppl_percent | fabs) < 1' > /dev/null && ok "prefill |ΔPPL| < 1 %" || bad "prefill ΔPPL $(echo "$k" | jq .delta_ppl_percent) %"
  if echo "$k" | jq -e '.kl_mean <= 0.002 and .same_top_percent >= 99 and (.delta_ppl_percent | fabs) <= 0.2' > /dev/null; then
    echo "note: the fast precision meets the default gate on this model"
  else
    echo "note: the fast precision does not meet the default gate (mean KLD <= 0.002, same top >= 99 %, |ΔPPL| <= 0.2 %): exact stays the default"
  fi
else
  bad "fast prefill run: $(tail -1 "$T/err")"
fi

# decode: one token per step through the matvec kernels (and the fused MoE path)
ppl --chunks $dchunks --batch 1 --kl-divergence-base "$T/dbase" > /dev/null 2> "$T/err" || bad "exact decode base: $(tail -1 "$T/err")"
if ppl --chunks $dchunks --batch 1 --precision fast --kl-divergence-base "$T/dbase" --kl-divergence --json > "$T/fd.json" 2> "$T/err"; then
  jq -e '.kl_divergence.kl_mean > 0 and .kl_divergence.kl_mean < 0.01 and .kl_divergence.same_top_percent > 93' "$T/fd.json" > /dev/null &&
    ok "decode steps: fast vs exact $(jq -c '.kl_divergence | {kl_mean, same_top_percent}' "$T/fd.json")" ||
    bad "decode steps: fast vs exact $(jq -c '.kl_divergence | {kl_mean, same_top_percent}' "$T/fd.json")"
else
  bad "fast decode run: $(tail -1 "$T/err")"
fi

# exact through the scalar reference: as close as float rounding
# (against the best variant again)
K=()
# (the base has $chunks chunks: compare over a base of the same length)
ppl --chunks $dchunks --kl-divergence-base "$T/base2" > /dev/null 2>&1
MLXCEL_KERNEL=scalar ppl --chunks $dchunks --kl-divergence-base "$T/base2" --kl-divergence --json > "$T/ex.json" 2> "$T/err"
jq -e '.kl_divergence.kl_mean < 1e-8 and .kl_divergence.same_top_percent == 100' "$T/ex.json" > /dev/null &&
  ok "exact: scalar kernels vs the default $(jq -c '.kl_divergence | {kl_mean, same_top_percent}' "$T/ex.json")" ||
  bad "exact: scalar kernels vs the default $(jq -c '.kl_divergence' "$T/ex.json" 2>/dev/null) $(tail -1 "$T/err")"

# a bad precision is a usage error (exit 2, one line)
"$BIN" perplexity -m "$M" -f "$M/eval/heldout.txt" --precision sloppy > /dev/null 2> "$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "precision" "$T/err" && ok "--precision sloppy: exit 2, $(head -1 "$T/err")" || bad "--precision sloppy: exit $rc"
MLXCEL_PRECISION=sloppy "$BIN" generate -m "$M" -p "And" -n 2 --temp 0 > /dev/null 2> "$T/err"
grep -q "MLXCEL_PRECISION" "$T/err" && ok "MLXCEL_PRECISION=sloppy warns" || bad "MLXCEL_PRECISION=sloppy: no warning"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
