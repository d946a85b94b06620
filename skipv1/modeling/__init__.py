"""The SkipV1 model families, registered with transformers' Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_skipv1_gemma2 import SkipV1Gemma2Config
from .configuration_skipv1_gemma3_text import SkipV1Gemma3TextConfig
from .configuration_skipv1_llama import SkipV1LlamaConfig
from .configuration_skipv1_qwen3 import SkipV1Qwen3Config
from .modeling_skipv1_gemma2 import SkipV1Gemma2ForCausalLM, SkipV1Gemma2Model
from .modeling_skipv1_gemma3_text import SkipV1Gemma3TextForCausalLM, SkipV1Gemma3TextModel
from .modeling_skipv1_llama import SkipV1LlamaForCausalLM, SkipV1LlamaModel
from .modeling_skipv1_qwen3 import SkipV1Qwen3ForCausalLM, SkipV1Qwen3Model

# model_type -> (config, causal LM) class of each family; the base model and decoder layer are
# `causal_lm.base_model_class` and its `decoder_layer_class`.
FAMILY_CLASSES = {
    SkipV1LlamaConfig.model_type: (SkipV1LlamaConfig, SkipV1LlamaForCausalLM),
    SkipV1Qwen3Config.model_type: (SkipV1Qwen3Config, SkipV1Qwen3ForCausalLM),
    SkipV1Gemma2Config.model_type: (SkipV1Gemma2Config, SkipV1Gemma2ForCausalLM),
    SkipV1Gemma3TextConfig.model_type: (SkipV1Gemma3TextConfig, SkipV1Gemma3TextForCausalLM),
}
for _config, _causal_lm in FAMILY_CLASSES.values():
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _causal_lm.base_model_class, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)

__all__ = [
    "SkipV1Gemma2Config",
    "SkipV1Gemma2ForCausalLM",
    "SkipV1Gemma2Model",
    "SkipV1Gemma3TextConfig",
    "SkipV1Gemma3TextForCausalLM",
    "SkipV1Gemma3TextModel",
    "SkipV1LlamaConfig",
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1Qwen3Config",
    "SkipV1Qwen3ForCausalLM",
    "SkipV1Qwen3Model",
]
