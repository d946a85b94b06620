"""The SkipV1 model families. Importing this package imports neither torch nor transformers: each
class is imported on first access (PEP 562), and skipv1.auto_classes registers them with
transformers' Auto classes once transformers' auto modules are imported."""

import importlib

from ..families import FAMILIES

# class name -> the module of this package that defines it, for every family
CLASS_MODULES = {
    name: module
    for f in FAMILIES
    for module, names in (
        (f"configuration_skipv1_{f.name}", (f"SkipV1{f.class_prefix}Config",)),
        (f"modeling_skipv1_{f.name}", (f"SkipV1{f.class_prefix}Model", f.architecture)),
    )
    for name in names
}
__all__ = list(CLASS_MODULES)


def family_classes() -> dict[str, tuple[type, type]]:
    """model_type -> (config, causal LM) class of each family; the base model and decoder layer
    are `causal_lm.base_model_class` and its `decoder_layer_class`."""
    return {
        f.model_type: (_load(f"SkipV1{f.class_prefix}Config"), _load(f.architecture))
        for f in FAMILIES
    }


def _load(name: str) -> type:
    return getattr(importlib.import_module(f".{CLASS_MODULES[name]}", __name__), name)


def __getattr__(name: str):
    if name in CLASS_MODULES:
        return _load(name)
    if name == "FAMILY_CLASSES":
        return family_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
