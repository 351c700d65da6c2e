#!/usr/bin/env bash
# The README's first command: installs dependencies, builds build/mlxcel,
# writes the small built-in demo checkpoint (random weights) with
# `mlxcel synth --preset tiny`, inspects it and generates from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
if [ ! -f models/tiny/config.json ]; then
  ./build/mlxcel synth --preset tiny --out models/tiny --seed 1
fi
./build/mlxcel inspect -m models/tiny
echo "--- generate (random weights: the text is gibberish, the machinery is real) ---" >&2
./build/mlxcel generate -m models/tiny -p "Hello, mixture of experts!" -n 32 --temp 0 --stats
echo
