#!/usr/bin/env bash
# Side-by-side speed: mlxcel against llama.cpp's and ik_llama.cpp's
# llama-bench on the same machine, alternating, N rounds, with the
# machine's read bandwidth probed in every round (mlxcel bench probes
# around its decode).  Prints each round and a table of ratios
# (mlxcel / llama.cpp, mlxcel / ik_llama.cpp) with median, min and max:
# speed claims are these ratios, never absolute numbers from elsewhere.
#
#   tools/vs_llamacpp.sh [--llama PATH/llama-bench] [--ik PATH/llama-bench]
#       --gguf MODEL.gguf --model MLX_DIR [--rounds 3] [--threads 2]
#       [--pp 128,512] [--tg 64] [--precision exact|fast] [--out FILE.jsonl]
#
# The GGUF and the MLX checkpoint must have the same shape (e.g. the
# qwen1.5-moe-a2.7b synth preset and a Q4_0 GGUF of that shape written by
# make_gguf.py or tools/gguf_synth.py; see docs/benchmarks.md).  At least
# one of --llama and --ik (a llama.cpp older than April 2025 cannot load
# the qwen3moe shape: leave it out there).  llama.cpp and ik_llama.cpp are
# built by the user from their own source trees (nothing of theirs is in
# this repository).  ik_llama.cpp runs with -rtr 1 (run-time repacking, its
# best CPU layout).  Needs jq.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
MLX=${MLXCEL_BIN:-$here/build/mlxcel}
LLAMA= IK= GGUF= MODEL= ROUNDS=3 THREADS=2 PP=128,512 TG=64 PREC=exact OUT=
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --llama) LLAMA=$2; shift 2 ;;
    --ik) IK=$2; shift 2 ;;
    --gguf) GGUF=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --pp) PP=$2; shift 2 ;;
    --tg) TG=$2; shift 2 ;;
    --precision) PREC=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "vs_llamacpp: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$LLAMA$IK" ] && [ -n "$GGUF" ] && [ -n "$MODEL" ] || { usage >&2; exit 2; }
for f in ${LLAMA:+"$LLAMA"} ${IK:+"$IK"} "$MLX"; do [ -x "$f" ] || { echo "vs_llamacpp: $f is not executable" >&2; exit 2; }; done
[ -f "$GGUF" ] || { echo "vs_llamacpp: no GGUF at $GGUF" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "vs_llamacpp: no checkpoint at $MODEL" >&2; exit 2; }
command -v jq > /dev/null || { echo "vs_llamacpp: jq is needed" >&2; exit 2; }
OUT=${OUT:-$(mktemp /tmp/vs_llamacpp.XXXXXX.jsonl)}
: > "$OUT"
echo "vs_llamacpp: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs), $THREADS threads, $ROUNDS rounds, records in $OUT" >&2

