"""Continuous batching for SkipV1: a paged-cache allocator whose later layers store only their
own value heads.

transformers' `FullAttentionCacheAllocator` gives every layer a page of n_kv key heads and n_kv
value heads. Here a block (`page_size` tokens of every layer) is laid out as

    [ L0 keys | L0 values (n_kv heads) | L1 keys | L1 own values (n_kv - s) | L2 keys | ... ]

so a block takes exactly the bytes of the SkipV1 KV formula, and a cache of a given size holds
(n_kv L * 2) / (n_kv L * 2 - s (L - 1)) times the tokens of the source's. The whole block is one
"page" for the base class's arithmetic, and the logical index of a token slot is
`block * page_size + offset`, which `update` splits to address each layer's strided view.

Reads: the cache gathers each layer's cached keys and values into new tensors at every step (as
transformers' allocator does). For a later full-attention layer the gather takes its own value
heads and layer 0's borrowed ones in one index_select over the cache seen as rows of one head
vector, so the layer gets all n_kv heads and attends with one call, as the source does, with the
bytes the source reads.

Sliding-window layers (Gemma, Mistral) get the same layout in transformers' ring buffer of the
window (`SkipV1SlidingCacheAllocator`). Sequences are packed one after another, so a later layer
of another attention type than layer 0 cannot slice layer 0's values to its own positions: the
blocks of each attention type without layer 0 also hold layer 0's s borrowed value heads, which
layer 0 writes and reads back at that type's positions (`paged_borrowed_values`). For Gemma
(sliding layer 0, later global layers) that store is the `+ s` of the KV formula; for a full layer
0 before sliding ones (Qwen2's `max_window_layers`) it holds the window only.

`register()` puts dispatchers in transformers' attention-type -> allocator registry: SkipV1
configs get these allocators, every other model gets the stock ones, unchanged. This file is
copied next to converted weights with the modeling file, so it imports only transformers.
"""

import torch
from transformers.generation.continuous_batching import cache as paged_cache
from transformers.generation.continuous_batching.cache_allocators import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    FullAttentionCacheAllocator,
    SlidingAttentionCacheAllocator,
)
from transformers.generation.continuous_batching.utils import find_head_dim


def value_heads_per_layer(config, layer_indices: list[int], kv_heads: int) -> dict[int, int]:
    if kv_heads != config.num_key_value_heads:
        raise ValueError(
            "tensor-parallel continuous batching is not supported for SkipV1 checkpoints yet"
        )
    return {i: config.own_value_heads(i) for i in layer_indices}


