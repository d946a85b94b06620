"""Configuration of SkipV1Former on the OLMo-2 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Olmo2Config

from .modeling_skipv1_core import SkipV1ConfigMixin


@strict
class SkipV1Olmo2Config(SkipV1ConfigMixin, Olmo2Config):
    r"""An OLMo-2 config plus the SkipV1 fields.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`
        (OLMo-2's own rule).
    head_dim (`int`, *optional*): defaults to hidden_size // num_attention_heads, as OLMo-2's
        attention does (Olmo2Config has no such field; the SkipV1 core reads it).
    """

    model_type = "skipv1_olmo2"
    # OLMo-2's own plan gathers the q/k/v projections' outputs (its norms see every head), so every
    # rank computes every head and the per-layer value width needs no SkipV1 style (as Phi-3's;
    # TP_PLAN_OVERRIDES would slice rank-local value heads out of the gathered ones).
    base_model_tp_plan = dict(Olmo2Config.base_model_tp_plan)

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads


__all__ = ["SkipV1Olmo2Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_olmo2" not in sys.modules:
    from .modeling_skipv1_olmo2 import SkipV1Olmo2ForCausalLM  # noqa: F401
