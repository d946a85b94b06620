"""Prefill and decode throughput: greedy decoding with a DynamicCache, the loop generate() runs,
written out so that the two phases are timed apart. Medians over repeats, after one warm-up."""

import statistics
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class SpeedResult:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prefill_s: list[float]
    decode_s: list[float]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_generation(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> tuple:
    """Seconds for the prefill (which yields the first new token) and for the new_tokens - 1
    decoding steps after it."""
    device = next(model.parameters()).device
    prompt = prompt.to(device)
    cache = DynamicCache(config=model.config)
    _sync(device)
    start = time.perf_counter()
    logits = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    prefilled = time.perf_counter()
    for _ in range(new_tokens - 1):
        logits = model(input_ids=token, cache=cache, use_cache=True).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    return prefilled - start, time.perf_counter() - prefilled


def measure_speed(
    model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, repeats: int
) -> SpeedResult:
    """prompt: batch x prompt_len token ids, the same for every model of a run."""
    time_generation(model, prompt, min(new_tokens, 4))  # warm-up: allocator, kernels, caches
    runs = [time_generation(model, prompt, new_tokens) for _ in range(repeats)]
    prefill = [r[0] for r in runs]
    decode = [r[1] for r in runs]
    batch, prompt_len = prompt.shape
    return SpeedResult(
        prefill_tokens_per_s=batch * prompt_len / statistics.median(prefill),
        decode_tokens_per_s=batch * (new_tokens - 1) / statistics.median(decode),
        prefill_s=prefill,
        decode_s=decode,
    )