class PerLayerValuePages:
    """The block layout of the SkipV1 allocators (see the module docstring), mixed in before a
    transformers allocator class, which keeps its token-index logic."""

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
        # layer 0's borrowed heads, kept with the later layers of the other attention type
        self.skip_v_heads = config.skip_v_heads
        self.borrowed_heads = 0 if 0 in layer_indices else config.skip_v_heads
        store_elements = page_size * self.borrowed_heads * self.head_dim
        block_bytes = (sum(self.layer_elements.values()) + store_elements) * cache_dtype.itemsize
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
        # the same memory as rows of one head's vector: a layer's keys or values of any tokens
        # are one index_copy_ / index_select away, as in transformers' allocator
        self._head_rows = flat.view(-1, d)
        self._block_rows = block_elements // d
        self._first_rows: dict[int, tuple[int, int]] = {}  # layer: (key row, value row) in a block
        start = 0
        for layer in self.layer_indices:  # [blocks, page, heads, head_dim] strided views
            keys_end = start + page * n * d
            end = start + self.layer_elements[layer]
            keys = rows[:, start:keys_end].view(blocks, page, n, d)
            values = rows[:, keys_end:end].view(blocks, page, self.value_heads[layer], d)
            self._layer_views[layer] = (keys, values)
            self._first_rows[layer] = (start // d, keys_end // d)
            start = end
        self._borrowed_view = rows[:, start:].view(blocks, page, self.borrowed_heads, d)

    @classmethod
    def get_bytes_per_page(cls, num_key_value_heads, head_dim, cache_dtype, page_size) -> int:
        return FullAttentionCacheAllocator.get_bytes_per_page(
            num_key_value_heads, head_dim, cache_dtype, page_size
        )

    def slots(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, offset in the block) of logical token slots."""
        return index // self.tokens_per_page, index % self.tokens_per_page

    def get_cache_for_block_table(self, layer_idx: int):
        raise NotImplementedError("SkipV1 pages are read through the index path")


class SkipV1CacheAllocator(PerLayerValuePages, FullAttentionCacheAllocator):
    """Full-attention allocator with per-layer value page sizes (see the module docstring).

    A later layer's read returns all n_kv value heads: its own from its pages and layer 0's
    borrowed ones, gathered together by one index_select (the read copies the cached values
    anyway, as transformers' does), so the layer attends with one call, as the source does."""

    def register_cache_tensor(self, *args, **kwargs):
        super().register_cache_tensor(*args, **kwargs)
        n, d = self.num_key_value_heads, self.head_dim
        # where later layers read layer 0's borrowed heads: (first row, heads per token, first
        # head), in the store after the layers' pages or in layer 0's pages (its last s heads)
        if self.borrowed_heads:
            store_row = sum(self.layer_elements.values()) // d
            self._borrowed_rows = (store_row, self.borrowed_heads, 0)
        else:
            self._borrowed_rows = (self._first_rows[0][1], n, n - self.skip_v_heads)
        self._relative_rows: dict[tuple[str, int], torch.Tensor] = {}

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        """Stores the new tokens' keys and own values; returns the request's cached keys and all
        n_kv value heads ([tokens, heads, head_dim]), or the new states when nothing is read."""
        if layer_idx == self.layer_indices[0]:
            self._relative_rows = {}  # a new forward: new indices
        key_row, value_row = self._first_rows[layer_idx]
        n, d, own = self.num_key_value_heads, self.head_dim, self.value_heads[layer_idx]
        rows = self._head_rows
        rows.index_copy_(0, self._rows(write_index, "w", n, key_row), key_states.reshape(-1, d))
        rows.index_copy_(
            0, self._rows(write_index, "w", own, value_row), value_states.reshape(-1, d)
        )
        if read_index.numel() == 0:
            return key_states, value_states
        keys = rows.index_select(0, self._rows(read_index, "r", n, key_row)).view(-1, n, d)
        value_rows = self.relative_rows(read_index, "r", own) + value_row
        if own < n:
            start, per_token, first = self._borrowed_rows
            borrowed = self.relative_rows(read_index, "r", per_token)[:, first:] + start
            value_rows = torch.cat([value_rows, borrowed], dim=1)
        values = rows.index_select(0, value_rows.flatten()).view(-1, n, d)
        return keys, values

    def relative_rows(self, index: torch.Tensor, kind: str, heads: int) -> torch.Tensor:
        """Head rows [tokens, heads] of the slots `index` for a store of `heads` heads per token,
        relative to the store's first row in a block; computed once per forward and kind."""
        key = (kind, heads)
        rows = self._relative_rows.get(key)
        if rows is None:
            block, offset = self.slots(index)
            first = block * self._block_rows + offset * heads
            rows = first[:, None] + torch.arange(heads, device=index.device)
            self._relative_rows[key] = rows
        return rows

    def _rows(self, index: torch.Tensor, kind: str, heads: int, first_row: int) -> torch.Tensor:
        return (self.relative_rows(index, kind, heads) + first_row).flatten()

    def update_borrowed(self, borrowed, read_index, write_index) -> None:
        """Stores layer 0's borrowed heads of the new tokens [tokens, s, head_dim]; the layers
        here read them with their own values (`update`), so nothing is read back."""
        block, offset = self.slots(write_index)
        self._borrowed_view[block, offset] = borrowed


class SkipV1SlidingCacheAllocator(PerLayerValuePages, SlidingAttentionCacheAllocator):
    """Sliding-window allocator with per-layer value page sizes: transformers' ring buffer of the
    window (its read and write indices), in the SkipV1 block layout."""

    def __init__(self, *, config, **kwargs) -> None:
        sliding_window = getattr(config, "sliding_window", None)
        if not isinstance(sliding_window, int) or sliding_window <= 0:
            raise ValueError(f"sliding_window must be a positive integer, not {sliding_window!r}")
        self.sliding_window = sliding_window
        super().__init__(config=config, **kwargs)

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        """Stores the new tokens' keys and own values and returns the request's cached ones with
        them (shapes [tokens, heads, head_dim], the layer's own value heads only)."""
        states = (key_states, value_states)
        return self.update_stores(self._layer_views[layer_idx], states, read_index, write_index)

    def update_borrowed(self, borrowed, read_index, write_index) -> torch.Tensor:
        """Stores layer 0's borrowed heads of the new tokens [tokens, s, head_dim] and returns
        them at the positions this allocator's layers read."""
        (out,) = self.update_stores((self._borrowed_view,), (borrowed,), read_index, write_index)
        return out

    def update_stores(self, stores, states, read_index, write_index) -> tuple:
        """Reads the window's cached tokens first (a new token may overwrite the oldest), puts the
        new tokens at the sentinel slots, then writes them (as transformers' sliding allocator)."""
        out = states
        if read_index.numel():
            block, offset = self.slots(read_index)
            sentinel = (read_index == self.sentinel_index)[:, None, None]
            out = tuple(
                store[block, offset].masked_scatter_(sentinel, new)
                for store, new in zip(stores, states, strict=True)
            )
        block, offset = self.slots(write_index)
        for store, new in zip(stores, states, strict=True):
            store[block, offset] = new
        return out


def paged_borrowed_values(cache, borrowed: torch.Tensor, kwargs: dict) -> dict | None:
    """For layer 0 on a paged cache: stores the new tokens' `borrowed` heads [1, s, tokens,
    head_dim] with each attention type that keeps a copy and returns them as each reads them,
    {layer type: [1, s, positions, head_dim]}; None for another cache or a single type."""
    allocators = getattr(cache, "cache_allocators", None) or {}
    out = {}
    new = borrowed.squeeze(0).transpose(0, 1)
    for kind, allocator in allocators.items():
        if isinstance(allocator, PerLayerValuePages) and allocator.borrowed_heads:
            read_index = kwargs["read_index"][allocator.index]
            write_index = kwargs["write_index"][allocator.index]
            read = allocator.update_borrowed(new, read_index, write_index)
            if read is not None:  # the sliding allocator's layers attend over them apart
                out[kind] = read.transpose(0, 1).unsqueeze(0)
    return out or None


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


class SlidingAttentionAllocatorChoice(SlidingAttentionCacheAllocator):
    """The same choice for sliding-window layers."""

    skipv1_dispatch = True

    def __new__(cls, *, config, **kwargs):
        if is_skipv1_config(config):
            return SkipV1SlidingCacheAllocator(config=config, **kwargs)
        return SlidingAttentionCacheAllocator(config=config, **kwargs)


def register() -> None:
    """Idempotent: the package and a trust_remote_code copy of this file may both call it."""
    registry = paged_cache.ATTN_TYPE_TO_ALLOCATOR
    for kind, choice in (
        (FULL_ATTENTION, FullAttentionAllocatorChoice),
        (SLIDING_ATTENTION, SlidingAttentionAllocatorChoice),
    ):
        if not getattr(registry[kind], "skipv1_dispatch", False):
            registry[kind] = choice
