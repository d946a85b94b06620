"""SkipV1Former on transformers' Phi-3: Phi-3, except that layers >= 1 compute only their first
`n_kv - s` value heads and read the last `s` from layer 0's value tensor. Phi-3 fuses q/k/v into
one `qkv_proj`; a later layer's has the value rows of its own heads only, and the split is
`SkipV1Phi3Config.qkv_rows`. The borrow logic, the cache layers and the loading check are the
family-independent core (`modeling_skipv1_core.py`); this file mixes them into the Phi-3 classes.
A sliding window is kept as Phi-3 has it, on every layer (Phi-3's model forward masks with it; the
cache holds the window in every layer, so a later layer's borrowed heads are layer 0's windowed
values at its own key positions: no full-length store).

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

import torch
from torch import nn
from transformers.models.phi3.modeling_phi3 import (
    Phi3Attention,
    Phi3DecoderLayer,
    Phi3ForCausalLM,
    Phi3Model,
    Phi3PreTrainedModel,
)

from .configuration_skipv1_phi3 import SkipV1Phi3Config
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1Phi3Attention(SkipV1AttentionMixin, Phi3Attention):
    def __init__(self, config: SkipV1Phi3Config, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.sliding_window = config.sliding_window  # every layer's, as Phi-3's attention

    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}

    def size_projections(self, config: SkipV1Phi3Config) -> None:
        self.qkv_rows = config.qkv_rows(self.layer_idx)
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.qkv_rows), bias=False)
        if config.o_proj_bias:
            self.o_proj = nn.Linear(
                config.num_attention_heads * self.head_dim, config.hidden_size, bias=True
            )

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        queries, keys, values = self.qkv_proj(hidden_states).split(self.qkv_rows, dim=-1)
        return queries.view(hidden_shape), keys.view(hidden_shape), values.view(hidden_shape)


class SkipV1Phi3DecoderLayer(Phi3DecoderLayer):
    def __init__(self, config: SkipV1Phi3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Phi3Attention(config=config, layer_idx=layer_idx)


class SkipV1Phi3PreTrainedModel(SkipV1PreTrainedMixin, Phi3PreTrainedModel):
    config_class = SkipV1Phi3Config
    config: SkipV1Phi3Config
    _no_split_modules = ["SkipV1Phi3DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1Phi3DecoderLayer,
        "attentions": SkipV1Phi3Attention,
    }


class SkipV1Phi3Model(SkipV1ModelMixin, SkipV1Phi3PreTrainedModel, Phi3Model):
    decoder_layer_class = SkipV1Phi3DecoderLayer


class SkipV1Phi3ForCausalLM(SkipV1ForCausalLMMixin, SkipV1Phi3PreTrainedModel, Phi3ForCausalLM):
    base_model_class = SkipV1Phi3Model


SkipV1Phi3Config.register_for_auto_class()
SkipV1Phi3ForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Phi3ForCausalLM)

__all__ = [
    "SkipV1Phi3Attention",
    "SkipV1Phi3DecoderLayer",
    "SkipV1Phi3ForCausalLM",
    "SkipV1Phi3Model",
    "SkipV1Phi3PreTrainedModel",
]
