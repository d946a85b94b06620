"""Configuration of SkipV1Former on the OLMo-2 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Olmo2Config

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1Olmo2Config(SkipV1ConfigMixin, Olmo2Config):
    r"""An OLMo-2 config plus the SkipV1 fields.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`
        (OLMo-2's own rule).
    """

    model_type = "skipv1_olmo2"
    # OLMo-2's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**Olmo2Config.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None


__all__ = ["SkipV1Olmo2Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_olmo2" not in sys.modules:
    from .modeling_skipv1_olmo2 import SkipV1Olmo2ForCausalLM  # noqa: F401
