"""`--init keep`: the own heads are the source's first heads; the rest are dropped."""

from .base import Init, register, split_heads


@register
class Keep(Init):
    name = "keep"
    rule = "source value heads 0..{own_last}"
    takes_arrays = True

    def groups(self, num_kv_heads: int, skip_heads: int) -> tuple[tuple[int, ...], ...]:
        return tuple((j,) for j in range(num_kv_heads - skip_heads))

    def value_rows(self, tensor, num_kv_heads: int, skip_heads: int):
        return init_keep(tensor, num_kv_heads, skip_heads)


def init_keep(tensor, num_kv_heads: int, skip_heads: int):
    """Own heads are source heads 0..n_kv-s-1; the rest are dropped. `tensor`: a torch tensor
    or an arrays.Array (the result is of the same kind)."""
    from ..arrays import Array

    if isinstance(tensor, Array):
        head_dim = split_heads(tensor.data, num_kv_heads).shape[1]
        return tensor.rows((num_kv_heads - skip_heads) * head_dim)
    head_dim = split_heads(tensor, num_kv_heads).shape[1]
    return tensor[: (num_kv_heads - skip_heads) * head_dim].contiguous()
