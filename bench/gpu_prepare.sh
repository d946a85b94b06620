#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for bench/gpu_check.sh on a lent GPU machine that reaches no
# package index and cannot take the 93 MB GGUF package: wheels for its Python (3.12) of what
# the project needs beyond that image's packages, and SmolLM2-135M's config and tokenizer
# (gpu_check.py --source gives them seeded random weights). Then, on the device, with `.gpu`
# carried: WHEELS=.gpu/whl PY=python3 bash bench/gpu_check.sh --source .gpu/smollm2 --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >>.git/info/exclude; }
mkdir -p .gpu/whl
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]/#/--platform=}" -d .gpu/whl \
    transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 typing_extensions==4.16.0 \
    regex==2026.11.19 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 \
    typing_inspection==0.4.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 \
    fsspec==2026.9.0
# DeepSpeed ships only a source archive; its wheel is pure Python (ops build at run time)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .gpu/whl deepspeed==0.19.8
"$PY" - <<'PYEOF'
from transformers import AutoConfig, AutoTokenizer

from skipv1.smollm2 import smollm2_gguf_path

gguf = smollm2_gguf_path()
for auto in (AutoConfig, AutoTokenizer):
    auto.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(".gpu/smollm2")
PYEOF
du -sh .gpu
