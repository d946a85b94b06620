#!/usr/bin/env bash
# The GPU check: on a CUDA machine with the project installed (`make install`), from the
# repository root. Under 8 minutes on one H100/H200; writes docs/results/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
"$PY" bench/gpu_check.py --device cuda "$@"
