"""Configuration of SkipV1Former on the Llama architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1LlamaConfig(SkipV1ConfigMixin, LlamaConfig):
    r"""A Llama config plus the SkipV1 fields.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
        Qwen2 checkpoints have q/k/v biases but no o_proj bias.
    """

    model_type = "skipv1_llama"
    # Llama's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**LlamaConfig.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None


__all__ = ["SkipV1LlamaConfig"]

# Tools that start from the config alone (`transformers serve` resolves `architectures[0]` by
# name) need the model class defined as soon as the config is: import the modeling file last,
# unless it is the modeling file that is importing this one.
if f"{__package__}.modeling_skipv1_llama" not in sys.modules:
    from .modeling_skipv1_llama import SkipV1LlamaForCausalLM  # noqa: F401
