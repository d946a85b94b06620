"""The inits `convert --init` knows, one module each, looked up by name (`get_init`). A new init
is one module here (see base.Init) plus its import below."""

from . import calibrated, keep, mean, reconstruct  # noqa: F401  (each registers itself)
from .base import INIT_REGISTRY, Init, get_init, value_head_groups

# The init that measures best (docs/results/post_conversion_smollm2.md); `mean` is the paper's.
DEFAULT_INIT = "reconstruct"
# The default first wherever the inits are listed (help, errors); the rest in import order.
INIT_REGISTRY[DEFAULT_INIT] = INIT_REGISTRY.pop(DEFAULT_INIT)
for _name in [n for n in INIT_REGISTRY if n != DEFAULT_INIT]:
    INIT_REGISTRY[_name] = INIT_REGISTRY.pop(_name)
INITS = tuple(INIT_REGISTRY)
CALIBRATED_INITS = tuple(name for name, init in INIT_REGISTRY.items() if init.calibrated)

__all__ = ["CALIBRATED_INITS", "DEFAULT_INIT", "INITS", "Init", "get_init", "value_head_groups"]
