"""Configuration of SkipV1Former on the Qwen3 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1Qwen3Config(SkipV1ConfigMixin, Qwen3Config):
    r"""A Qwen3 config plus the SkipV1 fields. Its sliding-window layers (`layer_types`, from
    `use_sliding_window` and `max_window_layers` as Qwen3's) are kept: the core's cache layers
    keep what a later layer borrows from a sliding layer 0 (as for Qwen2).

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`
        (Qwen3's own rule).
    """

    model_type = "skipv1_qwen3"
    # Qwen3's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**Qwen3Config.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    supports_sliding_window = True

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None


__all__ = ["SkipV1Qwen3Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_qwen3" not in sys.modules:
    from .modeling_skipv1_qwen3 import SkipV1Qwen3ForCausalLM  # noqa: F401
