"""Configuration of SkipV1Former on the Llama architecture.

This file is copied next to converted weights (see `auto_map`), so it imports only transformers
and its sibling core and modeling files.
"""

import sys

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .modeling_skipv1_core import TP_PLAN_OVERRIDES, SkipV1ConfigMixin

LAYER_TYPES = {"full_attention", "sliding_attention"}


@strict
class SkipV1LlamaConfig(SkipV1ConfigMixin, LlamaConfig):
    r"""A Llama config plus the SkipV1 fields.

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
        Qwen2 checkpoints have q/k/v biases but no o_proj bias.
    sliding_window (`int`, *optional*): the window of the `sliding_attention` layers (Mistral,
        Qwen2 with an active window); None: every layer attends over the full context.
    layer_types (`list[str]`, *optional*): `full_attention` / `sliding_attention` per layer; left
        out with a window set, every layer slides (Mistral's rule, and the cache's).
    """

    model_type = "skipv1_llama"
    # Llama's tensor-parallel plan, except the value heads (see TPValueHeads in the core file).
    base_model_tp_plan = {**LlamaConfig.base_model_tp_plan, **TP_PLAN_OVERRIDES}

    supports_sliding_window = True

    skip_v_heads: int = 0
    o_proj_bias: bool | None = None
    sliding_window: int | None = None
    layer_types: list[str] | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.layer_types is None:  # transformers' mask and cache code read a list
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            self.layer_types = [kind] * self.num_hidden_layers

    def validate_architecture(self):
        super().validate_architecture()
        types = self.layer_types
        if len(types) != self.num_hidden_layers or set(types) - LAYER_TYPES:
            raise ValueError(
                f"layer_types={types} must name {self.num_hidden_layers} layers, each one of "
                f"{sorted(LAYER_TYPES)}."
            )
        if self.sliding_window is None and "sliding_attention" in types:
            raise ValueError("layer_types has sliding_attention layers: set sliding_window.")


__all__ = ["SkipV1LlamaConfig"]

# Tools that start from the config alone (`transformers serve` resolves `architectures[0]` by
# name) need the model class defined as soon as the config is: import the modeling file last,
# unless it is the modeling file that is importing this one.
if f"{__package__}.modeling_skipv1_llama" not in sys.modules:
    from .modeling_skipv1_llama import SkipV1LlamaForCausalLM  # noqa: F401
