"""MHA/GQA -> GQA with fewer KV heads by mean-pooling K and V heads (Ainslie et al., 2023).

Used only as the outside anchor in bench/recovery.py, so it lives next to it, not in the package.
Adjacent KV heads are averaged in groups (heads 0..g-1 -> new head 0, ...), which keeps the query
heads that read them in place: with grouped-query attention query head q reads KV head
q // (heads / n_kv), so pooling adjacent KV heads keeps every query head reading the pooled
version of the head it read before. The result is an ordinary Llama-family checkpoint with
`num_key_value_heads` lowered.
"""

import re
from pathlib import Path

import torch

from skipv1.errors import SkipV1Error

KV_TENSOR = re.compile(r"\.self_attn\.(k_proj|v_proj)\.(weight|bias)$")


def pool_kv_tensor(tensor: torch.Tensor, num_kv_heads: int, new_kv_heads: int) -> torch.Tensor:
    """Means of adjacent groups of heads along dim 0 (rows of a k/v projection or its bias)."""
    head_dim = tensor.shape[0] // num_kv_heads
    group = num_kv_heads // new_kv_heads
    rest = tensor.shape[1:]
    pooled = tensor.float().reshape(new_kv_heads, group, head_dim, *rest).mean(dim=1)
    return pooled.reshape(new_kv_heads * head_dim, *rest).to(tensor.dtype)


def pool_kv_state_dict(
    state: dict[str, torch.Tensor], num_kv_heads: int, new_kv_heads: int
) -> dict[str, torch.Tensor]:
    """A state dict with every layer's K and V projections pooled to `new_kv_heads` heads."""
    if new_kv_heads <= 0 or num_kv_heads % new_kv_heads:
        raise SkipV1Error(
            f"cannot pool {num_kv_heads} KV heads into {new_kv_heads}: use a divisor of "
            f"{num_kv_heads}"
        )
    return {
        name: pool_kv_tensor(t, num_kv_heads, new_kv_heads) if KV_TENSOR.search(name) else t
        for name, t in state.items()
    }


def write_pooled_gqa(src: "str | Path", dst: "str | Path", new_kv_heads: int) -> Path:
    """Loads a (small) Llama-family checkpoint, pools its K/V heads and saves it with its
    tokenizer as a plain checkpoint of the same architecture."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    config = model.config
    n_kv = config.num_key_value_heads or config.num_attention_heads
    pooled = pool_kv_state_dict(model.state_dict(), n_kv, new_kv_heads)
    config.num_key_value_heads = new_kv_heads
    target = type(model)(config)
    target.load_state_dict(pooled)
    target.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return Path(dst)
