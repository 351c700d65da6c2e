#!/usr/bin/env bash
# test_dist_memlimit.sh - a model that does not fit one process's memory
# limit runs across ranks on one host (expert parallelism, src/dist).
#
# synth writes OLMoE-1B-7B's shape cut to 4 layers (1.0 GiB of weights) into
# a temporary directory.  With the address space limited (ulimit -v) to 90%
# of the checkpoint's size, one process cannot map its weights and fails
# with a message naming the file; under mpirun -np 2 and -np 3 each rank
# maps only its share (half or a third of the experts, plus attention,
# embeddings and lm_head on rank 0), so the same limit per process leaves
# room for Open MPI's own mappings, and the greedy ids equal an unlimited
# single-process run.
#
# Skips (77) without MPI in the build or mpirun, and under the sanitizers
# (ASan reserves terabytes of address space for its shadow memory).
set -u
export LC_ALL=C.UTF-8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} MLXCEL_THREADS=1
# Ranks keep the checkpoint's layout (a share of a model has no weight
# cache); the one-process runs they are compared with bit for bit must too.
export MLXCEL_REPACK=off
[ "${MLXCEL_MPI:-}" = ON ] || { echo "SKIP: built without MPI (-DMLXCEL_MPI=OFF or no MPI found)"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIP: mpirun is not installed (scripts/deps.sh: openmpi-bin)"; exit 77; }
[ "${MLXCEL_SANITIZE:-}" = ON ] &&
  { echo "SKIP: an address-space limit cannot hold a sanitized build (ASan's shadow memory)"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none -x MLXCEL_THREADS -x OMP_WAIT_POLICY -x MLXCEL_REPACK)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M=$T/olmoe4
"$BIN" synth --preset olmoe-1b-7b --layers 4 --out "$M" --quiet || { echo "FAIL: synth"; exit 1; }
bytes=$(stat -c %s "$M/model.safetensors")
limit_kb=$((bytes / 1024 * 9 / 10))
echo "checkpoint $((bytes >> 20)) MiB; every process limited to $((limit_kb >> 10)) MiB of address space"
GEN=(generate -m "$M" --prompt-ids 1,2,3,4,5 -n 6 --temp 0 --ids-only --ctx-size 64)

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

"$BIN" "${GEN[@]}" >"$T/ids" 2>"$T/alone.err"
[ -s "$T/ids" ] || { echo "FAIL: the unlimited single-process run:"; cat "$T/alone.err"; exit 1; }

# one process under the limit: fails, naming the file it could not map
(ulimit -v "$limit_kb" && exec "$BIN" "${GEN[@]}") >"$T/one.out" 2>"$T/one.err"
rc=$?
if [ $rc -ne 0 ] && grep -q "model.safetensors: mmap" "$T/one.err"; then
  ok; echo "one process: exit $rc: $(head -1 "$T/one.err")"
else
  bad "one process under the limit: exit $rc, ids '$(cat "$T/one.out")'"; cat "$T/one.err" >&2
fi

# 2 and 3 ranks, each under the same limit: the ids of the unlimited run
for np in 2 3; do
  (ulimit -v "$limit_kb" && exec timeout 300 "${MPIRUN[@]}" -np $np "$BIN" "${GEN[@]}") >"$T/ids$np" 2>"$T/np$np.err"
  rc=$?
  if [ $rc -eq 0 ] && cmp -s "$T/ids" "$T/ids$np"; then
    ok; echo "mpirun -np $np under the limit: $(cat "$T/ids$np") (as alone)"
  else
    bad "mpirun -np $np under the limit: exit $rc, ids '$(cat "$T/ids$np")' vs '$(cat "$T/ids")'"
    tail -20 "$T/np$np.err" >&2
  fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
