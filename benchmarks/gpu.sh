#!/usr/bin/env bash
# CUDA checks for the interventions, for when a GPU is lent: the `cuda`-marked tests, then the
# intervention benchmark in float32 and bfloat16 (results/interventions_cuda_<dtype>.json).
#   bash benchmarks/gpu.sh            (PYTHON=/path/to/python to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
"$PY" -m pytest -q -m cuda tests/
for dtype in float32 bfloat16; do
  "$PY" benchmarks/interventions.py --device cuda --dtype "$dtype" --reps 21 --warmup 3
done
