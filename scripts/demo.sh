#!/usr/bin/env bash
# The README's first command: installs dependencies, builds build/mlxcel and
# generates from the bundled demo model models/kjv-moe (a 16 M-parameter
# qwen2_moe trained on the King James Bible, 4-bit MLX; see its README.md),
# greedily, so the text is the same on every run.
# For speed work on real model shapes, `mlxcel synth --preset tiny` (or a
# real preset) writes random-weight checkpoints: see README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
MODEL=${MLXCEL_DEMO_MODEL:-models/kjv-moe}
./build/mlxcel inspect -m "$MODEL"
echo "--- generate (greedy; a small MoE trained on the King James Bible) ---" >&2
PROMPT="And God said"
printf '%s' "$PROMPT"   # the continuation below follows it on the same line
./build/mlxcel generate -m "$MODEL" -p "$PROMPT" -n 64 --temp 0 --stats
echo
