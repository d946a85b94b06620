"""Configuration of SkipV1Former on the Mixtral architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import MixtralConfig

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin


@strict
class SkipV1MixtralConfig(SkipV1ConfigMixin, MixtralConfig):
    r"""A Mixtral config plus the SkipV1 fields. A `sliding_window` applies to every layer, as in
    Mixtral (and Mistral): each layer's cache holds the window, and a later layer borrows layer
    0's values at the positions of its own keys, which are layer 0's.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    attention_bias (`bool`): Mixtral's projections have none; declared for the SkipV1 core.
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
    """

    model_type = "skipv1_mixtral"
    # Mixtral's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**MixtralConfig.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    skip_v_heads: int = 0
    attention_bias: bool = False
    o_proj_bias: bool | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.head_dim is None:  # Mixtral's attention falls back to this; the core reads it
            self.head_dim = self.hidden_size // self.num_attention_heads


__all__ = ["SkipV1MixtralConfig"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_mixtral" not in sys.modules:
    from .modeling_skipv1_mixtral import SkipV1MixtralForCausalLM  # noqa: F401
