"""Configuration of SkipV1Former on the Llama architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling modeling file.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


@strict
class SkipV1LlamaConfig(LlamaConfig):
    r"""A Llama config plus the SkipV1 fields.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
        Qwen2 checkpoints have q/k/v biases but no o_proj bias.
    """

    model_type = "skipv1_llama"
    # Tensor parallelism: Llama's plan, except that value projections stay whole on every rank
    # and each attention module keeps the value heads of its rank's key heads (own ones from its
    # v_proj, borrowed ones from layer 0's), see `TPValueHeads` in the modeling file.
    base_model_tp_plan = {
        **LlamaConfig.base_model_tp_plan,
        "layers.*.self_attn.v_proj": "replicate",
        "layers.*.self_attn": "skipv1_value_heads",
    }

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.o_proj_bias is None:
            self.o_proj_bias = self.attention_bias

    def validate_architecture(self):
        super().validate_architecture()
        n_kv, s = self.num_key_value_heads, self.skip_v_heads
        if not 0 <= s < n_kv:
            raise ValueError(
                f"skip_v_heads={s} is out of range: it must satisfy 0 <= skip_v_heads < "
                f"num_key_value_heads={n_kv}."
            )
        if self.num_attention_heads % n_kv != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={n_kv}."
            )

    def own_value_heads(self, layer_idx: int) -> int:
        """Value heads a layer computes itself: all of them in layer 0, n_kv - s afterwards."""
        return self.num_key_value_heads - (self.skip_v_heads if layer_idx > 0 else 0)


__all__ = ["SkipV1LlamaConfig"]

# Tools that start from the config alone (`transformers serve` resolves `architectures[0]` by
# name) need the model class defined as soon as the config is: import the modeling file last,
# unless it is the modeling file that is importing this one.
if f"{__package__}.modeling_skipv1_llama" not in sys.modules:
    from .modeling_skipv1_llama import SkipV1LlamaForCausalLM  # noqa: F401
