"""Configuration of SkipV1Former on the Qwen3-MoE architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Qwen3MoeConfig

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1Qwen3MoeConfig(SkipV1ConfigMixin, Qwen3MoeConfig):
    r"""A Qwen3-MoE config plus the SkipV1 fields. With `use_sliding_window`, `sliding_window`
    applies to every layer, as in Qwen3-MoE: each layer's cache holds the window, and a later
    layer borrows layer 0's values at the positions of its own keys, which are layer 0's.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`
        (Qwen3-MoE's own rule).
    """

    model_type = "skipv1_qwen3_moe"
    # Qwen3-MoE's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**Qwen3MoeConfig.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None
    # Qwen3-MoE's attention reads an optional `head_dim` (Qwen3-30B-A3B: 128, not hidden / heads)
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads


__all__ = ["SkipV1Qwen3MoeConfig"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_qwen3_moe" not in sys.modules:
    from .modeling_skipv1_qwen3_moe import SkipV1Qwen3MoeForCausalLM  # noqa: F401
