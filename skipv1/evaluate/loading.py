"""Loading the checkpoints to compare: config checks first (cheap, one-line errors), then weights."""

from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint_info import check_supported, read_config
from ..errors import SkipV1Error


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


def check_model_dir(path: "str | Path") -> dict:
    """Config and weight-file validation, run for every model before any weights are read, so
    that a bad last model fails the run at once rather than after the others were measured."""
    from ..convert.reader import scan_weights

    config = read_config(path)
    check_supported(config)
    scan_weights(Path(path))  # every shard's header, as convert checks them
    return config


def max_positions(config: dict) -> int:
    return int(config.get("max_position_embeddings") or 2**31)


def load_model(path: "str | Path", device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..auto_classes import register

    register()  # the SkipV1 classes with the Auto classes (done already if transformers was)

    check_model_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"{path} has no usable tokenizer ({_first_line(err)}): copy the source "
            "checkpoint's tokenizer files next to the weights"
        ) from None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as err:
        raise SkipV1Error(f"cannot load the weights of {path}: {_first_line(err)}") from None
    model.to(device).eval()
    return LoadedModel(str(path), model, tokenizer)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
