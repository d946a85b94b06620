"""SkipV1Former on transformers' Qwen3: Qwen3 (RMSNorm on each head's queries and keys before
RoPE), except that layers >= 1 compute only their first `n_kv - s` value heads and read the last
`s` from layer 0's value tensor. The borrow logic, the cache layers and the loading check are the
family-independent core (`modeling_skipv1_core.py`); this file mixes them into the Qwen3 classes.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3PreTrainedModel,
)

from .configuration_skipv1_qwen3 import SkipV1Qwen3Config
from .modeling_skipv1_core import (
    PerHeadQKNormMixin,
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1Qwen3Attention(PerHeadQKNormMixin, SkipV1AttentionMixin, Qwen3Attention):
    # the per-head q/k norms are the difference
    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}  # its layer type's (Qwen3's attention)


class SkipV1Qwen3DecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: SkipV1Qwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Qwen3Attention(config=config, layer_idx=layer_idx)


class SkipV1Qwen3PreTrainedModel(SkipV1PreTrainedMixin, Qwen3PreTrainedModel):
    config_class = SkipV1Qwen3Config
    config: SkipV1Qwen3Config
    _no_split_modules = ["SkipV1Qwen3DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1Qwen3DecoderLayer,
        "attentions": SkipV1Qwen3Attention,
    }


class SkipV1Qwen3Model(SkipV1ModelMixin, SkipV1Qwen3PreTrainedModel, Qwen3Model):
    decoder_layer_class = SkipV1Qwen3DecoderLayer


class SkipV1Qwen3ForCausalLM(SkipV1ForCausalLMMixin, SkipV1Qwen3PreTrainedModel, Qwen3ForCausalLM):
    base_model_class = SkipV1Qwen3Model


SkipV1Qwen3Config.register_for_auto_class()
SkipV1Qwen3ForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Qwen3ForCausalLM)

__all__ = [
    "SkipV1Qwen3Attention",
    "SkipV1Qwen3DecoderLayer",
    "SkipV1Qwen3ForCausalLM",
    "SkipV1Qwen3Model",
    "SkipV1Qwen3PreTrainedModel",
]
