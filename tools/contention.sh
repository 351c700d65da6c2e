#!/usr/bin/env bash
# contention.sh - decode speed alone and beside one busy process on the same
# CPUs, for one or more mlxcel builds, alternating, so the ratio says what a
# shared machine costs.  Prints one line per build and round:
#   BUILD round R: alone D tok/s, beside a busy process C tok/s (D/C slower)
#
# usage: tools/contention.sh -m MODEL [-n TOKENS] [-r ROUNDS] [--cpus LIST] BIN [BIN...]
#   -m MODEL      checkpoint directory
#   -n TOKENS     decoded tokens per repeat (default 24)
#   -r ROUNDS     alternating rounds (default 2)
#   --cpus LIST   CPUs for both mlxcel and the busy process (default 0,1)
# Environment such as MLXCEL_SPIN_US passes through to the builds.
set -u
model="" n=24 rounds=2 cpus=0,1
bins=()
while [ $# -gt 0 ]; do
    case $1 in
    -m) model=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bins+=("$1"); shift ;;
    esac
done
if [ -z "$model" ] || [ ${#bins[@]} -eq 0 ]; then
    echo "usage: tools/contention.sh -m MODEL [-n TOKENS] [-r ROUNDS] [--cpus LIST] BIN [BIN...]" >&2
    exit 2
fi
for tool in taskset python3 yes; do
    command -v $tool >/dev/null || { echo "contention.sh: $tool is needed" >&2; exit 2; }
done
threads=$(echo "$cpus" | tr ',' '\n' | wc -l)
decode() {   # BIN -> decode tok/s
    taskset -c "$cpus" "$1" bench -m "$model" -t "$threads" -p 16 -n "$n" -r 3 --bw-mb 0 --json 2>/dev/null |
        python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["decode_tok_s"])'
}
busy=""
trap '[ -n "$busy" ] && kill $busy 2>/dev/null' EXIT
for r in $(seq 1 "$rounds"); do
    for b in "${bins[@]}"; do
        alone=$(decode "$b")
        taskset -c "$cpus" yes >/dev/null &
        busy=$!
        sleep 0.2
        shared=$(decode "$b")
        kill $busy; wait $busy 2>/dev/null; busy=""
        ratio=$(python3 -c "print('%.2f' % ($alone / $shared))" 2>/dev/null || echo "?")
        echo "$b round $r: alone $alone tok/s, beside a busy process $shared tok/s (${ratio}x slower)"
    done
done
