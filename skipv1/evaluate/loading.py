"""Loading the checkpoints to compare: config checks first (cheap, one-line errors), then weights."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..checkpoint_info import check_supported
from ..errors import SkipV1Error

if TYPE_CHECKING:
    from ..convert.api import Source


@dataclass
class LoadedModel:
    path: str
    model: torch.nn.Module
    tokenizer: object


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SkipV1Error("--device cuda but no CUDA device is visible: use --device cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA, float32 on CPU (where bf16 matmuls are slow)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def check_model(spec: "str | Path") -> tuple["Source", dict]:
    """Where a model given as convert takes its source is (a directory, a .gguf file,
    builtin:smollm2, a Hub id), and its config, validated with its weight files' headers; run for
    every model before any weights are read, so that a bad last model fails the run at once
    rather than after the others were measured."""
    from ..convert.api import locate_source, source_config
    from ..convert.reader import scan_weights

    source = locate_source(spec)
    config = source_config(source)
    check_supported(config)
    if not source.is_gguf:
        scan_weights(source.path)  # every shard's header, as convert checks them
    return source, config


def max_positions(config: dict) -> int:
    return int(config.get("max_position_embeddings") or 2**31)


def load_model(source: "Source", device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """The model and its tokenizer; a GGUF dequantized as it loads (nothing written to disk)."""
    from ..auto_classes import register

    register()  # the SkipV1 classes with the Auto classes (done already if transformers was)
    if source.is_gguf:  # check_model read it already: transformers' loader accepts the file
        from ..smollm2 import load_gguf

        model, tokenizer = load_gguf(source.path, dtype=dtype)
    else:
        model, tokenizer = _load_directory(source, dtype)
    model.to(device).eval()
    return LoadedModel(source.label, model, tokenizer)


def _load_directory(source: "Source", dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"{source.label} has no usable tokenizer ({_first_line(err)}): copy the source "
            "checkpoint's tokenizer files next to the weights"
        ) from None
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"cannot load the weights of {source.label}: {_first_line(err)}"
        ) from None
    return model, tokenizer


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
