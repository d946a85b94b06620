"""skipv1: convert Llama-family checkpoints to SkipV1Former and uptrain them."""

from .modeling import SkipV1LlamaConfig, SkipV1LlamaForCausalLM, SkipV1LlamaModel

__version__ = "0.1.0"
__all__ = ["SkipV1LlamaConfig", "SkipV1LlamaForCausalLM", "SkipV1LlamaModel", "__version__"]
