"""The SkipV1 model families, registered with transformers' Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_skipv1_llama import SkipV1LlamaConfig
from .configuration_skipv1_qwen3 import SkipV1Qwen3Config
from .modeling_skipv1_llama import SkipV1LlamaForCausalLM, SkipV1LlamaModel
from .modeling_skipv1_qwen3 import SkipV1Qwen3ForCausalLM, SkipV1Qwen3Model

for _config, _model, _causal_lm in (
    (SkipV1LlamaConfig, SkipV1LlamaModel, SkipV1LlamaForCausalLM),
    (SkipV1Qwen3Config, SkipV1Qwen3Model, SkipV1Qwen3ForCausalLM),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)

__all__ = [
    "SkipV1LlamaConfig",
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1Qwen3Config",
    "SkipV1Qwen3ForCausalLM",
    "SkipV1Qwen3Model",
]
