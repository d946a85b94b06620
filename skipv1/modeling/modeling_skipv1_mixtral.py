"""SkipV1Former on transformers' Mixtral: Mixtral (Mistral's attention, a mixture-of-experts
MLP), except that layers >= 1 compute only their first `n_kv - s` value heads and read the last
`s` from layer 0's value tensor. The borrow logic, the cache layers and the loading check are
the family-independent core (`modeling_skipv1_core.py`); this file mixes them into the Mixtral
classes. The experts are Mixtral's own, loaded from the Hub's per-expert tensors by Mixtral's
weight conversion. A sliding window is kept as Mixtral has it, on every layer (Mixtral's model
forward masks with it; the cache holds the window in every layer, so a later layer's borrowed
heads are layer 0's windowed values at its own key positions: no full-length store).

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers and its sibling configuration, core and paged-cache files.
"""

from transformers.models.mixtral.modeling_mixtral import (
    MixtralAttention,
    MixtralDecoderLayer,
    MixtralForCausalLM,
    MixtralModel,
    MixtralPreTrainedModel,
)

from .configuration_skipv1_mixtral import SkipV1MixtralConfig
from .modeling_skipv1_core import (
    SkipV1AttentionMixin,
    SkipV1ForCausalLMMixin,
    SkipV1ModelMixin,
    SkipV1PreTrainedMixin,
    expose_in_transformers,
    share_weight_conversions,
)


class SkipV1MixtralAttention(SkipV1AttentionMixin, MixtralAttention):
    def __init__(self, config: SkipV1MixtralConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.sliding_window = config.sliding_window  # every layer's, as Mixtral's attention

    def attention_kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window}


class SkipV1MixtralDecoderLayer(MixtralDecoderLayer):
    def __init__(self, config: SkipV1MixtralConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1MixtralAttention(config=config, layer_idx=layer_idx)


class SkipV1MixtralPreTrainedModel(SkipV1PreTrainedMixin, MixtralPreTrainedModel):
    config_class = SkipV1MixtralConfig
    config: SkipV1MixtralConfig
    _no_split_modules = ["SkipV1MixtralDecoderLayer"]
    _can_record_outputs = {  # the router logits as Mixtral records them
        **MixtralPreTrainedModel._can_record_outputs,
        "hidden_states": SkipV1MixtralDecoderLayer,
        "attentions": SkipV1MixtralAttention,
    }


class SkipV1MixtralModel(SkipV1ModelMixin, SkipV1MixtralPreTrainedModel, MixtralModel):
    decoder_layer_class = SkipV1MixtralDecoderLayer


class SkipV1MixtralForCausalLM(
    SkipV1ForCausalLMMixin, SkipV1MixtralPreTrainedModel, MixtralForCausalLM
):
    base_model_class = SkipV1MixtralModel


share_weight_conversions(SkipV1MixtralConfig.model_type, "mixtral")
SkipV1MixtralConfig.register_for_auto_class()
SkipV1MixtralForCausalLM.register_for_auto_class("AutoModelForCausalLM")
expose_in_transformers(SkipV1MixtralForCausalLM)

__all__ = [
    "SkipV1MixtralAttention",
    "SkipV1MixtralDecoderLayer",
    "SkipV1MixtralForCausalLM",
    "SkipV1MixtralModel",
    "SkipV1MixtralPreTrainedModel",
]
