#!/usr/bin/env bash
# The GPU check: on a CUDA machine with the project installed (`make install`), from the
# repository root. About 5 minutes on one H200; writes docs/results/gpu.md (arguments go to
# bench/gpu_check.py). On a machine with no package index, WHEELS=DIR installs the wheels
# in DIR (no dependencies resolved: bring every one missing there) into /tmp/site and runs
# the project from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
"$PY" bench/gpu_check.py "$@"
