"""The SkipV1 classes registered with transformers' Auto classes, without importing transformers.

`import skipv1` must let `AutoConfig` / `AutoModelForCausalLM.from_pretrained(converted_dir)`
work, but importing transformers costs seconds (it imports torch), which commands such as
`skipv1 convert --init mean` never need. So `install()` (run by `import skipv1`) registers now
if transformers' auto modules are already imported, and otherwise puts a finder on
`sys.meta_path` that registers as soon as they are.

Why not a plain post-import hook on `transformers.models.auto.modeling_auto` (wrapt's
`register_post_import_hook`, or the same in importlib)? That module is often imported from inside
another half-imported one: `from transformers import LlamaForCausalLM` runs modeling_llama, which
imports modeling_layers, which imports AutoModel. Registering there would import our modeling
code, which subclasses modeling_llama's classes before they exist. So the finder counts, per
thread, the transformers and skipv1.modeling modules being executed and registers when the
outermost of them has finished: then every module the registration imports is complete."""

import importlib.abc
import sys
import threading
import warnings

# Registering needs one of these imported (where the Auto classes keep their mappings).
AUTO_MODULES = (
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.modeling_auto",
)
# Modules whose execution is counted: transformers' and ours (which import transformers').
COUNTED = ("transformers", "skipv1.modeling")

_lock = threading.RLock()
_state = threading.local()  # .depth: counted modules executing in this thread
_registered = False


def register() -> None:
    """Registers every family's config, base model and causal LM with the Auto classes now
    (imports transformers and the model code); safe to call again."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True  # first: the imports below come back through the finder
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AutoClassesFinder)]
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

        from .modeling import family_classes

        for config, causal_lm in family_classes().values():
            AutoConfig.register(config.model_type, config, exist_ok=True)
            AutoModel.register(config, causal_lm.base_model_class, exist_ok=True)
            AutoModelForCausalLM.register(config, causal_lm, exist_ok=True)


def install() -> None:
    """Registers now if transformers' auto modules are imported, else when they are."""
    if any(_imported(name) for name in AUTO_MODULES):
        register()
    elif not any(isinstance(f, _AutoClassesFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AutoClassesFinder())


def _imported(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def _register_when_ready() -> None:
    if _registered or getattr(_state, "depth", 0):
        return
    if not any(name in sys.modules for name in AUTO_MODULES):
        return
    try:
        register()
    except Exception as err:  # never break the user's import of transformers
        warnings.warn(
            f"skipv1 could not register its classes with transformers: {err!r}", stacklevel=2
        )


class _AutoClassesFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give a counted module."""

    def find_spec(self, name, path=None, target=None):
        if _registered or not any(name == c or name.startswith(c + ".") for c in COUNTED):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CountingLoader(spec.loader)
                return spec
        return None


class _CountingLoader(importlib.abc.Loader):
    """The module's own loader, with its execution counted; everything else delegated."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            self._loader.exec_module(module)
        finally:
            _state.depth -= 1
        _register_when_ready()

    def __getattr__(self, name):
        return getattr(self._loader, name)
