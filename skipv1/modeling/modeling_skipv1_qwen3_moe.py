"""SkipV1Former on transformers' Qwen3-MoE: Qwen3-MoE (Qwen3's attention with RMSNorm on each
head's queries and keys, a mixture-of-experts MLP), except that layers >= 1 compute only their
first `n_kv - s` value heads and read the last `s` from layer 0's value tensor. The borrow
logic, the cache layers and the loading check are the family-independent core
(`modeling_skipv1_core.py`); this file mixes them into the Qwen3-MoE classes. The experts are
Qwen3-MoE's own, loaded from the Hub's per-expert tensors by its weight conversion.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeAttention,
    Qwen3MoeDecoderLayer,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
    Qwen3MoePreTrainedModel,
)

from .configuration_skipv1_qwen3_moe import SkipV1Qwen3MoeConfig
from .modeling_skipv1_core import (
    PerHeadQKNormMixin,
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
    share_weight_conversions,
)


class SkipV1Qwen3MoeAttention(PerHeadQKNormMixin, SkipV1AttentionMixin, Qwen3MoeAttention):
    # the per-head q/k norms are the difference
    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}  # every layer's (Qwen3-MoE's attention)


class SkipV1Qwen3MoeDecoderLayer(Qwen3MoeDecoderLayer):
    def __init__(self, config: SkipV1Qwen3MoeConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1Qwen3MoeAttention(config=config, layer_idx=layer_idx)


class SkipV1Qwen3MoePreTrainedModel(SkipV1PreTrainedMixin, Qwen3MoePreTrainedModel):
    config_class = SkipV1Qwen3MoeConfig
    config: SkipV1Qwen3MoeConfig
    _no_split_modules = ["SkipV1Qwen3MoeDecoderLayer"]
    _can_record_outputs = {  # the router logits as Qwen3-MoE records them
        **Qwen3MoePreTrainedModel._can_record_outputs,
        "hidden_states": SkipV1Qwen3MoeDecoderLayer,
        "attentions": SkipV1Qwen3MoeAttention,
    }


class SkipV1Qwen3MoeModel(SkipV1ModelMixin, SkipV1Qwen3MoePreTrainedModel, Qwen3MoeModel):
    decoder_layer_class = SkipV1Qwen3MoeDecoderLayer


class SkipV1Qwen3MoeForCausalLM(
    SkipV1ForCausalLMMixin, SkipV1Qwen3MoePreTrainedModel, Qwen3MoeForCausalLM
):
    base_model_class = SkipV1Qwen3MoeModel


share_weight_conversions(SkipV1Qwen3MoeConfig.model_type, "qwen3_moe")
SkipV1Qwen3MoeConfig.register_for_auto_class()
SkipV1Qwen3MoeForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1Qwen3MoeForCausalLM)

__all__ = [
    "SkipV1Qwen3MoeAttention",
    "SkipV1Qwen3MoeDecoderLayer",
    "SkipV1Qwen3MoeForCausalLM",
    "SkipV1Qwen3MoeModel",
    "SkipV1Qwen3MoePreTrainedModel",
]
