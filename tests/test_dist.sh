#!/usr/bin/env bash
# test_dist.sh - expert parallelism over MPI (src/dist) on one host.
#
#  - dist_driver under mpirun -np 2 and -np 3: every fixture, fused on and
#    off, the same logits bit for bit as one process (prompt, greedy decode
#    through the cache, a batched step), greedy ids and last prompt logits
#    as the reference
#  - `mlxcel generate --ids-only` under mpirun equals the plain run, also
#    with an --expert-map that interleaves the ranks
#  - `mlxcel serve` under mpirun answers a greedy chat completion as alone
#  - a rank that cannot load its share (its copy of the checkpoint is
#    truncated; rank 1's or rank 0's own) or holds another checkpoint
#    (config.json differs): the job ends with a message naming the rank and
#    the tensor on every rank
#  - a rank killed under a running server ends the job (no hang)
#
# Each rank runs one thread (MLXCEL_THREADS=1) so three ranks fit two
# cores; shared memory only (--mca btl self,vader), as root in CI
# containers.  Skips (77) without MPI in the build, mpirun, or fixtures.
set -u
export LC_ALL=C.UTF-8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} MLXCEL_THREADS=1
# Ranks keep the checkpoint's layout (a share of a model has no weight
# cache); the one-process runs they are compared with bit for bit must too.
export MLXCEL_REPACK=off
[ "${MLXCEL_MPI:-}" = ON ] || { echo "SKIP: built without MPI (-DMLXCEL_MPI=OFF or no MPI found)"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIP: mpirun is not installed (scripts/deps.sh: openmpi-bin)"; exit 77; }
[ -n "${MLXCEL_FIXTURES:-}" ] || { echo "SKIP: MLXCEL_FIXTURES is not set"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
DRIVER=${MLXCEL_BUILD:?}/dist_driver
[ -x "$DRIVER" ] || { echo "FAIL: $DRIVER is missing"; exit 1; }
if [ "${MLXCEL_SANITIZE:-}" = ON ]; then
  # Open MPI's own allocations outlive MPI_Finalize: not ours to report
  export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none -x MLXCEL_THREADS -x OMP_WAIT_POLICY -x MLXCEL_REPACK)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
[ -n "${ASAN_OPTIONS:-}" ] && MPIRUN+=(-x ASAN_OPTIONS)

FIXTURES=(qwen2_moe_tiny_chat qwen2_moe_gqa_mixed qwen3_moe_tiny mixtral_tiny olmoe_tiny dots1_tiny
          phimoe_tiny qwen3_vl_moe_tiny minimax_tiny gemma4_tiny qwen3_next_tiny lfm2_moe_tiny)
F=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat

T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# 1. the driver: all fixtures, 2 and 3 ranks
for np in 2 3; do
  if timeout 600 "${MPIRUN[@]}" -np $np "$DRIVER" "$MLXCEL_FIXTURES" "${FIXTURES[@]}" >"$T/drv$np.out" 2>"$T/drv$np.err" &&
     grep -q ' 0 failed' "$T/drv$np.out"; then
    ok; echo "dist_driver -np $np: $(cat "$T/drv$np.out")"
  else
    bad "dist_driver -np $np:"; tail -30 "$T/drv$np.err" >&2; cat "$T/drv$np.out" >&2
  fi
done

# 2. the CLI: greedy ids under mpirun == alone
"$BIN" generate -m "$F" -p "The capital of France is" -n 16 --temp 0 --ids-only >"$T/ids1" 2>"$T/gen1.err"
for np in 2 3; do
  timeout 120 "${MPIRUN[@]}" -np $np "$BIN" generate -m "$F" -p "The capital of France is" -n 16 --temp 0 \
    --ids-only >"$T/ids$np" 2>"$T/gen$np.err"
  if [ -s "$T/ids1" ] && cmp -s "$T/ids1" "$T/ids$np"; then ok; else
    bad "generate -np $np: ids '$(cat "$T/ids$np")' vs alone '$(cat "$T/ids1")'"; tail -5 "$T/gen$np.err" >&2
  fi
done

# ... and with an expert map that interleaves the ranks (every MoE layer)
E=$(jq '.num_experts' "$F/config.json")
{ printf '*:'; for ((x = 0; x < E; x++)); do printf ' %d' $((x % 2)); done; echo; } >"$T/map"
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" generate -m "$F" -p "The capital of France is" -n 16 --temp 0 \
  --ids-only --expert-map "$T/map" >"$T/idsmap" 2>"$T/genmap.err"
if [ -s "$T/ids1" ] && cmp -s "$T/ids1" "$T/idsmap"; then ok; else
  bad "generate -np 2 --expert-map: ids '$(cat "$T/idsmap")' vs alone '$(cat "$T/ids1")'"; tail -5 "$T/genmap.err" >&2
fi

# 3. the server: one greedy chat completion, under mpirun and alone
start_server() {  # log file, then the launcher words
  local log=$1; shift
  "$@" "$BIN" serve -m "$F" --port 0 --ctx-size 512 2>"$log" &
  SPID=$!
  PIDS+=("$SPID")
  PORT=
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the server did not come up:" >&2
  cat "$log" >&2
  return 1
}
REQ='{"messages":[{"role":"user","content":"What is the capital of France?"}],"temperature":0,"max_tokens":12}'
answer() { curl -s -H 'Content-Type: application/json' -d "$REQ" "http://127.0.0.1:$PORT/v1/chat/completions" |
  jq -r '.choices[0].message.content'; }
if start_server "$T/serve1.log"; then
  answer >"$T/ans1"
  kill "$SPID"; wait "$SPID" 2>/dev/null
fi
if start_server "$T/serve2.log" "${MPIRUN[@]}" -np 2; then
  answer >"$T/ans2"
  # 5. a rank that dies ends the job: kill rank 1 (a child of mpirun)
  rank1=
  for st in /proc/[0-9]*/stat; do   # mpirun's children (no ps in a bare container)
    c=${st#/proc/}; c=${c%/stat}
    [ "$(sed 's/^.*) [^ ]* \([0-9]*\).*/\1/' "$st" 2>/dev/null)" = "$SPID" ] || continue
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && rank1=$c
  done
  if [ -n "$rank1" ]; then
    kill -9 "$rank1"
    for _ in $(seq 1 300); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SPID" 2>/dev/null; then bad "mpirun still runs 30 s after rank 1 was killed"; else ok; fi
  else
    bad "no rank 1 among mpirun's children"
  fi
  kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
fi
if [ -s "$T/ans1" ] && [ "$(cat "$T/ans1")" != null ] && cmp -s "$T/ans1" "$T/ans2"; then
  ok; echo "server under mpirun -np 2 answers as alone: $(cat "$T/ans2")"
else
  bad "server: '$(cat "$T/ans2" 2>/dev/null)' under mpirun vs '$(cat "$T/ans1" 2>/dev/null)' alone"
fi

# 4. a rank whose copy of the checkpoint is broken or another: rank 0 runs
#    in $T/a, rank 1 in $T/b, both load "ckpt" (relative, as on two hosts)
mkdir -p "$T/a" "$T/b"
Q=$MLXCEL_FIXTURES/qwen3_moe_tiny
cp -r "$Q" "$T/a/ckpt"
cp -r "$Q" "$T/b/ckpt"
rm -f "$T/a/ckpt/reference.safetensors" "$T/b/ckpt/reference.safetensors"
two_hosts() {  # runs generate with rank 0 in a/, rank 1 in b/; stderr of both in $1
  timeout 120 "${MPIRUN[@]}" -np 1 --wdir "$T/a" "$BIN" generate -m ckpt --prompt-ids 1,2,3 -n 4 --temp 0 \
    --ids-only : -np 1 --wdir "$T/b" "$BIN" generate -m ckpt >"$1.out" 2>"$1"
}
truncate -s -4096 "$T/b/ckpt/model.safetensors"
two_hosts "$T/trunc.err"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'rank 1 of 2 could not load its share' "$T/trunc.err")" -ge 2 ] &&
   grep 'rank 1 of 2' "$T/trunc.err" | grep -q "tensor '"; then
  ok; echo "a rank with a broken copy: $(grep -m1 'rank 1 of 2' "$T/trunc.err")"
else
  bad "a rank with a broken copy: exit $rc"; cat "$T/trunc.err" >&2
fi
cp "$Q/model.safetensors" "$T/b/ckpt/model.safetensors"
# ... and rank 0's own copy broken: every rank names rank 0
truncate -s -4096 "$T/a/ckpt/model.safetensors"
two_hosts "$T/trunc0.err"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'rank 0 of 2 could not load its share' "$T/trunc0.err")" -ge 2 ] &&
   grep 'rank 0 of 2' "$T/trunc0.err" | grep -q "tensor '"; then
  ok; echo "rank 0 with a broken copy: $(grep -m1 'rank 0 of 2' "$T/trunc0.err")"
else
  bad "rank 0 with a broken copy: exit $rc"; cat "$T/trunc0.err" >&2
fi
cp "$Q/model.safetensors" "$T/a/ckpt/model.safetensors"
sed -i 's/"rms_norm_eps"/ "rms_norm_eps"/' "$T/b/ckpt/config.json"
two_hosts "$T/other.err"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'is not the checkpoint rank 0 loaded' "$T/other.err")" -ge 2 ]; then
  ok; echo "a rank with another checkpoint: $(grep -m1 'rank 1 of 2' "$T/other.err")"
else
  bad "a rank with another checkpoint: exit $rc"; cat "$T/other.err" >&2
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
