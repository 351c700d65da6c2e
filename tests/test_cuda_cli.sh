#!/bin/bash
# test_cuda_cli.sh - `--device` on the command line: an unknown device and
# (in a build without CUDA, or with no GPU) cuda are clear errors; with a
# GPU, greedy generation on the demo model gives the CPU's text.
set -u
BIN=${MLXCEL_BIN:?MLXCEL_BIN unset}
SRC=${MLXCEL_SRC:?MLXCEL_SRC unset}
M=$SRC/models/kjv-moe
fail=0
out=$("$BIN" generate -m "$M" -p "In the beginning" -n 4 --temp 0 --device tpu 2>&1)
if [ $? -eq 0 ] || ! grep -q "unknown device 'tpu'" <<<"$out"; then
    echo "FAIL: --device tpu: $out"; fail=1
fi
gpu=$("$BIN" generate -m "$M" -p "In the beginning" -n 24 --temp 0 --device cuda 2>/tmp/cuda_cli_err.$$)
rc=$?
err=$(cat /tmp/cuda_cli_err.$$); rm -f /tmp/cuda_cli_err.$$
if [ $rc -ne 0 ]; then
    if grep -q "no CUDA backend\|no CUDA GPU is usable" <<<"$err"; then
        echo "$err" | tail -1
        [ $fail -eq 0 ] && { echo "SKIP: no GPU here (the error above is the expected one)"; exit 77; }
        exit 1
    fi
    echo "FAIL: --device cuda: $err"; exit 1
fi
cpu=$("$BIN" generate -m "$M" -p "In the beginning" -n 24 --temp 0 2>/dev/null)
if [ "$gpu" != "$cpu" ]; then
    echo "FAIL: GPU text differs from the CPU's:"; echo "GPU: $gpu"; echo "CPU: $cpu"; fail=1
fi
env_out=$(MLXCEL_DEVICE=cuda "$BIN" generate -m "$M" -p "In the beginning" -n 24 --temp 0 2>/dev/null)
[ "$env_out" = "$gpu" ] || { echo "FAIL: MLXCEL_DEVICE=cuda differs from --device cuda"; fail=1; }
[ $fail -eq 0 ] && echo "ok: GPU and CPU agree: $gpu"
exit $fail
