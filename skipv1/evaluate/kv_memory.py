"""KV-cache bytes per token, read from the cache object that generate() really filled, next to
the formula's value: a SkipV1 layer that cached more value heads than it should would show here."""

from dataclasses import dataclass

import torch

from ..modeling.layout import kv_layout


@dataclass(frozen=True)
class KVMeasurement:
    bytes_per_token: float  # measured: sum over layers of cached bytes / cached tokens / batch
    formula_bytes_per_token: int  # KVLayout.bytes_per_token at the cache's dtype
    cached_tokens: int
    dtype: str

    @property
    def matches_formula(self) -> bool:
        return self.bytes_per_token == self.formula_bytes_per_token


def cache_bytes_per_token(cache) -> tuple[float, int]:
    """Bytes per cached token summed over layers, and the tokens cached (per sequence).

    Each layer is divided by its own token count, so a layer that caches fewer positions
    (a sliding window) still counts what it holds per token; a sliding layer 0's full-length
    store of its borrowed value heads (`borrowed_values`) counts per token it holds.
    """
    total, tokens = 0.0, 0
    for layer in cache.layers:
        batch, _, seq, _ = layer.keys.shape
        total += (layer.keys.nbytes + layer.values.nbytes) / (batch * seq)
        tokens = max(tokens, seq)
        store = getattr(layer, "borrowed_values", None)
        if store is not None and store.numel():
            total += store.nbytes / (store.shape[0] * store.shape[2])
            tokens = max(tokens, store.shape[2])
    return total, tokens


@torch.inference_mode()
def measure_kv(model: torch.nn.Module, prompt: torch.Tensor) -> KVMeasurement:
    """Runs generate() on `prompt` (batch x prompt_len) for two new tokens, so the cache has seen
    prefill and one decoding step, and measures what it holds."""
    prompt = prompt.to(next(model.parameters()).device)
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=2,
        min_new_tokens=2,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=_pad_id(model),
    )
    measured, tokens = cache_bytes_per_token(out.cache)
    dtype = out.cache.layers[0].keys.dtype
    formula = kv_layout(model.config).bytes_per_token(dtype.itemsize)
    return KVMeasurement(measured, formula, tokens, str(dtype).removeprefix("torch."))


def _pad_id(model: torch.nn.Module) -> int:
    """generate() warns without a pad id; there is no padding here, any id will do."""
    for source in (model.generation_config, model.config):
        for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            if value is not None:
                return int(value)
    return 0


def max_batch(kv_bytes_per_token: float, context_len: int, budget_bytes: int) -> int:
    """Largest number of sequences of `context_len` tokens whose KV cache fits the budget."""
    return int(budget_bytes // (kv_bytes_per_token * context_len))
