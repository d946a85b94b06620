"""SkipV1Former on transformers' Llama: Llama, except that layers >= 1 compute only their first
`n_kv - s` value heads and read the last `s` from layer 0's value tensor. The borrow logic, the
cache layers and the loading check are the family-independent core (`modeling_skipv1_core.py`);
this file mixes them into the Llama classes.

The source's sliding-window layers (Mistral, Qwen2 with an active window) are kept, per
`layer_types`: their attention passes the window and masks with it (Qwen2's model forward, which
is Llama's with one mask per layer type), and the core's cache layers keep what a later layer
borrows from a sliding layer 0.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
)
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

from .configuration_skipv1_llama import SkipV1LlamaConfig
from .modeling_skipv1_core import (
    FirstLayerValues,
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    TPValueHeads,
    check_value_projection_rows,
    expose_in_transformers,
)
from .static_cache_skipv1 import SkipV1StaticLayer, unused_value_heads, use_skipv1_static_layers


class SkipV1LlamaAttention(SkipV1AttentionMixin, LlamaAttention):
    def __init__(self, config: SkipV1LlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.sliding_window = config.sliding_window if sliding else None

    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}  # as Mistral's and Qwen2's attention


class SkipV1LlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: SkipV1LlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.attention_type = config.layer_types[layer_idx]
        self.self_attn = SkipV1LlamaAttention(config=config, layer_idx=layer_idx)


class SkipV1LlamaPreTrainedModel(SkipV1PreTrainedMixin, LlamaPreTrainedModel):
    config_class = SkipV1LlamaConfig
    config: SkipV1LlamaConfig
    _no_split_modules = ["SkipV1LlamaDecoderLayer"]
    # fullgraph compile of the static-cache decode step is tested (tests/test_model_paths.py)
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": SkipV1LlamaDecoderLayer,
        "attentions": SkipV1LlamaAttention,
    }


class LlamaModelWithWindows(LlamaModel):
    """Llama's model with Qwen2's forward: Llama's, with one mask per layer type (`layer_types`:
    full and sliding-window attention), prepared by generate() or here (SkipV1ModelMixin.forward
    calls it)."""

    forward = Qwen2Model.forward

    @property
    def has_sliding_layers(self) -> bool:  # read by Qwen2Model.forward
        return self.config.has_sliding_layers()


class SkipV1LlamaModel(SkipV1ModelMixin, SkipV1LlamaPreTrainedModel, LlamaModelWithWindows):
    decoder_layer_class = SkipV1LlamaDecoderLayer


class SkipV1LlamaForCausalLM(SkipV1ForCausalLMMixin, SkipV1LlamaPreTrainedModel, LlamaForCausalLM):
    base_model_class = SkipV1LlamaModel


SkipV1LlamaConfig.register_for_auto_class()
SkipV1LlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1LlamaForCausalLM)

__all__ = [
    "FirstLayerValues",
    "SkipV1LlamaAttention",
    "SkipV1LlamaDecoderLayer",
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1LlamaPreTrainedModel",
    "SkipV1StaticLayer",
    "TPValueHeads",
    "check_value_projection_rows",
    "unused_value_heads",
    "use_skipv1_static_layers",
]