# one llama-bench run: {"pp128": tok/s, ..., "tg64": tok/s}
lb() {
  "$@" -m "$GGUF" -t "$THREADS" -p "$PP" -n "$TG" -r 1 -o json 2> /dev/null |
    jq -c 'map({key: (if .n_gen > 0 then "tg\(.n_gen)" else "pp\(.n_prompt)" end), value: .avg_ts}) | from_entries'
}
# mlxcel: one bench per prompt length (decode measured with the first)
mx() {
  local r="{}" first=1
  for p in ${PP//,/ }; do
    local j
    j=$("$MLX" bench -m "$MODEL" -p "$p" -n "$TG" -r 1 -t "$THREADS" --precision "$PREC" --json 2> /dev/null)
    r=$(jq -c --argjson j "$j" --arg p "$p" --arg g "$TG" --argjson f "$first" \
          '. + {("pp" + $p): $j.prefill_tok_s} + (if $f == 1 then {("tg" + $g): $j.decode_tok_s, bw_gbs: $j.mem_bw_gbs, bytes_per_token: $j.weight_bytes_per_token} else {} end)' <<< "$r")
    first=0
  done
  echo "$r"
}
# Each program's weights are read into the page cache before its run (not
# timed): two 8 GB checkpoints plus ik_llama.cpp's repacked copy in
# anonymous memory do not all fit in 24 GiB, and a run that pages its
# weights from disk would measure the disk.
precache() { cat "$@" > /dev/null; }
# The weight cache is read the way a run maps it, in 2 MiB folios
# (tools/precache_huge.py: a plain read leaves small folios, which the run
# then maps 4 KiB at a time; decode measured 1.4-1.6x slower that way).
precache_wcache() {
  if command -v python3 > /dev/null; then python3 "$here/tools/precache_huge.py" "$@" 2> /dev/null
  else precache "$@"; fi
}
# mlxcel's weight cache (on by default on AVX-512 VNNI CPUs, docs/cache.md)
# is built once here, not in a timed run, and read into the page cache
# with the checkpoint before each of mlxcel's runs.
"$MLX" generate -m "$MODEL" --prompt-ids 1 -n 1 --temp 0 > /dev/null 2>&1 || true
WCACHE=$("$MLX" inspect -m "$MODEL" 2>&1 | sed -n 's/^weight cache: \(\/[^ ]*\.mlxw\)[: ].*/\1/p' | head -1)
[ -f "$WCACHE" ] && echo "vs_llamacpp: mlxcel reads its weight cache $WCACHE" >&2 || WCACHE=
for ((i = 1; i <= ROUNDS; i++)); do
  precache "$GGUF"
  a=$( [ -n "$LLAMA" ] && lb "$LLAMA" || echo '{}')
  b=$( [ -n "$IK" ] && lb "$IK" -rtr 1 || echo '{}')
  precache "$MODEL"/*.safetensors
  [ -z "$WCACHE" ] || precache_wcache "$WCACHE"
  c=$(mx)
  rec=$(jq -cn --argjson a "$a" --argjson b "$b" --argjson c "$c" --arg i "$i" \
          '{round: ($i | tonumber), llama: $a, ik: $b, mlxcel: $c}')
  echo "$rec" >> "$OUT"
  echo "round $i: $rec" >&2
done

# ratios per round, then median / min / max over the rounds
jq -s -r --arg tg "tg$TG" --arg pp "$PP" '
  def stats: sort | {min: .[0], med: .[(length - 1) / 2 | floor], max: .[-1]};
  def fmt: "\(.med * 1000 | round / 1000) (\(.min * 1000 | round / 1000)-\(.max * 1000 | round / 1000))";
  (($pp | split(",") | map("pp" + .)) + [$tg]) as $keys
  | "| test | mlxcel tok/s | llama.cpp | ik_llama.cpp | mlxcel / llama.cpp | mlxcel / ik_llama.cpp |",
    "| --- | --- | --- | --- | --- | --- |",
    ($keys[] as $k
     | [ .[] | .mlxcel[$k] ] as $m | [ .[] | .llama[$k] ] as $l | [ .[] | .ik[$k] ] as $q
     | "| \($k) | \($m | stats | fmt) | \(if ($l | map(select(. != null)) | length) > 0 then ($l | stats | fmt) else "-" end) | \(if ($q | map(select(. != null)) | length) > 0 then ($q | stats | fmt) else "-" end) | \(if ($l | map(select(. != null)) | length) > 0 then ([ range(0; length) as $r | $m[$r] / $l[$r] ] | stats | fmt) else "-" end) | \(if ($q | map(select(. != null)) | length) > 0 then ([ range(0; length) as $r | $m[$r] / $q[$r] ] | stats | fmt) else "-" end) |"),
    "",
    "decode roofline (mlxcel tg tok/s x weight bytes per token / probed read bandwidth): \([ .[] | .mlxcel[$tg] * .mlxcel.bytes_per_token / (.mlxcel.bw_gbs * 1e9) ] | stats | fmt)"
' "$OUT"
