#!/usr/bin/env bash
# Builds the libFuzzer targets (clang) and runs each for a bounded time.
#   scripts/fuzz.sh [seconds-per-target]   (default 30)
# Corpora live under build-fuzz/corpus/<target>; they are seeded from the
# fixture files when MLXCEL_FIXTURES is set and kept between runs.  A crash
# leaves its input in build-fuzz/artifacts/ and makes this script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
if [ -z "${MLXCEL_FIXTURES:-}" ] && [ -d ../shared/fixtures ]; then
  export MLXCEL_FIXTURES="$(cd ../shared/fixtures && pwd)"
fi
# The library is instrumented too (coverage feedback and ASan/UBSan inside
# the parsers), not only the fuzz entry points.
CC=clang cmake -S . -B build-fuzz -DMLXCEL_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  >/dev/null
targets=()
for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"

B=build-fuzz
mkdir -p "$B/artifacts" "$B/corpus/fuzz_safetensors" "$B/corpus/fuzz_config"

# Seeds that need no fixtures: a minimal valid file and an empty header.
seed_st() {  # name json [data-bytes]
  local n=${#2}
  { printf "$(printf '\\x%02x' $((n & 255)) $((n >> 8 & 255)) 0 0 0 0 0 0)"
    printf '%s' "$2"; printf '%s' "${3:-}"; } > "$B/corpus/fuzz_safetensors/$1"
}
seed_st seed_min '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 'abcdefgh'
seed_st seed_meta '{"__metadata__":{"format":"mlx"},"b":{"dtype":"U8","shape":[1,3],"data_offsets":[0,3]},"c":{"dtype":"BF16","shape":[],"data_offsets":[3,5]}}' 'xyzwv'
seed_st seed_empty '{}'
printf '{"model_type":"qwen2_moe","hidden_size":8,"rope_parameters":{"rope_type":"default","rope_theta":10000.0},"eos_token_id":[1,2],"sliding_window":null,"quantization":{"group_size":64,"bits":4,"lm_head":false,"m.gate":{"bits":8}}}' \
  > "$B/corpus/fuzz_config/seed_min.json"

if [ -n "${MLXCEL_FIXTURES:-}" ]; then
  for d in "$MLXCEL_FIXTURES"/*/; do
    name=$(basename "$d")
    for j in "$d"*.json; do
      [ -f "$j" ] || continue
      case "$j" in */tokenizer*.json) continue ;; esac
      cp "$j" "$B/corpus/fuzz_config/${name}_$(basename "$j")"
    done
    for s in "$d"*.safetensors; do
      [ -f "$s" ] || continue
      # Header plus a little data keeps seeds small (whole files are MBs).
      hlen=$(od -An -tu8 -N8 "$s" | tr -d ' ')
      head -c $((8 + hlen + 64)) "$s" > "$B/corpus/fuzz_safetensors/${name}_$(basename "$s")"
    done
  done
fi

# Dictionaries steer mutations toward the keys the parsers look at.
cat > "$B/safetensors.dict" <<'DICT'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"F16\""
"\"BF16\""
"\"U32\""
"\"I64\""
"\"BOOL\""
"18446744073709551615"
"9007199254740993"
"-1"
"1e308"
DICT
cat > "$B/config.dict" <<'DICT'
"\"quantization\""
"\"quantization_config\""
"\"group_size\""
"\"bits\""
"\"rope_parameters\""
"\"rope_scaling\""
"\"rope_theta\""
"\"eos_token_id\""
"\"num_local_experts\""
"\"mlp_only_layers\""
"\"sliding_window\""
"null"
"false"
"true"
DICT

mkdir -p "$B/corpus/fuzz_toolcall"
printf '%s' $'\x04Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, "}"]}}\n</tool_call>' \
  > "$B/corpus/fuzz_toolcall/seed_hermes"
printf '%s' $'\x07[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "abcDEF123"}]' \
  > "$B/corpus/fuzz_toolcall/seed_mistral"
cat > "$B/toolcall.dict" <<'DICT'
"<tool_call>"
"</tool_call>"
"[TOOL_CALLS]"
"\"name\""
"\"arguments\""
"\"parameters\""
"\"id\""
DICT

rc=0
for t in "${targets[@]}"; do
  dict=""
  case "$t" in
    fuzz_safetensors) dict="-dict=$B/safetensors.dict" ;;
    fuzz_config) dict="-dict=$B/config.dict" ;;
    fuzz_toolcall) dict="-dict=$B/toolcall.dict" ;;
  esac
  mkdir -p "$B/corpus/$t"
  echo "fuzz: $t for ${secs}s" >&2
  if ! "$B/$t" "$B/corpus/$t" $dict -max_total_time="$secs" -max_len=65536 \
       -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$B/artifacts/$t-" \
       -print_final_stats=1 2> "$B/$t.log"; then
    echo "fuzz: $t FAILED; see $B/$t.log and $B/artifacts/" >&2
    tail -40 "$B/$t.log" >&2
    rc=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$B/$t.log" | tail -2 >&2
  fi
done
exit $rc
