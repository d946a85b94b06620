"""Configuration of SkipV1Former on the Phi-3 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import Phi3Config

from .modeling_skipv1_core import SkipV1ConfigMixin


@strict
class SkipV1Phi3Config(SkipV1ConfigMixin, Phi3Config):
    r"""A Phi-3 config plus the SkipV1 fields. Phi-3 fuses q/k/v into one `qkv_proj`: layer i's
    rows are `[q: heads * head_dim | k: n_kv * head_dim | v: own * head_dim]` with
    `own = num_key_value_heads - (skip_v_heads if i > 0 else 0)` (`value_projection`). A
    `sliding_window` applies to every layer, as in Phi-3: each layer's cache holds the window, and
    a later layer borrows layer 0's values at the positions of its own keys, which are layer 0's.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    attention_bias (`bool`): Phi-3 has no q/k/v bias; declared for the SkipV1 core.
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
    head_dim (`int`, *optional*): defaults to hidden_size // num_attention_heads.
    """

    model_type = "skipv1_phi3"
    # Phi-3's own plan replicates the fused projection's output before slicing it, so the
    # per-layer value width needs no SkipV1 style (unlike Llama's TP_PLAN_OVERRIDES).
    base_model_tp_plan = dict(Phi3Config.base_model_tp_plan)

    skip_v_heads: int = 0
    attention_bias: bool = False
    o_proj_bias: bool | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)

    def qkv_rows(self, layer_idx: int) -> tuple[int, int, int]:
        """Rows of q, k and v in layer `layer_idx`'s fused qkv_proj, in that order."""
        d = self.head_dim
        kv = self.num_key_value_heads * d
        return self.num_attention_heads * d, kv, self.own_value_heads(layer_idx) * d

    def value_projection(self, layer_idx: int) -> tuple[str, int]:
        return f"model.layers.{layer_idx}.self_attn.qkv_proj.weight", sum(self.qkv_rows(layer_idx))


__all__ = ["SkipV1Phi3Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_phi3" not in sys.modules:
    from .modeling_skipv1_phi3 import SkipV1Phi3ForCausalLM  # noqa: F401
