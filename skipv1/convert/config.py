"""The converted config.json, derived from the source config (pure): every source field, plus the
SkipV1 fields, with each dropped or changed field recorded and explained."""

import importlib.metadata
from dataclasses import dataclass

from ..checkpoint_info import SOURCE_ARCHITECTURES
from ..families import LLAMA
from ..modeling.layout import layer_types
from . import fused
from .plan import ConversionPlan

# Fields that switch on sliding-window masks in transformers; the families that do not keep
# sliding-window layers (Family.keeps_sliding_window) attend over the full context only, and so
# does one that keeps them where the source's window is not active.
SLIDING_FIELDS = ("layer_types", "use_sliding_window", "max_window_layers")
# Sources whose window applies only with `use_sliding_window` (and then per `max_window_layers`).
WINDOW_FLAG_SOURCES = ("qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ConfigChange:
    field: str
    before: object
    after: object  # None with dropped=True means the field is gone
    why: str
    dropped: bool = False

    def as_dict(self) -> dict:
        out = {"field": self.field, "from": self.before, "why": self.why}
        out["dropped" if self.dropped else "to"] = True if self.dropped else self.after
        return out


def sliding_window_active(config: dict) -> bool:
    """Whether any layer of the source actually attends through a window shorter than its context."""
    window = config.get("sliding_window")
    max_pos = config.get("max_position_embeddings")
    if window is None or (isinstance(max_pos, int) and window >= max_pos):
        return False
    kind = SOURCE_ARCHITECTURES.get(_arch(config))
    if kind == "llama":  # transformers' Llama has no windows: a stray field changes nothing
        return False
    if kind not in WINDOW_FLAG_SOURCES:
        return True
    if not config.get("use_sliding_window", False):
        return False
    return "sliding_attention" in layer_types(config)  # per max_window_layers (Qwen2, Qwen3)


def _arch(config: dict) -> str:
    return (config.get("architectures") or [""])[0]


def skipv1_config(
    source: dict, plan: ConversionPlan, dtype: str | None
) -> tuple[dict, list[ConfigChange]]:
    """(config.json of the converted model, the changes made); `dtype` None keeps the source's."""
    out = dict(source)
    changes: list[ConfigChange] = []

    def put(key: str, value, why: str) -> None:
        if out.get(key, object()) != value:
            changes.append(ConfigChange(key, out.get(key), value, why))
        out[key] = value

    def drop(key: str, why: str) -> None:
        if key in out:
            changes.append(ConfigChange(key, out.pop(key), None, why, dropped=True))

    family = plan.source.family
    put("architectures", [family.architecture], "SkipV1 model class")
    put("model_type", family.model_type, "SkipV1 model type")
    if "auto_map" in source:
        drop("auto_map", "the source's custom code is replaced by the SkipV1 modeling code")
    put("auto_map", family.auto_map, "loads the modeling code saved next to the weights")
    put("skip_v_heads", plan.skip_heads, "value heads each later layer takes from layer 0")
    put("attention_bias", plan.source.qkv_bias, "q/k/v projections carry a bias")
    put("o_proj_bias", plan.source.o_bias, "output projection bias, separately from q/k/v")
    put("head_dim", plan.source.head_dim, "stated explicitly")
    qkv = fused.layout_of(family)
    if qkv is not None:
        split = fused.split_record(qkv, plan.source, plan.skip_heads)
        put("fused_qkv_split", split, "later layers' fused q/k/v tensors hold fewer value rows")
    if family is LLAMA and sliding_window_active(source):
        # Mistral's / Qwen2's windows kept, stated per layer (the SkipV1 config reads layer_types)
        types = layer_types(source)
        put("layer_types", types, "the source's sliding-window layers, one entry per layer")
    elif not family.keeps_sliding_window or family is LLAMA:
        # Gemma keeps its fields as they are (its layer types are its architecture's)
        _drop_sliding_window(source, out, put, drop)
    if dtype is not None:
        put("dtype", dtype, "--dtype")
        drop("torch_dtype", "superseded by dtype")
    put(
        "transformers_version",
        importlib.metadata.version("transformers"),
        "written by this transformers",
    )
    return out, changes


def _drop_sliding_window(source: dict, out: dict, put, drop) -> None:
    if "sliding_window" not in source and not any(k in source for k in SLIDING_FIELDS):
        return
    if sliding_window_active(source):
        put(
            "max_position_embeddings",
            source["sliding_window"],
            "the source attends through a sliding window and SkipV1 has full attention only: "
            "the converted model is exact only within the window",
        )
    for key in SLIDING_FIELDS:
        drop(key, "SkipV1 attends over the full context (no sliding-window layers)")
    put("sliding_window", None, "SkipV1 attends over the full context")
