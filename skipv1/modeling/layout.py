"""KV-cache arithmetic of the source (MHA/GQA) and SkipV1 layouts, from config fields alone."""

import math
from dataclasses import dataclass, replace
from typing import Any

from ..families import LLAMA, SOURCE_ARCHITECTURES, family_of


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    skip_v_heads: int = 0
    # Layer 0 attends through a sliding window and a later layer attends globally (Gemma): with
    # s > 0, layer 0's cache also keeps its s borrowed value heads for the full context.
    windowed_first_layer: bool = False

    def bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """dtype_bytes * head_dim * (2*n_kv + (L-1)*(2*n_kv - s) [+ s]): layer 0 keeps every value
        head, and `+ s` is its full-length store of the borrowed heads when it is a sliding-window
        layer. A sliding-window layer counts what it holds per token it holds (as eval measures),
        so this is also its cost per token up to the window."""
        n_kv, s, layers = self.num_kv_heads, self.skip_v_heads, self.num_layers
        store = s if self.windowed_first_layer else 0
        return dtype_bytes * self.head_dim * (2 * n_kv + (layers - 1) * (2 * n_kv - s) + store)

    def with_skip(self, skip_v_heads: int) -> "KVLayout":
        return replace(self, skip_v_heads=skip_v_heads)


# layer_types a config.json without them gets from transformers (Gemma 2: sliding and global
# layers alternate; Gemma 3: a global layer every `sliding_window_pattern`, default 6; Mistral,
# Mixtral and Phi-3: every layer slides when `sliding_window` is set; Qwen2: with
# `use_sliding_window`, the layers from `max_window_layers` on).
def _default_layer_types(config: dict) -> list[str]:
    family = family_of(config)
    if family is None or not family.keeps_sliding_window:
        return []
    layers = config.get("num_hidden_layers") or 0
    if family.name.startswith("gemma"):
        period = 2 if family.name == "gemma2" else config.get("sliding_window_pattern", 6)
        return [_type((i + 1) % period) for i in range(layers)]
    first = _first_sliding_layer(config)
    return [] if first is None else [_type(i >= first) for i in range(layers)]


def _type(sliding: bool) -> str:
    return "sliding_attention" if sliding else "full_attention"


# transformers' default `max_window_layers` (the layers from it on slide) of the sources that
# have the field; Qwen3-MoE does not read it: with `use_sliding_window` every layer slides.
MAX_WINDOW_LAYERS_DEFAULT = {"qwen2": 28, "qwen3": 28, "qwen3_moe": 0}


def _first_sliding_layer(config: dict) -> int | None:
    """The first sliding-window layer of a config whose window, when it applies, applies from
    one layer on (None: none slides): the Llama family's, Mixtral's, Phi-3's, Qwen3's and
    Qwen3-MoE's."""
    kind = SOURCE_ARCHITECTURES.get((config.get("architectures") or [None])[0])
    kind = kind or config.get("model_type")
    if config.get("sliding_window") is None or kind == "llama":  # Llama has no windows
        return None
    kind = {"skipv1_qwen3": "qwen3", "skipv1_qwen3_moe": "qwen3_moe"}.get(kind, kind)
    if kind in MAX_WINDOW_LAYERS_DEFAULT:  # the window applies with use_sliding_window only
        if not config.get("use_sliding_window"):
            return None
        return (
            0
            if kind == "qwen3_moe"
            else config.get("max_window_layers", MAX_WINDOW_LAYERS_DEFAULT[kind])
        )
    return 0  # Mistral, Mixtral, Phi-3, and a SkipV1 Llama config (SkipV1LlamaConfig's rule)


def layer_types(config: Any) -> list[str]:
    """Attention type of each layer ([] when every layer attends over the full context)."""
    if isinstance(config, dict):
        return list(config.get("layer_types") or _default_layer_types(config))
    return list(getattr(config, "layer_types", None) or [])


def kv_layout(config: Any) -> KVLayout:
    """Reads a transformers config object or a config.json dict."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    heads = get("num_attention_heads")
    n_kv = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    types = layer_types(config)
    family = family_of({"model_type": get("model_type"), "architectures": get("architectures")})
    windowed = bool(
        family
        and family.keeps_sliding_window
        and types[:1] == ["sliding_attention"]
        and "full_attention" in types[1:]
    )
    return KVLayout(get("num_hidden_layers"), n_kv, head_dim, get("skip_v_heads", 0) or 0, windowed)


def count_parameters(config: dict, skip_v_heads: int | None = None) -> int:
    """Parameters of a Llama-family or Qwen3 model from config.json alone; `skip_v_heads` overrides the
    config's value (0 for the source layout)."""
    layout = kv_layout(config)
    s = layout.skip_v_heads if skip_v_heads is None else skip_v_heads
    family = family_of(config)
    if family is not None and family.fused_qkv:
        return _count_from_plan(config, s)
    hidden, heads, d = config["hidden_size"], config["num_attention_heads"], layout.head_dim
    n_kv, layers, vocab = layout.num_kv_heads, layout.num_layers, config["vocab_size"]
    qkv_bias = bool(config.get("attention_bias")) or config.get("model_type") == "qwen2"
    o_bias = bool(config.get("o_proj_bias", config.get("attention_bias")))
    if config.get("model_type") == "qwen2":
        o_bias = False
    mlp_bias = bool(config.get("mlp_bias"))
    inter = config["intermediate_size"]

    def attention(own_v: int) -> int:
        rows = heads * d + n_kv * d + own_v * d
        return (
            hidden * rows
            + (rows if qkv_bias else 0)
            + heads * d * hidden
            + (hidden if o_bias else 0)
        )

    mlp = 3 * hidden * inter + ((2 * inter + hidden) if mlp_bias else 0)
    qk_norms = 2 * d
    if family and family.qk_norm_scope == "projection":  # OLMo-2: over every head
        qk_norms = (heads + n_kv) * d
    per_layer_norms = len((family or LLAMA).norms.names()) * hidden
    per_layer_norms += qk_norms if family and family.qk_norm else 0
    total = attention(n_kv) + (layers - 1) * attention(n_kv - s)
    total += layers * (mlp + per_layer_norms) + hidden + vocab * hidden
    if family and family.experts:  # sparse layers: a router and the experts, not the MLP
        experts = family.experts
        count, expert_inter = experts.count(config), config[experts.intermediate_field]
        sparse = sum(experts.is_sparse(config, i) for i in range(layers))
        total += sparse * (count * (3 * hidden * expert_inter + hidden) - mlp)
    if not tied_embeddings(config):
        total += vocab * hidden
    return total


def tied_embeddings(config: dict) -> bool:
    """Whether lm_head is the embedding matrix; a config.json without the field gets its family's
    transformers default (GPT-2, Gemma: tied)."""
    family = family_of(config)
    return bool(config.get("tie_word_embeddings", bool(family and family.tied_by_default)))


def _count_from_plan(config: dict, skip_v_heads: int) -> int:
    """A family with fused projections: the tensors the conversion plan says it has."""
    from ..convert.plan import make_plan  # the plan knows every family's tensor shapes

    plan = make_plan(config, skip_v_heads, "keep")
    optional = plan.source.optional_tensors()
    return sum(math.prod(t.target_shape) for t in plan.tasks.values() if t.name not in optional)
