#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan/UBSan, the library instrumented
# too) and runs each for a bounded time, one after another.
#   scripts/fuzz.sh [seconds-per-target] [target...]   (default 30, all targets)
# Environment: MLXCEL_FUZZ_RUNS=N runs N inputs per target with a fixed
# seed (the same inputs every time, as CI needs; the seconds stay a cap),
# MLXCEL_FUZZ_BUILD (build folder, default build-fuzz),
# MLXCEL_FIXTURES (reference fixtures: more seeds and tokenizers; default
# ../shared/fixtures when it exists).  Corpora live under
# <build>/corpus/<target>, seeded by fuzz/seeds.py and kept between runs.
# A crash or hang leaves its input in <build>/artifacts/ and makes this
# script fail; copy it to fuzz/regress/<target>/ with the fix (ctest replays
# those inputs in every build).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
shift || true
if [ -z "${MLXCEL_FIXTURES:-}" ] && [ -d ../shared/fixtures ]; then
  export MLXCEL_FIXTURES="$(cd ../shared/fixtures && pwd)"
fi
B="${MLXCEL_FUZZ_BUILD:-build-fuzz}"
CC=clang cmake -S . -B "$B" -DMLXCEL_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
cmake --build "$B" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$B/artifacts"
python3 fuzz/seeds.py "$B"

limit=()
[ -n "${MLXCEL_FUZZ_RUNS:-}" ] && limit=(-runs="$MLXCEL_FUZZ_RUNS" -seed=1)
rc=0
for t in "${targets[@]}"; do
  dict=()
  [ -f "$B/$t.dict" ] && dict=("-dict=$B/$t.dict")
  mkdir -p "$B/corpus/$t"
  echo "fuzz: $t for ${secs}s" >&2
  # -timeout: an input that takes over 10 s is a hang (a finding);
  # -rss_limit_mb: the Jinja engine may use up to 512 MB for one render.
  if ! "$B/$t" "$B/corpus/$t" "${dict[@]}" "${limit[@]}" -max_total_time="$secs" -max_len=65536 \
       -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$B/artifacts/$t-" \
       -print_final_stats=1 2> "$B/$t.log"; then
    echo "fuzz: $t FAILED; see $B/$t.log and $B/artifacts/" >&2
    tail -40 "$B/$t.log" >&2
    rc=1
  else
    # the last status line (executions, coverage) and the execution count
    grep -E "^#[0-9]+" "$B/$t.log" | tail -1 >&2
    grep -E "stat::number_of_executed_units" "$B/$t.log" >&2
  fi
done
exit $rc
