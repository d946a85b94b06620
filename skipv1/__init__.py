"""skipv1: convert Llama-family and Qwen3 checkpoints to SkipV1Former and uptrain them."""

from .modeling import (
    SkipV1LlamaConfig,
    SkipV1LlamaForCausalLM,
    SkipV1LlamaModel,
    SkipV1Qwen3Config,
    SkipV1Qwen3ForCausalLM,
    SkipV1Qwen3Model,
)

__version__ = "0.1.0"
__all__ = [
    "SkipV1LlamaConfig",
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1Qwen3Config",
    "SkipV1Qwen3ForCausalLM",
    "SkipV1Qwen3Model",
    "__version__",
]
