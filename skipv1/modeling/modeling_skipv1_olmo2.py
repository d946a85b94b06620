"""SkipV1Former on transformers' OLMo-2: OLMo-2 (RMSNorm over the whole q and k projections
before RoPE, norms after attention and MLP), except that layers >= 1 compute only their first
`n_kv - s` value heads and read the last `s` from layer 0's value tensor. The borrow logic, the
cache layers and the loading check are the family-independent core (`modeling_skipv1_core.py`);
this file mixes them into the OLMo-2 classes (the decoder layer's post-norms are OLMo-2's own).

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

import torch
from transformers.models.olmo2.modeling_olmo2 import (
    Olmo2Attention,
    Olmo2DecoderLayer,
    Olmo2ForCausalLM,
    Olmo2Model,
    Olmo2PreTrainedModel,
)

from .configuration_skipv1_olmo2 import SkipV1Olmo2Config
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1Olmo2Attention(SkipV1AttentionMixin, Olmo2Attention):
    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        # OLMo-2's difference: the norms see the whole projection (all heads), before the split
        return (
            self.q_norm(self.q_proj(hidden_states)).view(hidden_shape),
            self.k_norm(self.k_proj(hidden_states)).view(hidden_shape),
            self.v_proj(hidden_states).view(hidden_shape),
        )


class SkipV1Olmo2DecoderLayer(Olmo2DecoderLayer):
    def __init__(self, config: SkipV1Olmo2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Olmo2Attention(config=config, layer_idx=layer_idx)


class SkipV1Olmo2PreTrainedModel(SkipV1PreTrainedMixin, Olmo2PreTrainedModel):
    config_class = SkipV1Olmo2Config
    config: SkipV1Olmo2Config
    _no_split_modules = ["SkipV1Olmo2DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1Olmo2DecoderLayer,
        "attentions": SkipV1Olmo2Attention,
    }


class SkipV1Olmo2Model(SkipV1ModelMixin, SkipV1Olmo2PreTrainedModel, Olmo2Model):
    decoder_layer_class = SkipV1Olmo2DecoderLayer


class SkipV1Olmo2ForCausalLM(SkipV1ForCausalLMMixin, SkipV1Olmo2PreTrainedModel, Olmo2ForCausalLM):
    base_model_class = SkipV1Olmo2Model


SkipV1Olmo2Config.register_for_auto_class()
SkipV1Olmo2ForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Olmo2ForCausalLM)

__all__ = [
    "SkipV1Olmo2Attention",
    "SkipV1Olmo2DecoderLayer",
    "SkipV1Olmo2ForCausalLM",
    "SkipV1Olmo2Model",
    "SkipV1Olmo2PreTrainedModel",
]
