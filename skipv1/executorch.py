"""torch.export / ExecuTorch programs of SkipV1 models that keep the KV saving.

transformers' `TorchExportableModuleWithStaticCache` allocates every layer's value buffer with
the key heads' count before the model is first called, and the exported program keeps those
buffers, so a later layer would use only part of a full-width buffer. The subclass here swaps
the later layers' cache for ones holding only their own value heads before the buffers are
registered; everything else (forward signature, buffer names, ExecuTorch runner) is the
parent's. The same holds for the hybrid-cache wrapper the recipe builds for a config with
layer_types and a sliding window (Gemma 2/3, a windowed Qwen3): it backs every layer by a
full-length StaticLayer (sliding masks over it), so layer 0 keeps every position and the later
layers need only their own value heads there too."""

import torch
from transformers.integrations.executorch import (
    TorchExportableModuleForDecoderOnlyLM,
    TorchExportableModuleWithStaticCache,
)

from .modeling.static_cache_skipv1 import use_skipv1_static_layers


def _check_skipv1(model, wrapper: str) -> None:
    if not hasattr(model.config.get_text_config(), "own_value_heads"):
        raise ValueError(
            f"SkipV1{wrapper} takes a SkipV1 model, not a {type(model).__name__}: export a stock "
            f"model with transformers' {wrapper}."
        )


def _keep_the_saving(wrapper: torch.nn.Module) -> None:
    """Swap the wrapper's later cache layers for ones holding only their own value heads and
    register their tensors under the parent's buffer names (the full-width ones are freed).
    The static wrapper holds its cache as `static_cache`, the hybrid one as `cache`."""
    cache = getattr(wrapper, "static_cache", None) or wrapper.cache
    use_skipv1_static_layers(cache, wrapper.model.config.get_text_config())
    for i, layer in enumerate(cache.layers):
        wrapper.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
        wrapper.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
        wrapper.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)


class SkipV1ExportableModuleWithStaticCache(TorchExportableModuleWithStaticCache):
    """`TorchExportableModuleWithStaticCache` for a SkipV1 model: same arguments and program,
    later layers' value buffers sized to their own heads."""

    def __init__(self, model, batch_size=None, max_cache_len=None, device=None):
        _check_skipv1(model, "TorchExportableModuleWithStaticCache")
        super().__init__(model, batch_size, max_cache_len, device)
        _keep_the_saving(self)


class SkipV1ExportableModuleForDecoderOnlyLM(TorchExportableModuleForDecoderOnlyLM):
    """`TorchExportableModuleForDecoderOnlyLM` (the recipe optimum-executorch exports) for a
    SkipV1 model: its static-cache program, and the hybrid-cache one it builds for a config with
    layer_types and a sliding window, keep the saving."""

    def __init__(self, model, batch_size=None, max_cache_len=None, device=None):
        _check_skipv1(model, "TorchExportableModuleForDecoderOnlyLM")
        super().__init__(model, batch_size, max_cache_len, device)
        _keep_the_saving(self.model)


def convert_and_export_with_cache(
    model,
    example_input_ids: torch.Tensor | None = None,
    example_cache_position: torch.Tensor | None = None,
    dynamic_shapes: dict | None = None,
    strict: bool | None = None,
) -> torch.export.ExportedProgram:
    """transformers' `convert_and_export_with_cache` for a SkipV1 model (same arguments): the
    exported program stores only each later layer's own value heads."""
    if example_input_ids is None:
        example_input_ids = torch.tensor([[1]], dtype=torch.long, device=model.device)
    if example_cache_position is None:
        example_cache_position = torch.tensor([0], dtype=torch.long, device=model.device)
    with torch.no_grad():
        return torch.export.export(
            SkipV1ExportableModuleWithStaticCache(model),
            args=(),
            kwargs={"input_ids": example_input_ids, "cache_position": example_cache_position},
            dynamic_shapes=dynamic_shapes,
            strict=True if strict is None else strict,
        )
