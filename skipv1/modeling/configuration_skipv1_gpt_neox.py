"""Configuration of SkipV1Former on the GPT-NeoX architecture (Pythia and relatives).

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import GPTNeoXConfig

from .modeling_skipv1_core import SkipV1ConfigMixin


@strict
class SkipV1GPTNeoXConfig(SkipV1ConfigMixin, GPTNeoXConfig):
    r"""A GPT-NeoX config plus the SkipV1 fields. GPT-NeoX fuses q/k/v into `query_key_value`
    interleaved per head; in layer i the rows are `[q_h | k_h | v_h]` for the own value heads
    `h < own`, then `[q_h | k_h]` for the borrowed ones, `own = num_attention_heads -
    (skip_v_heads if i > 0 else 0)` (multi-head attention: one KV head per query head).

    skip_v_heads (`int`): value heads that every layer from the second on takes from the first
        layer's value tensor (head indices `n - s .. n - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection (`dense`); defaults to
        `attention_bias`.
    num_key_value_heads (`int`, *optional*): always num_attention_heads (GPT-NeoX is MHA).
    head_dim (`int`, *optional*): always hidden_size // num_attention_heads.
    """

    model_type = "skipv1_gpt_neox"
    # The stock plan splits query_key_value's rows evenly across ranks, which the later layers'
    # shorter, uneven per-head blocks do not allow: as Phi-3's plan does for its fused qkv_proj,
    # the projection's output is gathered (every rank computes every head) and `dense` splits its
    # input; the MLP and the embedding are sharded as in the stock plan.
    base_model_tp_plan = {
        **GPTNeoXConfig.base_model_tp_plan,
        "layers.*.attention.query_key_value": "colwise_gather_output",
        "layers.*.attention.dense": "rowwise_split_input",
    }

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} != num_attention_heads="
                f"{self.num_attention_heads}: GPT-NeoX has multi-head attention only."
            )

    def value_projection(self, layer_idx: int) -> tuple[str, int]:
        rows = (2 * self.num_attention_heads + self.own_value_heads(layer_idx)) * self.head_dim
        return f"gpt_neox.layers.{layer_idx}.attention.query_key_value.weight", rows


__all__ = ["SkipV1GPTNeoXConfig"]

# As in configuration_skipv1_llama.py: the model class is defined as soon as the config is.
if f"{__package__}.modeling_skipv1_gpt_neox" not in sys.modules:
    from .modeling_skipv1_gpt_neox import SkipV1GPTNeoXForCausalLM  # noqa: F401
