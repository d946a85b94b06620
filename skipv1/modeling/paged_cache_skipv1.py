"""Continuous batching for SkipV1: a paged-cache allocator whose later layers store only their
own value heads.

transformers' `FullAttentionCacheAllocator` gives every layer a page of n_kv key heads and n_kv
value heads. Here a block (`page_size` tokens of every layer) is laid out as

    [ L0 keys | L0 values (n_kv heads) | L1 keys | L1 own values (n_kv - s) | L2 keys | ... ]

so a block takes exactly the bytes of the SkipV1 KV formula, and a cache of a given size holds
(n_kv L * 2) / (n_kv L * 2 - s (L - 1)) times the tokens of the source's. The whole block is one
"page" for the base class's arithmetic, and the logical index of a token slot is
`block * page_size + offset`, which `update` splits to address each layer's strided view.

`register()` puts a dispatcher in transformers' attention-type -> allocator registry: SkipV1
configs get this allocator, every other model gets the stock one, unchanged. This file is copied
next to converted weights with the modeling file, so it imports only transformers.
"""

import torch
from transformers.generation.continuous_batching import cache as paged_cache
from transformers.generation.continuous_batching.cache_allocators import (
    FULL_ATTENTION,
    FullAttentionCacheAllocator,
)
from transformers.generation.continuous_batching.utils import find_head_dim


def value_heads_per_layer(config, layer_indices: list[int], kv_heads: int) -> dict[int, int]:
    if kv_heads != config.num_key_value_heads:
        raise ValueError(
            "tensor-parallel continuous batching is not supported for SkipV1 checkpoints yet"
        )
    return {i: config.own_value_heads(i) for i in layer_indices}


class SkipV1CacheAllocator(FullAttentionCacheAllocator):
    """Full-attention allocator with per-layer value page sizes (see the module docstring)."""

    # The flash block-table decode path reads K and V pages of one shape; it is left off, so
    # decoding reads through the index path like eager and SDPA do.
    supports_block_table = False

    def __init__(
        self,
        index: int,
        config,
        num_key_value_heads: int,
        cache_dtype: torch.dtype,
        page_size: int,
        layer_indices: list[int],
        allow_block_sharing: bool,
    ) -> None:
        self.head_dim = find_head_dim(config)
        self.num_key_value_heads = num_key_value_heads
        self.cache_dtype = cache_dtype
        self.value_heads = value_heads_per_layer(config, layer_indices, num_key_value_heads)
        # elements of one layer's keys and values in a block, in layer order
        self.layer_elements = {
            i: page_size * (num_key_value_heads + v) * self.head_dim
            for i, v in self.value_heads.items()
        }
        block_bytes = sum(self.layer_elements.values()) * cache_dtype.itemsize
        self._before_cache_tensor_init(
            index=index,
            layer_indices=layer_indices,
            tokens_per_page=page_size,
            bytes_per_page=block_bytes,
            allow_block_sharing=allow_block_sharing,
        )
        # one page per block: the base class divides memory by bytes_per_page and pages_per_block
        self.pages_per_block = 1
        self.tokens_per_block = page_size
        self.bytes_per_block = block_bytes
        self.block_physical_stride = page_size  # logical slot = block * page_size + offset

    def register_cache_tensor(self, bytes_per_sector, non_trash_bytes, cache_tensor, pool):
        self.bytes_per_sector = bytes_per_sector
        self._copy_view = cache_tensor.view(-1, self.bytes_per_block)  # block copies (forks)
        blocks = (non_trash_bytes + 2 * bytes_per_sector) // self.bytes_per_block
        block_elements = self.bytes_per_block // self.cache_dtype.itemsize
        flat = cache_tensor.view(self.cache_dtype)[: blocks * block_elements]
        self._after_cache_tensor_init(non_trash_bytes, bytes_per_sector, flat, pool)
        rows = flat.view(blocks, block_elements)
        page, n, d = self.tokens_per_page, self.num_key_value_heads, self.head_dim
        self._layer_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        start = 0
        for layer in self.layer_indices:  # [blocks, page, heads, head_dim] strided views
            keys_end = start + page * n * d
            end = start + self.layer_elements[layer]
            keys = rows[:, start:keys_end].view(blocks, page, n, d)
            values = rows[:, keys_end:end].view(blocks, page, self.value_heads[layer], d)
            self._layer_views[layer] = (keys, values)
            start = end

    @classmethod
    def get_bytes_per_page(cls, num_key_value_heads, head_dim, cache_dtype, page_size) -> int:
        return FullAttentionCacheAllocator.get_bytes_per_page(
            num_key_value_heads, head_dim, cache_dtype, page_size
        )

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        """Writes the new tokens' keys and own values, then reads the request's whole sequence
        back (shapes [tokens, heads, head_dim], the layer's own value heads only)."""
        keys, values = self._layer_views[layer_idx]
        block, offset = write_index // self.tokens_per_page, write_index % self.tokens_per_page
        keys[block, offset] = key_states
        values[block, offset] = value_states
        if read_index.numel() == 0:
            return key_states, value_states
        block, offset = read_index // self.tokens_per_page, read_index % self.tokens_per_page
        return keys[block, offset], values[block, offset]

    def get_cache_for_block_table(self, layer_idx: int):
        raise NotImplementedError("SkipV1 pages are read through the index path")


def is_skipv1_config(config) -> bool:
    return getattr(config, "skip_v_heads", 0) > 0 and hasattr(config, "own_value_heads")


class FullAttentionAllocatorChoice(FullAttentionCacheAllocator):
    """Registered for full-attention layers: builds a SkipV1 allocator for SkipV1 configs and
    transformers' own allocator for every other model."""

    skipv1_dispatch = True

    def __new__(cls, *, config, **kwargs):
        if is_skipv1_config(config):
            return SkipV1CacheAllocator(config=config, **kwargs)
        return FullAttentionCacheAllocator(config=config, **kwargs)


def register() -> None:
    """Idempotent: the package and a trust_remote_code copy of this file may both call it."""
    registry = paged_cache.ATTN_TYPE_TO_ALLOCATOR
    if not getattr(registry[FULL_ATTENTION], "skipv1_dispatch", False):
        registry[FULL_ATTENTION] = FullAttentionAllocatorChoice
