#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite twice: a normal
# Release build, then an ASan+UBSan build.  Tests that need the reference
# fixtures read MLXCEL_FIXTURES and skip (with a message) when it is unset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ -z "${MLXCEL_FIXTURES:-}" ] && [ -d ../shared/fixtures ]; then
  export MLXCEL_FIXTURES="$(cd ../shared/fixtures && pwd)"
fi
[ -n "${MLXCEL_FIXTURES:-}" ] && echo "test: fixtures at $MLXCEL_FIXTURES" >&2 ||
  echo "test: MLXCEL_FIXTURES unset: fixture tests will be skipped" >&2
jobs=$(nproc)
# Tests run side by side (ctest -j): OpenMP threads that spin while waiting
# would fight each other for the cores, so tests wait passively.  Benchmarks
# do not set this.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The weight cache is on by default (auto on an AVX-512 VNNI CPU): the
# tests' cache files go to a folder of the build, not to ~/.cache.
export MLXCEL_CACHE_DIR=${MLXCEL_CACHE_DIR:-$PWD/build/test-weight-cache}
rm -rf "$PWD/build/test-weight-cache"
# Expert parallelism over MPI is built in (deps.sh installed Open MPI), so
# that tests/test_dist.sh runs its two- and three-rank tests rather than
# skipping; configure fails if MPI cannot be found.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMLXCEL_MPI=ON >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")
# Sanitizer build: clang so both compilers stay -Werror clean.
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMLXCEL_SANITIZE=ON -DMLXCEL_MPI=ON >/dev/null
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  MLXCEL_SANITIZED=1 ctest --output-on-failure -j "$jobs")
# Every fuzz target (fuzz/), built with clang's libFuzzer and run briefly
# so that none of them rots: a fixed number of inputs from a fixed seed, so
# a run finds the same things every time (at most 30 s a target);
# `bash scripts/fuzz.sh N` runs them longer.
MLXCEL_FUZZ_RUNS=${MLXCEL_FUZZ_RUNS:-5000} bash scripts/fuzz.sh 30
