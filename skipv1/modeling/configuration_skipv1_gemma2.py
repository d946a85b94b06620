"""Configuration of SkipV1Former on the Gemma 2 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Gemma2Config

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1Gemma2Config(SkipV1ConfigMixin, Gemma2Config):
    r"""A Gemma 2 config plus the SkipV1 fields. Its sliding-window layers (`layer_types`) stay:
    layer 0's cache keeps the borrowed value heads for the full context.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
    """

    model_type = "skipv1_gemma2"
    supports_sliding_window = True
    # Gemma 2's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**Gemma2Config.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None


__all__ = ["SkipV1Gemma2Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_gemma2" not in sys.modules:
    from .modeling_skipv1_gemma2 import SkipV1Gemma2ForCausalLM  # noqa: F401
