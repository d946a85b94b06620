"""`--init mean` (the paper's): own head j is the mean of the source heads in group j."""

from .base import Init, register, split_heads, value_head_groups


@register
class Mean(Init):
    name = "mean"
    rule = "the mean of source value heads in groups {groups}"

    def value_rows(self, tensor, num_kv_heads: int, skip_heads: int):
        return init_mean(tensor, num_kv_heads, skip_heads)


def init_mean(tensor, num_kv_heads: int, skip_heads: int):
    """Own head j = mean of the source heads in group j (the paper's mean-pooling of V)."""
    import torch

    # Accumulate in float32 so bf16/fp16 sources round once, at the end.
    heads = split_heads(tensor, num_kv_heads).float()
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
