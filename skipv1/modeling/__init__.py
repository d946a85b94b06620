"""The SkipV1 model family, registered with transformers' Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_skipv1_llama import SkipV1LlamaConfig
from .modeling_skipv1_llama import SkipV1LlamaForCausalLM, SkipV1LlamaModel

AutoConfig.register(SkipV1LlamaConfig.model_type, SkipV1LlamaConfig, exist_ok=True)
AutoModel.register(SkipV1LlamaConfig, SkipV1LlamaModel, exist_ok=True)
AutoModelForCausalLM.register(SkipV1LlamaConfig, SkipV1LlamaForCausalLM, exist_ok=True)

__all__ = ["SkipV1LlamaConfig", "SkipV1LlamaForCausalLM", "SkipV1LlamaModel"]
