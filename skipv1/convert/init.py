"""Initialisations of a later layer's smaller value projection from its source value heads.

Pure tensor functions over a v_proj weight `(n_kv * head_dim, hidden)` or bias `(n_kv * head_dim,)`;
they return the `(n_kv - s) * head_dim` rows the layer keeps as its own value heads.
"""

import torch

from .init_registry import INITS


def value_head_groups(num_kv_heads: int, skip_heads: int) -> tuple[tuple[int, ...], ...]:
    """Source heads 0..n_kv-1 split into n_kv - s contiguous groups as evenly as possible,
    larger groups first: (32, 16) -> (0,1),(2,3),...; (3, 1) -> (0,1),(2)."""
    own = num_kv_heads - skip_heads
    if not 0 < own <= num_kv_heads:
        raise ValueError(f"skip_heads={skip_heads} is out of range for {num_kv_heads} KV heads")
    base, extra = divmod(num_kv_heads, own)
    groups, start = [], 0
    for j in range(own):
        size = base + (1 if j < extra else 0)
        groups.append(tuple(range(start, start + size)))
        start += size
    return tuple(groups)


def _heads(tensor: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    if tensor.shape[0] % num_kv_heads:
        raise ValueError(f"{tuple(tensor.shape)} rows do not split into {num_kv_heads} heads")
    return tensor.reshape(num_kv_heads, tensor.shape[0] // num_kv_heads, *tensor.shape[1:])


def init_mean(tensor: torch.Tensor, num_kv_heads: int, skip_heads: int) -> torch.Tensor:
    """Own head j = mean of the source heads in group j (the paper's mean-pooling of V)."""
    # Accumulate in float32 so bf16/fp16 sources round once, at the end.
    heads = _heads(tensor, num_kv_heads).float()
    groups = value_head_groups(num_kv_heads, skip_heads)
    # The groups are two runs of equal sizes (larger first): one reshape-and-mean per run.
    pooled, start = [], 0
    for size in sorted({len(g) for g in groups}, reverse=True):
        count = sum(len(g) == size for g in groups)
        block = heads[start : start + count * size]
        pooled.append(block.reshape(count, size, *heads.shape[1:]).mean(dim=1))
        start += count * size
    out = torch.cat(pooled).to(tensor.dtype)
    return out.reshape(-1, *tensor.shape[1:]).contiguous()


def init_keep(tensor: torch.Tensor, num_kv_heads: int, skip_heads: int) -> torch.Tensor:
    """Own heads are source heads 0..n_kv-s-1; the rest are dropped."""
    head_dim = _heads(tensor, num_kv_heads).shape[1]
    return tensor[: (num_kv_heads - skip_heads) * head_dim].contiguous()


def apply_init(init: str, tensor: torch.Tensor, num_kv_heads: int, skip_heads: int) -> torch.Tensor:
    if init == "mean":
        return init_mean(tensor, num_kv_heads, skip_heads)
    if init == "keep":
        return init_keep(tensor, num_kv_heads, skip_heads)
    raise ValueError(f"unknown init {init!r}: choose one of {', '.join(INITS)}")
