"""The SkipV1 model families, registered with transformers' Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_skipv1_gemma2 import SkipV1Gemma2Config
from .configuration_skipv1_gemma3_text import SkipV1Gemma3TextConfig
from .configuration_skipv1_gpt2 import SkipV1GPT2Config
from .configuration_skipv1_gpt_neox import SkipV1GPTNeoXConfig
from .configuration_skipv1_llama import SkipV1LlamaConfig
from .configuration_skipv1_mixtral import SkipV1MixtralConfig
from .configuration_skipv1_olmo2 import SkipV1Olmo2Config
from .configuration_skipv1_phi3 import SkipV1Phi3Config
from .configuration_skipv1_qwen3 import SkipV1Qwen3Config
from .configuration_skipv1_qwen3_moe import SkipV1Qwen3MoeConfig
from .modeling_skipv1_gemma2 import SkipV1Gemma2ForCausalLM, SkipV1Gemma2Model
from .modeling_skipv1_gemma3_text import SkipV1Gemma3TextForCausalLM, SkipV1Gemma3TextModel
from .modeling_skipv1_gpt2 import SkipV1GPT2ForCausalLM, SkipV1GPT2Model
from .modeling_skipv1_gpt_neox import SkipV1GPTNeoXForCausalLM, SkipV1GPTNeoXModel
from .modeling_skipv1_llama import SkipV1LlamaForCausalLM, SkipV1LlamaModel
from .modeling_skipv1_mixtral import SkipV1MixtralForCausalLM, SkipV1MixtralModel
from .modeling_skipv1_olmo2 import SkipV1Olmo2ForCausalLM, SkipV1Olmo2Model
from .modeling_skipv1_phi3 import SkipV1Phi3ForCausalLM, SkipV1Phi3Model
from .modeling_skipv1_qwen3 import SkipV1Qwen3ForCausalLM, SkipV1Qwen3Model
from .modeling_skipv1_qwen3_moe import SkipV1Qwen3MoeForCausalLM, SkipV1Qwen3MoeModel

# model_type -> (config, causal LM) class of each family; the base model and decoder layer are
# `causal_lm.base_model_class` and its `decoder_layer_class`.
FAMILY_CLASSES = {
    SkipV1LlamaConfig.model_type: (SkipV1LlamaConfig, SkipV1LlamaForCausalLM),
    SkipV1Qwen3Config.model_type: (SkipV1Qwen3Config, SkipV1Qwen3ForCausalLM),
    SkipV1Gemma2Config.model_type: (SkipV1Gemma2Config, SkipV1Gemma2ForCausalLM),
    SkipV1Gemma3TextConfig.model_type: (SkipV1Gemma3TextConfig, SkipV1Gemma3TextForCausalLM),
    SkipV1Phi3Config.model_type: (SkipV1Phi3Config, SkipV1Phi3ForCausalLM),
    SkipV1GPTNeoXConfig.model_type: (SkipV1GPTNeoXConfig, SkipV1GPTNeoXForCausalLM),
    SkipV1GPT2Config.model_type: (SkipV1GPT2Config, SkipV1GPT2ForCausalLM),
    SkipV1Olmo2Config.model_type: (SkipV1Olmo2Config, SkipV1Olmo2ForCausalLM),
    SkipV1MixtralConfig.model_type: (SkipV1MixtralConfig, SkipV1MixtralForCausalLM),
    SkipV1Qwen3MoeConfig.model_type: (SkipV1Qwen3MoeConfig, SkipV1Qwen3MoeForCausalLM),
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
    "SkipV1GPT2Config",
    "SkipV1GPT2ForCausalLM",
    "SkipV1GPT2Model",
    "SkipV1GPTNeoXConfig",
    "SkipV1GPTNeoXForCausalLM",
    "SkipV1GPTNeoXModel",
    "SkipV1LlamaConfig",
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1Phi3Config",
    "SkipV1Phi3ForCausalLM",
    "SkipV1Phi3Model",
    "SkipV1Qwen3Config",
    "SkipV1Qwen3ForCausalLM",
    "SkipV1Qwen3Model",
    "SkipV1Olmo2Config",
    "SkipV1Olmo2ForCausalLM",
    "SkipV1Olmo2Model",
    "SkipV1MixtralConfig",
    "SkipV1MixtralForCausalLM",
    "SkipV1MixtralModel",
    "SkipV1Qwen3MoeConfig",
    "SkipV1Qwen3MoeForCausalLM",
    "SkipV1Qwen3MoeModel",
]
