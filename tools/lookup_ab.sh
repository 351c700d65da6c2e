#!/usr/bin/env bash
# Prompt lookup, A/B: runs `mlxcel generate` greedily with --lookup 0 and
# --lookup N in turn, ROUNDS times, and prints each pair's decode tok/s (from
# --stats), their ratio, the lookup statistics, and whether the two texts
# are byte-identical (they must be).
#   tools/lookup_ab.sh MODEL_DIR PROMPT_FILE N_TOKENS [ROUNDS=5] [LOOKUP=8]
# MLXCEL_BIN (default build/mlxcel) and MLXCEL_THREADS are honoured.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
B=${MLXCEL_BIN:-$here/build/mlxcel}
[ $# -ge 3 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
M=$1 P=$2 N=$3 R=${4:-5} L=${5:-8}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rate() { awk '/^decode:/{print $2}' "$1"; }
for r in $(seq "$R"); do
  "$B" generate -m "$M" -f "$P" -n "$N" --temp 0 --stats --lookup 0 > "$tmp/a.txt" 2> "$tmp/a.log"
  "$B" generate -m "$M" -f "$P" -n "$N" --temp 0 --stats --lookup "$L" > "$tmp/b.txt" 2> "$tmp/b.log"
  a=$(rate "$tmp/a.log") b=$(rate "$tmp/b.log")
  same=identical; cmp -s "$tmp/a.txt" "$tmp/b.txt" || same=DIFFERENT
  printf 'round %d  plain %8s tok/s  lookup %8s tok/s  ratio %s  %s  text %s\n' "$r" "$a" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", b/a}')" "$(grep '^lookup:' "$tmp/b.log" | sed 's/^lookup: //')" "$same"
  [ "$same" = identical ] || exit 1
done
