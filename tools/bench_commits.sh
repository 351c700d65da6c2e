#!/usr/bin/env bash
# bench_commits.sh - the same `mlxcel bench` run on several commits,
# alternating between them round after round, so that a shared machine's
# drift hits every commit alike (docs/benchmarks.md, "What each step bought").
#
# usage: tools/bench_commits.sh [-r ROUNDS] [-o OUTDIR] MODEL COMMIT... [-- BENCH-ARGS...]
#   Each commit is built (Release) in its own git worktree under OUTDIR
#   (default /tmp/mlxcel-bench-commits, outside the repository).  Every round
#   runs `build/mlxcel bench -m MODEL BENCH-ARGS --json` once per commit (default
#   BENCH-ARGS: -p 128 -n 32 -r 3 --compare-fused --bw-mb 512); the JSON lines
#   go to OUTDIR/results.jsonl and a table of medians (min-max) to stdout.
set -euo pipefail
rounds=3 out=/tmp/mlxcel-bench-commits
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -r) rounds=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { usage >&2; exit 2; }
model=$1; shift
commits=()
repo=$(git rev-parse --show-toplevel)
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  # by hash: a name like HEAD moves, and builds are kept under OUTDIR by name
  commits+=("$(git -C "$repo" rev-parse --short "$1^{commit}")") || { echo "bench_commits: no commit $1" >&2; exit 1; }
  shift
done
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p 128 -n 32 -r 3 --compare-fused --bw-mb 512)
command -v jq >/dev/null || { echo "bench_commits: needs jq (scripts/deps.sh installs it)" >&2; exit 1; }
mkdir -p "$out"
for c in "${commits[@]}"; do
  d="$out/$c"
  if [ ! -x "$d/build/mlxcel" ]; then
    rm -rf "$d"
    git -C "$repo" worktree add --detach "$d" "$c" >/dev/null 2>&1 || { echo "bench_commits: cannot check out $c" >&2; exit 1; }
    echo "bench_commits: building $c" >&2
    (cd "$d" && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j "$(nproc)" --target mlxcel >/dev/null)
  fi
done
res="$out/results.jsonl"; : > "$res"
for r in $(seq 1 "$rounds"); do
  for c in "${commits[@]}"; do
    echo "bench_commits: round $r/$rounds, $c" >&2
    j=$("$out/$c/build/mlxcel" bench -m "$model" "${args[@]}" --json 2>/dev/null)
    echo "{\"commit\":\"$c\",\"round\":$r,\"bench\":$j}" >> "$res"
  done
done
printf '| commit | prefill tok/s | decode tok/s | fused / gather |\n| --- | --- | --- | --- |\n'
for c in "${commits[@]}"; do
  jq -rs --arg c "$c" '
    [.[] | select(.commit == $c) | .bench] as $b
    | def med(f): ([$b[] | f] | sort) as $s | $s[($s | length) / 2 | floor];
      def rng(f): ([$b[] | f] | min | . * 10 | round / 10 | tostring) + "–" + ([$b[] | f] | max | . * 10 | round / 10 | tostring);
    "| \($c) | \(med(.prefill_tok_s) * 10 | round / 10) (\(rng(.prefill_tok_s))) | \(med(.decode_tok_s) * 10 | round / 10) (\(rng(.decode_tok_s))) | \(if $b[0].fused_over_gather then (med(.fused_over_gather) * 100 | round / 100 | tostring) else "-" end) |"' "$res"
done
