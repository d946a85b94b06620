"""skipv1: convert Llama-family and Qwen3 checkpoints to SkipV1Former and uptrain them.

`import skipv1` is cheap (no torch, no transformers): the model classes are imported on first
access (`from skipv1 import SkipV1LlamaForCausalLM`), and they are registered with transformers'
Auto classes as soon as those are imported (see auto_classes.py)."""

from . import auto_classes
from .modeling import CLASS_MODULES

auto_classes.install()

__version__ = "0.1.0"
__all__ = [*CLASS_MODULES, "__version__"]


def __getattr__(name: str):
    if name in CLASS_MODULES:
        from . import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
