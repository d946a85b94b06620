"""KV-cache arithmetic of the source (MHA/GQA) and SkipV1 layouts, from config fields alone."""

import math
from dataclasses import dataclass
from typing import Any

from ..families import family_of


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    skip_v_heads: int = 0

    def bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """dtype_bytes * head_dim * (2*n_kv + (L-1)*(2*n_kv - s)): layer 0 keeps every value head."""
        n_kv, s, layers = self.num_kv_heads, self.skip_v_heads, self.num_layers
        return dtype_bytes * self.head_dim * (2 * n_kv + (layers - 1) * (2 * n_kv - s))

    def with_skip(self, skip_v_heads: int) -> "KVLayout":
        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, skip_v_heads)


def kv_layout(config: Any) -> KVLayout:
    """Reads a transformers config object or a config.json dict."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    heads = get("num_attention_heads")
    n_kv = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    return KVLayout(get("num_hidden_layers"), n_kv, head_dim, get("skip_v_heads", 0) or 0)


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
    per_layer_norms = 2 * hidden + (qk_norms if family and family.qk_norm else 0)
    total = attention(n_kv) + (layers - 1) * attention(n_kv - s)
    total += layers * (mlp + per_layer_norms) + hidden + vocab * hidden
    if family and family.experts:  # sparse layers: a router and the experts, not the MLP
        experts = family.experts
        count, expert_inter = experts.count(config), config[experts.intermediate_field]
        sparse = sum(experts.is_sparse(config, i) for i in range(layers))
        total += sparse * (count * (3 * hidden * expert_inter + hidden) - mlp)
    if not config.get("tie_word_embeddings", False):
        total += vocab * hidden
    return total


def _count_from_plan(config: dict, skip_v_heads: int) -> int:
    """A family with fused projections: the tensors the conversion plan says it has."""
    from ..convert.plan import make_plan  # the plan knows every family's tensor shapes

    plan = make_plan(config, skip_v_heads, "keep")
    optional = plan.source.optional_tensors()
    return sum(math.prod(t.target_shape) for t in plan.tasks.values() if t.name not in optional)
