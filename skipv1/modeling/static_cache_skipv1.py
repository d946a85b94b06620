"""Static caches (generate's `cache_implementation="static"`, chunked prefill, torch.compile,
torch.export) sized for SkipV1: later layers' value buffers hold only their own heads.

transformers' StaticCache builds one `StaticLayer` (full attention) or `StaticSlidingWindowLayer`
per layer and sizes keys and values alike, from the keys. `use_skipv1_static_layers` swaps the
later layers for the subclasses below before they hold a token. A sliding layer 0 that later
full-attention layers borrow from (Gemma, a Qwen3 with `layer_types`) also keeps its borrowed
value heads for every position (`SkipV1StaticFirstSlidingLayer`), as the dynamic cache's
`SkipV1SlidingWindowLayer` does: its window alone would lose them.

This file travels with converted weights (see `auto_map`): it imports only torch and transformers.
"""

import torch
from transformers.cache_utils import Cache, StaticLayer, StaticSlidingWindowLayer


class OwnValueHeads:
    """Mixed in before a static layer class: the value buffer holds `value_heads` heads."""

    value_heads: int | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        # early initialization passes the keys' head count for the values too
        heads = self.value_heads or value_states.shape[1]
        if self.values.shape[1] != heads:
            shape = (self.batch_size, heads, self.max_cache_len, self.v_head_dim)
            self.values = torch.zeros(shape, dtype=value_states.dtype, device=self.device)
            if not torch.compiler.is_compiling():
                torch._dynamo.mark_static_address(self.values)


class SkipV1StaticLayer(OwnValueHeads, StaticLayer):
    """A later full-attention layer's static cache: values of its own heads only."""

    def __init__(self, max_cache_len: int, value_heads: int | None = None, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.value_heads = value_heads


class SkipV1StaticSlidingWindowLayer(OwnValueHeads, StaticSlidingWindowLayer):
    """A later sliding layer's static cache: its window of keys and of its own value heads."""

    def __init__(self, like: StaticSlidingWindowLayer, value_heads: int):
        super().__init__(like.max_cache_len, like.max_cache_len)
        self._is_croppable = like.is_croppable  # set from the cache's length, which `like` knew
        self.value_heads = value_heads


class SkipV1StaticFirstSlidingLayer(StaticSlidingWindowLayer):
    """Layer 0's static cache when it slides and later full-attention layers borrow from it: the
    window as transformers keeps it, plus the borrowed value heads of every position up to the
    cache's length in `borrowed_values` [batch, s, max_length, head_dim], laid out as a full
    static layer's buffers (position p at index p)."""

    def __init__(self, like: StaticSlidingWindowLayer, max_length: int, borrowed_from: int):
        super().__init__(like.max_cache_len, like.max_cache_len)
        self._is_croppable = like.is_croppable
        self.max_length = max_length
        self.borrowed_from = borrowed_from  # first borrowed head in the (rank's) value tensor
        self.borrowed_values: torch.Tensor | None = None
        # a tensor, as StaticLayer's own length: compiled steps index with it without recompiling
        self.stored_length = torch.tensor(0, dtype=torch.long)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        heads = value_states.shape[1] - self.borrowed_from
        shape = (self.batch_size, heads, self.max_length, self.v_head_dim)
        self.borrowed_values = torch.zeros(shape, dtype=value_states.dtype, device=self.device)
        self.stored_length = self.stored_length.to(self.device)
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.borrowed_values)
            torch._dynamo.mark_static_address(self.stored_length)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = value_states[:, self.borrowed_from :]
        positions = torch.arange(new.shape[-2], device=self.device) + self.stored_length
        self.borrowed_values.index_copy_(2, positions, new)
        self.stored_length.add_(new.shape[-2])
        return super().update(key_states, value_states, *args, **kwargs)

    def reset(self) -> None:
        super().reset()
        if self.borrowed_values is not None:
            self.borrowed_values.zero_()
        self.stored_length.zero_()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)  # refuses what the window cannot undo
        self.stored_length.sub_(abs(tokens_to_remove))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.get_seq_length() > 0:
            beam_idx = beam_idx.to(self.device)
            self.borrowed_values = self.borrowed_values.index_select(0, beam_idx)


def use_skipv1_static_layers(cache: Cache, config) -> None:
    """Swap transformers' static layers of later layers for ones sized to their own value heads,
    and a sliding layer 0 that full layers borrow from for one that keeps the borrowed heads. A
    layer that was early initialized (chunked prefill, export) and holds no token yet is
    initialized again at its new size."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        # compiled steps run on a cache an eager step prepared; an exported program keeps the
        # cache buffers its wrapper registered
        return
    layers = getattr(cache, "layers", [])
    if not config.skip_v_heads or not any(isinstance(lay, StaticLayer) for lay in layers):
        return  # a dynamic or paged cache: nothing to swap (and this runs at every decode step)
    for i, layer in enumerate(layers):
        new = _skipv1_layer(layer, layers, config, i)
        if new is None or (layer.is_initialized and int(_length(layer)) != 0):
            continue  # nothing to change, or it holds tokens written by another model
        if layer.is_initialized:
            new.lazy_initialization(layer.keys[:, :, :0], layer.values[:, :, :0])
        layers[i] = new


def _skipv1_layer(layer, layers, config, i: int):
    own = config.own_value_heads(i)
    if type(layer) is StaticLayer and own < config.num_key_value_heads:
        return SkipV1StaticLayer(max_cache_len=layer.max_cache_len, value_heads=own)
    if type(layer) is StaticSlidingWindowLayer and own < config.num_key_value_heads:
        return SkipV1StaticSlidingWindowLayer(layer, own)
    if type(layer) is StaticSlidingWindowLayer and i == 0 and config.keeps_borrowed_values():
        full = max(
            lay.max_cache_len for lay in layers if not isinstance(lay, StaticSlidingWindowLayer)
        )
        shared = config.num_key_value_heads - config.skip_v_heads
        return SkipV1StaticFirstSlidingLayer(layer, full, shared)
    return None


def _length(layer) -> int:
    if isinstance(layer, StaticSlidingWindowLayer):
        return layer.cumulative_length_int
    return int(layer.cumulative_length)


def sliding_positions(layer, kv_length: int) -> int:
    """First absolute position of the keys a StaticSlidingWindowLayer's update returned
    (`kv_length` of them): 0 while its window has not filled (it returns the whole buffer),
    else the window that ends at the newest token."""
    seen = layer.cumulative_length_int  # tokens written, the new ones included
    return 0 if seen <= layer.max_cache_len else seen - kv_length


def unused_value_heads(cache: Cache, layer_idx: int, own: int) -> int:
    """Value heads of a static layer beyond the layer's own: non-zero only for a static cache
    sized before the model could size it and then frozen, as by ExecuTorch's export wrapper
    (which registers its buffers as they are). Such a layer works, without the saving."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers):
        return 0
    layer = layers[layer_idx]
    if not isinstance(layer, StaticLayer) or not layer.is_initialized:
        return 0
    return max(0, layer.values.shape[1] - own)
