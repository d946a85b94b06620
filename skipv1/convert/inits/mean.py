"""`--init mean` (the paper's): own head j is the mean of the source heads in group j."""

from .base import Init, register, split_heads, value_head_groups

# numpy adds a group's heads one by one from +0.0, which is torch's float32 order for groups of
# up to 4 heads (any s <= 3/4 of the KV heads; tests/test_arrays.py); larger groups, where
# torch's order depends on its kernels, go through torch so the output stays torch's.
NUMPY_GROUP_LIMIT = 4
MEAN_BLOCK = 1 << 18  # elements of a head summed per step (float32: 1 MB, cache-sized)


@register
class Mean(Init):
    name = "mean"
    rule = "the mean of source value heads in groups {groups}"
    takes_arrays = True

    def value_rows(self, tensor, num_kv_heads: int, skip_heads: int):
        return init_mean(tensor, num_kv_heads, skip_heads)


def init_mean(tensor, num_kv_heads: int, skip_heads: int):
    """Own head j = mean of the source heads in group j (the paper's mean-pooling of V), in
    float32, rounded once to the tensor's dtype. `tensor`: a torch tensor or an arrays.Array
    (the result is of the same kind)."""
    from ..arrays import Array

    groups = value_head_groups(num_kv_heads, skip_heads)
    if not isinstance(tensor, Array):
        return _torch_mean(tensor, num_kv_heads, groups)
    if max(map(len, groups)) > NUMPY_GROUP_LIMIT:
        return Array.from_torch(_torch_mean(tensor.to_torch(), num_kv_heads, groups))
    import numpy as np

    # Head h is a contiguous run of the tensor; the sum goes a block of each head at a time, so
    # the float32 temporaries stay in the CPU cache (4x faster than whole-tensor passes).
    heads = split_heads(np.ascontiguousarray(tensor.data), num_kv_heads).reshape(num_kv_heads, -1)
    per_head = heads.shape[1]
    own = np.empty((len(groups), per_head), tensor.dtype.storage)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as in torch, unwarned
        for j, group in enumerate(groups):
            for start in range(0, per_head, MEAN_BLOCK):
                stop = min(start + MEAN_BLOCK, per_head)
                total = np.zeros(stop - start, np.float32)  # +0.0, where torch starts
                for head in group:
                    total += Array(tensor.dtype, heads[head, start:stop]).float32()
                total /= np.float32(len(group))
                own[j, start:stop] = Array.from_float32(total, tensor.dtype).data
    return Array(tensor.dtype, own.reshape(-1, *tensor.shape[1:]))


def _torch_mean(tensor, num_kv_heads: int, groups):
    import torch

    # Accumulate in float32 so bf16/fp16 sources round once, at the end.
    heads = split_heads(tensor, num_kv_heads).float()
    # The groups are two runs of equal sizes (larger first): one reshape-and-mean per run.
    pooled, start = [], 0
    for size in sorted({len(g) for g in groups}, reverse=True):
        count = sum(len(g) == size for g in groups)
        block = heads[start : start + count * size]
        pooled.append(block.reshape(count, size, *heads.shape[1:]).mean(dim=1))
        start += count * size
    out = torch.cat(pooled).to(tensor.dtype)
    return out.reshape(-1, *tensor.shape[1:]).contiguous()
