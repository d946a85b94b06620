"""Configuration of SkipV1Former on the GPT-2 architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import GPT2Config

from .modeling_skipv1_core import SkipV1ConfigMixin


@strict
class SkipV1GPT2Config(SkipV1ConfigMixin, GPT2Config):
    r"""A GPT-2 config plus the SkipV1 fields. GPT-2 fuses q/k/v into the Conv1D `c_attn`, whose
    weight is `[in, out]`: in layer i its output columns are `[q: n * d | k: n * d | v: own * d]`
    with `own = n_head - (skip_v_heads if i > 0 else 0)` (multi-head attention).

    skip_v_heads (`int`): value heads that every layer from the second on takes from the first
        layer's value tensor (head indices `n - s .. n - 1`).
    attention_bias, o_proj_bias (`bool`): GPT-2's Conv1D layers always have biases.
    num_key_value_heads (`int`, *optional*): always n_head (GPT-2 is MHA).
    head_dim (`int`, *optional*): always n_embd // n_head.
    """

    model_type = "skipv1_gpt2"
    value_projection_dim = 1  # Conv1D: [in, out]

    skip_v_heads: int = 0
    attention_bias: bool = True
    o_proj_bias: bool | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        self.num_key_value_heads = self.num_key_value_heads or self.n_head
        self.head_dim = self.head_dim or self.n_embd // self.n_head
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        if self.num_key_value_heads != self.n_head:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} != n_head={self.n_head}: "
                "GPT-2 has multi-head attention only."
            )
        if not (self.attention_bias and self.o_proj_bias):
            raise ValueError("GPT-2's c_attn and c_proj always have biases: leave them true.")
        if self.reorder_and_upcast_attn:
            raise ValueError("reorder_and_upcast_attn is not supported by SkipV1: set it false.")
        if self.add_cross_attention:
            raise ValueError("add_cross_attention: SkipV1 converts decoder-only GPT-2 models.")

    def value_projection(self, layer_idx: int) -> tuple[str, int]:
        columns = (2 * self.n_head + self.own_value_heads(layer_idx)) * self.head_dim
        return f"transformer.h.{layer_idx}.attn.c_attn.weight", columns


__all__ = ["SkipV1GPT2Config"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_gpt2" not in sys.modules:
    from .modeling_skipv1_gpt2 import SkipV1GPT2ForCausalLM  # noqa: F401
