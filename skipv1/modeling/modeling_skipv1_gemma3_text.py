"""SkipV1Former on transformers' Gemma 3 text model (`Gemma3ForCausalLM`, model_type
`gemma3_text`): Gemma 3 (sliding-window layers with a global one every few, RMSNorm on each
head's queries and keys, local and global RoPE bases, query_pre_attn_scalar, scaled embeddings),
except that layers >= 1 compute only their first `n_kv - s` value heads and read the last `s`
from layer 0's value tensor. The borrow logic and the cache layers are the family-independent
core (`modeling_skipv1_core.py`); this file mixes them into the Gemma 3 classes.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.gemma3.modeling_gemma3 import (
    Gemma3Attention,
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    Gemma3PreTrainedModel,
    Gemma3TextModel,
    eager_attention_forward,
)

from .configuration_skipv1_gemma3_text import SkipV1Gemma3TextConfig
from .modeling_skipv1_core import (
    PerHeadQKNormMixin,
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1Gemma3TextAttention(PerHeadQKNormMixin, SkipV1AttentionMixin, Gemma3Attention):
    eager_attention = staticmethod(eager_attention_forward)

    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}


class SkipV1Gemma3TextDecoderLayer(Gemma3DecoderLayer):
    def __init__(self, config: SkipV1Gemma3TextConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Gemma3TextAttention(config=config, layer_idx=layer_idx)


class SkipV1Gemma3TextPreTrainedModel(SkipV1PreTrainedMixin, Gemma3PreTrainedModel):
    config_class = SkipV1Gemma3TextConfig
    config: SkipV1Gemma3TextConfig
    _no_split_modules = ["SkipV1Gemma3TextDecoderLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1Gemma3TextDecoderLayer,
        "attentions": SkipV1Gemma3TextAttention,
    }


class SkipV1Gemma3TextModel(SkipV1ModelMixin, SkipV1Gemma3TextPreTrainedModel, Gemma3TextModel):
    decoder_layer_class = SkipV1Gemma3TextDecoderLayer


class SkipV1Gemma3TextForCausalLM(
    SkipV1ForCausalLMMixin, SkipV1Gemma3TextPreTrainedModel, Gemma3ForCausalLM
):
    base_model_class = SkipV1Gemma3TextModel


SkipV1Gemma3TextConfig.register_for_auto_class()
SkipV1Gemma3TextForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Gemma3TextForCausalLM)

__all__ = [
    "SkipV1Gemma3TextAttention",
    "SkipV1Gemma3TextDecoderLayer",
    "SkipV1Gemma3TextForCausalLM",
    "SkipV1Gemma3TextModel",
    "SkipV1Gemma3TextPreTrainedModel",
]
