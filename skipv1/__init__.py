"""skipv1: convert Llama-family and Qwen3 checkpoints to SkipV1Former and uptrain them."""

from . import modeling
from .modeling import *  # noqa: F403  (the model classes, registered with the Auto classes)

__version__ = "0.1.0"
__all__ = [*modeling.__all__, "__version__"]
