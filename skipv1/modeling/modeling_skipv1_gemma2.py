"""SkipV1Former on transformers' Gemma 2: Gemma 2 (alternating sliding-window and global layers,
attention logit soft-capping, query_pre_attn_scalar, scaled embeddings, norms around attention
and MLP), except that layers >= 1 compute only their first `n_kv - s` value heads and read the
last `s` from layer 0's value tensor. The borrow logic, the cache layers (layer 0's sliding
window plus a full-length store of its borrowed heads) and the loading check are the
family-independent core (`modeling_skipv1_core.py`); this file mixes them into the Gemma 2
classes.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.gemma2.modeling_gemma2 import (
    Gemma2Attention,
    Gemma2DecoderLayer,
    Gemma2ForCausalLM,
    Gemma2Model,
    Gemma2PreTrainedModel,
    eager_attention_forward,
)

from .configuration_skipv1_gemma2 import SkipV1Gemma2Config
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1Gemma2Attention(SkipV1AttentionMixin, Gemma2Attention):
    eager_attention = staticmethod(eager_attention_forward)  # applies the soft-capping

    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window, "softcap": self.attn_logit_softcapping}


class SkipV1Gemma2DecoderLayer(Gemma2DecoderLayer):
    def __init__(self, config: SkipV1Gemma2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Gemma2Attention(config=config, layer_idx=layer_idx)


class SkipV1Gemma2PreTrainedModel(SkipV1PreTrainedMixin, Gemma2PreTrainedModel):
    config_class = SkipV1Gemma2Config
    config: SkipV1Gemma2Config
    _no_split_modules = ["SkipV1Gemma2DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1Gemma2DecoderLayer,
        "attentions": SkipV1Gemma2Attention,
    }


class SkipV1Gemma2Model(SkipV1ModelMixin, SkipV1Gemma2PreTrainedModel, Gemma2Model):
    decoder_layer_class = SkipV1Gemma2DecoderLayer


class SkipV1Gemma2ForCausalLM(
    SkipV1ForCausalLMMixin, SkipV1Gemma2PreTrainedModel, Gemma2ForCausalLM
):
    base_model_class = SkipV1Gemma2Model


SkipV1Gemma2Config.register_for_auto_class()
SkipV1Gemma2ForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Gemma2ForCausalLM)

__all__ = [
    "SkipV1Gemma2Attention",
    "SkipV1Gemma2DecoderLayer",
    "SkipV1Gemma2ForCausalLM",
    "SkipV1Gemma2Model",
    "SkipV1Gemma2PreTrainedModel",
]
