"""SkipV1Former on transformers' GPT-NeoX: GPT-NeoX (partial rotary, parallel residual), except
that layers >= 1 compute only their first `n - s` value heads and read the last `s` from layer
0's value tensor. The fused `query_key_value` is interleaved per head; a later layer's keeps
[q_h k_h v_h] for its own heads, then [q_h k_h] for the borrowed ones (see the config). The borrow
logic, the cache layers and the loading check are the family-independent core
(`modeling_skipv1_core.py`); this file mixes them into the GPT-NeoX classes.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

import torch
from torch import nn
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.models.gpt_neox.modeling_gpt_neox import (
    GPTNeoXAttention,
    GPTNeoXForCausalLM,
    GPTNeoXLayer,
    GPTNeoXModel,
    GPTNeoXPreTrainedModel,
    apply_rotary_pos_emb,
)

from .configuration_skipv1_gpt_neox import SkipV1GPTNeoXConfig
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
)


class SkipV1GPTNeoXAttention(SkipV1AttentionMixin, GPTNeoXAttention):
    def size_projections(self, config: SkipV1GPTNeoXConfig) -> None:
        self.head_dim, self.num_key_value_groups = self.head_size, 1  # the core's names
        heads, d = config.num_attention_heads, self.head_size
        rows = (2 * heads + self.own_value_heads) * d
        self.query_key_value = nn.Linear(config.hidden_size, rows, bias=config.attention_bias)
        if config.o_proj_bias != config.attention_bias:
            self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.o_proj_bias)

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        qkv = self.query_key_value(hidden_states)
        own, d = self.own_value_heads, self.head_dim
        full = qkv[..., : own * 3 * d].view(*hidden_shape[:-2], own, 3 * d)
        part = qkv[..., own * 3 * d :].view(*hidden_shape[:-2], -1, 2 * d)
        q_own, k_own, values = full.chunk(3, dim=-1)
        q_rest, k_rest = part.chunk(2, dim=-1)
        return torch.cat([q_own, q_rest], dim=-2), torch.cat([k_own, k_rest], dim=-2), values

    def rotate(self, queries, keys, position_embeddings) -> tuple:
        cos, sin = position_embeddings  # partial rotary: the first rotary_ndims of each head
        return apply_rotary_pos_emb(queries, keys, cos, sin)

    def output(self, attn_output: torch.Tensor) -> torch.Tensor:
        return self.dense(attn_output)

    def forward(self, hidden_states, attention_mask, layer_past=None, **kwargs):
        # GPT-NeoX's layers pass the cache as `layer_past`
        return super().forward(
            hidden_states, attention_mask=attention_mask, cache=layer_past, **kwargs
        )


class SkipV1GPTNeoXLayer(GPTNeoXLayer):
    def __init__(self, config: SkipV1GPTNeoXConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.attention = SkipV1GPTNeoXAttention(config, layer_idx)


class SkipV1GPTNeoXPreTrainedModel(SkipV1PreTrainedMixin, GPTNeoXPreTrainedModel):
    config_class = SkipV1GPTNeoXConfig
    config: SkipV1GPTNeoXConfig
    _no_split_modules = ["SkipV1GPTNeoXLayer"]
    _can_record_outputs = {
        "hidden_states": SkipV1GPTNeoXLayer,
        "attentions": SkipV1GPTNeoXAttention,
    }


class SkipV1GPTNeoXModel(SkipV1ModelMixin, SkipV1GPTNeoXPreTrainedModel, GPTNeoXModel):
    decoder_layer_class = SkipV1GPTNeoXLayer


class SkipV1GPTNeoXForCausalLM(
    SkipV1ForCausalLMMixin, SkipV1GPTNeoXPreTrainedModel, GPTNeoXForCausalLM
):
    base_model_class = SkipV1GPTNeoXModel


# GPT-NeoX checkpoints name the output head `embed_out`; transformers renames it for its own
# class name only, so the converted checkpoints (which keep the source's names) need it too.
register_checkpoint_conversion_mapping(
    SkipV1GPTNeoXForCausalLM.__name__,
    get_checkpoint_conversion_mapping("GPTNeoXForCausalLM") or [],
    overwrite=True,
)
SkipV1GPTNeoXConfig.register_for_auto_class()
SkipV1GPTNeoXForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1GPTNeoXForCausalLM)

__all__ = [
    "SkipV1GPTNeoXAttention",
    "SkipV1GPTNeoXForCausalLM",
    "SkipV1GPTNeoXLayer",
    "SkipV1GPTNeoXModel",
    "SkipV1GPTNeoXPreTrainedModel",
]
