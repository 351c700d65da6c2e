#!/usr/bin/env bash
# test_synth_cli.sh - `mlxcel synth` from the command line: --help lists the
# presets with sizes and RAM fit, a tiny checkpoint is written with progress
# on stderr, loads (inspect) and generates, a non-empty directory is refused
# without --force, --shard-mb gives an indexed multi-shard checkpoint, and
# bad options exit 2 with a message.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
if [ ! -x "$BIN" ]; then
    echo "SKIP: $BIN not built"
    exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mlxcel_synth_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$1"; fi; }

# --help: every preset, a size, and whether it fits in RAM
"$BIN" synth --help >"$TMP/help" 2>&1
check '[ $? -eq 0 ]'
for p in tiny qwen1.5-moe-a2.7b olmoe-1b-7b qwen3-30b-a3b mixtral-8x7b dots.llm1 phi-3.5-moe \
    qwen3-vl-30b-a3b minimax-m2 gemma-4-26b-a4b qwen3-next-80b-a3b lfm2-8b-a1b; do
    check "grep -q '^  $p ' '$TMP/help'"
done
check "grep -A2 '^  mixtral-8x7b' '$TMP/help' | grep -q 'GB on disk, does NOT fit'"
check "grep -A2 '^  qwen1.5-moe-a2.7b' '$TMP/help' | grep -q 'GB on disk, fits in RAM'"
check "grep -A2 '^  minimax-m2 ' '$TMP/help' | grep -q 'GB on disk, does NOT fit'"
check "grep -A2 '^  lfm2-8b-a1b ' '$TMP/help' | grep -q 'GB on disk, fits in RAM'"
# sizes follow --bits
"$BIN" synth --help --bits 8 >"$TMP/help8" 2>&1
check "grep -q 'at 8-bit' '$TMP/help8'"
check "! cmp -s '$TMP/help' '$TMP/help8'"

# a tiny checkpoint, with progress on stderr
"$BIN" synth --preset tiny --out "$TMP/tiny" 2>"$TMP/err"
check '[ $? -eq 0 ]'
check "grep -q '100%' '$TMP/err'"
check "grep -q 'MB/s' '$TMP/err'"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
    check "[ -s '$TMP/tiny/$f' ]"
done
"$BIN" inspect -m "$TMP/tiny" >"$TMP/inspect" 2>&1
check '[ $? -eq 0 ]'
check "grep -q 'qwen2_moe' '$TMP/inspect'"
"$BIN" generate -m "$TMP/tiny" -p "Hello world" -n 8 --temp 0 --ignore-eos --ids-only \
    >"$TMP/ids" 2>"$TMP/gerr"
check '[ $? -eq 0 ]'
check "[ \$(wc -w <'$TMP/ids') -eq 8 ]"

# a scaled-down variant: the first layers of a preset's shape
"$BIN" synth --preset gemma4-tiny --layers 2 --out "$TMP/g2" --quiet
check '[ $? -eq 0 ]'
"$BIN" inspect -m "$TMP/g2" --json >"$TMP/g2.json" 2>&1
check "grep -q '\"num_hidden_layers\":[[:space:]]*2,' '$TMP/g2.json'"
"$BIN" synth --preset gemma4-tiny --layers 0 --out "$TMP/g0" --quiet 2>"$TMP/err"
check '[ $? -eq 2 ]'
check "grep -q -- '--layers' '$TMP/err'"

# the same seed gives the same bytes; another seed other bytes
"$BIN" synth --preset tiny --out "$TMP/tiny2" --quiet
check "cmp -s '$TMP/tiny/model.safetensors' '$TMP/tiny2/model.safetensors'"
"$BIN" synth --preset tiny --out "$TMP/tiny3" --quiet --seed 5
check "! cmp -s '$TMP/tiny/model.safetensors' '$TMP/tiny3/model.safetensors'"

# a non-empty directory is refused without --force, replaced with it
"$BIN" synth --preset tiny --out "$TMP/tiny" --quiet 2>"$TMP/err"
check '[ $? -ne 0 ]'
check "grep -q 'force' '$TMP/err'"
"$BIN" synth --preset tiny --out "$TMP/tiny" --quiet --force --layout stacked --bits 3
check '[ $? -eq 0 ]'
check "grep -q 'switch_mlp' <(\"$BIN\" inspect -m '$TMP/tiny' 2>&1) || grep -q 'stacked' <(\"$BIN\" inspect -m '$TMP/tiny' 2>&1)"

# shards + index
"$BIN" synth --preset tiny --out "$TMP/sharded" --quiet --shard-mb 0.2
check '[ $? -eq 0 ]'
check "[ -s '$TMP/sharded/model.safetensors.index.json' ]"
check "[ -s '$TMP/sharded/model-00001-of-00004.safetensors' ] || [ -s '$TMP/sharded/model-00001-of-00005.safetensors' ]"
check "[ ! -e '$TMP/sharded/model.safetensors' ]"
"$BIN" generate -m "$TMP/sharded" -p "Hello" -n 4 --temp 0 --ids-only >/dev/null 2>&1
check '[ $? -eq 0 ]'

# bad options: exit 2 and a message
for args in "--preset nope --out $TMP/x" "--preset tiny" "--preset tiny --out $TMP/x --bits 7" \
            "--preset tiny --out $TMP/x --group-size 48" "--preset tiny --out $TMP/x --layout x" \
            "--preset tiny --out $TMP/x --scale-dtype f8" "--preset tiny --out $TMP/x --shard-gb -1" \
            "--preset tiny --out $TMP/x --frobnicate"; do
    "$BIN" synth $args >/dev/null 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 2 ] && [ -s "$TMP/err" ]; then ok; else bad "synth $args: rc $rc"; fi
done
check "[ ! -e '$TMP/x/model.safetensors' ]"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
