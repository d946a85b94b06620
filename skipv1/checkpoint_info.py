"""What a checkpoint is, read from its config.json alone (no weights): used by `inspect`, and by
`convert` and `eval` to validate their inputs."""

import json
from pathlib import Path

from .errors import SkipV1Error
from .families import (
    ARCHITECTURE_OF_MODEL_TYPE,
    LLAMA,
    SKIPV1_ARCHITECTURES,
    SKIPV1_MODEL_TYPES,
    SOURCE_ARCHITECTURES,
    standard_fields,
)
from .modeling.layout import count_parameters, kv_layout

# The Llama family's names, kept for the callers that predate the family table.
SKIPV1_ARCHITECTURE = LLAMA.architecture
SKIPV1_MODEL_TYPE = LLAMA.model_type


def read_config(path: "str | Path") -> dict:
    """config.json of a checkpoint directory, with one-line errors for every way it can be wrong."""
    path = Path(path)
    if not path.exists():
        raise SkipV1Error(f"{path} does not exist: give a checkpoint directory")
    if not path.is_dir():
        raise SkipV1Error(
            f"{path} is not a directory: give a checkpoint directory holding config.json"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise SkipV1Error(f"{path} is not a model directory: it has no config.json")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SkipV1Error(
            f"{config_file} is not valid JSON ({err}): repair or re-download it"
        ) from None
    if not isinstance(config, dict):
        raise SkipV1Error(f"{config_file} is not a JSON object: repair or re-download it")
    return standard_fields(config)


def is_skipv1(config: dict) -> bool:
    return config.get("model_type") in SKIPV1_MODEL_TYPES


def architecture(config: dict) -> str:
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise SkipV1Error(
            f"config.json field 'architectures' is {archs!r}: it must be a list of class names "
            'such as ["LlamaForCausalLM"]'
        )
    if archs:
        return archs[0]
    model_type = config.get("model_type", "unknown")
    return ARCHITECTURE_OF_MODEL_TYPE.get(model_type, f"<{model_type}>")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_supported(config: dict) -> None:
    """Raises unless the config is a source architecture we convert or a SkipV1 checkpoint."""
    arch = architecture(config)
    if arch not in SOURCE_ARCHITECTURES and arch not in SKIPV1_ARCHITECTURES:
        raise SkipV1Error(
            f"unsupported architecture {arch}: supported are {', '.join(SOURCE_ARCHITECTURES)} "
            f"(and converted {', '.join(SKIPV1_ARCHITECTURES)})"
        )
    for key in (
        "num_hidden_layers",
        "num_attention_heads",
        "hidden_size",
        "vocab_size",
        "intermediate_size",
    ):
        if not _is_int(config.get(key)) or config[key] <= 0:
            raise SkipV1Error(
                f"config.json lacks a positive integer {key!r} (it is {config.get(key)!r}): it is "
                f"not a complete {arch} config"
            )
    for key in ("num_key_value_heads", "head_dim", "skip_v_heads"):
        value = config.get(key)
        if value is not None and (not _is_int(value) or value < 0):
            raise SkipV1Error(
                f"config.json field {key!r} is {value!r}: it must be a non-negative integer"
            )


def default_skip_heads(num_kv_heads: int) -> int:
    """Half the KV heads, rounded down: the paper's 50% skip ratio."""
    return num_kv_heads // 2


def describe(path: "str | Path", skip_v_heads: int | None = None) -> dict:
    """Shape, parameters and KV bytes/token (bf16) of a checkpoint directory's source and
    SkipV1 layouts."""
    return describe_config(read_config(path), str(path), skip_v_heads)


def describe_config(config: dict, label: str, skip_v_heads: int | None = None) -> dict:
    """`describe` of a config read elsewhere (a GGUF's metadata, a Hub config.json)."""
    check_supported(config)
    layout = kv_layout(config)
    converted = is_skipv1(config)
    s = (
        layout.skip_v_heads
        if converted
        else (default_skip_heads(layout.num_kv_heads) if skip_v_heads is None else skip_v_heads)
    )
    if not 0 <= s < layout.num_kv_heads:
        raise SkipV1Error(
            f"--skip-heads {s} is out of range for {layout.num_kv_heads} KV heads: give 0 to "
            f"{layout.num_kv_heads - 1} (each later layer keeps at least one value head)"
        )
    source_bytes = layout.with_skip(0).bytes_per_token(2)
    skip_bytes = layout.with_skip(s).bytes_per_token(2)
    return {
        "path": label,
        "architecture": architecture(config),
        "is_skipv1": converted,
        "num_layers": layout.num_layers,
        "num_heads": config["num_attention_heads"],
        "num_kv_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim,
        "skip_v_heads": s,
        "parameters": count_parameters(config, s if converted else 0),
        "parameters_skipv1": count_parameters(config, s),
        "kv_bytes_per_token_source_bf16": source_bytes,
        "kv_bytes_per_token_skipv1_bf16": skip_bytes,
        "kv_saving": 1 - skip_bytes / source_bytes,
    }
