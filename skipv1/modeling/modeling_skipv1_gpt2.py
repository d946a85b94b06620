"""SkipV1Former on transformers' GPT-2: GPT-2 (learned positions, Conv1D projections), except
that layers >= 1 compute only their first `n - s` value heads and read the last `s` from layer
0's value tensor. A later layer's fused `c_attn` has the value columns of its own heads only
(see the config). The borrow logic, the cache layers and the loading check are the
family-independent core (`modeling_skipv1_core.py`); this file mixes them into the GPT-2 classes.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

import torch
from transformers.models.gpt2.modeling_gpt2 import (
    GPT2Attention,
    GPT2Block,
    GPT2LMHeadModel,
    GPT2Model,
    GPT2PreTrainedModel,
)
from transformers.pytorch_utils import Conv1D

from .configuration_skipv1_gpt2 import SkipV1GPT2Config
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1GPT2Attention(SkipV1AttentionMixin, GPT2Attention):
    def size_projections(self, config: SkipV1GPT2Config) -> None:
        self.num_key_value_groups, self.attention_dropout = 1, config.attn_pdrop  # the core's
        d = self.head_dim
        self.qkv_columns = (self.num_heads * d, self.num_heads * d, self.own_value_heads * d)
        self.c_attn = Conv1D(sum(self.qkv_columns), self.embed_dim)

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        queries, keys, values = self.c_attn(hidden_states).split(self.qkv_columns, dim=-1)
        return queries.view(hidden_shape), keys.view(hidden_shape), values.view(hidden_shape)

    def rotate(self, queries, keys, position_embeddings) -> tuple:
        return queries, keys  # learned absolute positions, added to the embeddings

    def output(self, attn_output: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.c_proj(attn_output))


class SkipV1GPT2Block(GPT2Block):
    def __init__(self, config: SkipV1GPT2Config, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.attn = SkipV1GPT2Attention(config=config, layer_idx=layer_idx)


class SkipV1GPT2PreTrainedModel(SkipV1PreTrainedMixin, GPT2PreTrainedModel):
    config_class = SkipV1GPT2Config
    config: SkipV1GPT2Config
    _no_split_modules = ["SkipV1GPT2Block"]
    _can_record_outputs = {"hidden_states": SkipV1GPT2Block, "attentions": SkipV1GPT2Attention}


class SkipV1GPT2Model(SkipV1ModelMixin, SkipV1GPT2PreTrainedModel, GPT2Model):
    decoder_layer_class = SkipV1GPT2Block
    layers_attribute = "h"


class SkipV1GPT2ForCausalLM(SkipV1ForCausalLMMixin, SkipV1GPT2PreTrainedModel, GPT2LMHeadModel):
    base_model_class = SkipV1GPT2Model


SkipV1GPT2Config.register_for_auto_class()
SkipV1GPT2ForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1GPT2ForCausalLM)

__all__ = [
    "SkipV1GPT2Attention",
    "SkipV1GPT2Block",
    "SkipV1GPT2ForCausalLM",
    "SkipV1GPT2Model",
    "SkipV1GPT2PreTrainedModel",
]
