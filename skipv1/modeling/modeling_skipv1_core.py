"""The family-independent core of SkipV1Former: the borrow logic of the attention, the config
fields and checks, the cache layers, tensor parallelism and the loading check. Each family's
modeling file (`modeling_skipv1_llama.py`, `modeling_skipv1_qwen3.py`) mixes these into that
family's transformers classes.

Layer 0's values reach later layers through the forward pass (a `FirstLayerValues` holder passed
down as a keyword argument), never only through the cache, so uncached training, cached prefill
and token-by-token decoding compute the same function. Later layers cache only their own value
heads: that is the KV-cache saving.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers, safetensors (their dependency) and its sibling files (paged and static caches,
split attention).
"""

import functools
import json
import os
from collections.abc import Callable

import torch
from safetensors import safe_open
from torch import nn
from transformers.cache_utils import (
    Cache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, TensorParallelLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward
from transformers.utils.deprecation import deprecate_kwarg

from .paged_cache_skipv1 import paged_borrowed_values
from .paged_cache_skipv1 import register as register_paged_cache
from .split_attention_skipv1 import attend_split
from .static_cache_skipv1 import (
    SkipV1StaticFirstSlidingLayer,
    sliding_positions,
    unused_value_heads,
    use_skipv1_static_layers,
)

register_paged_cache()  # continuous batching (generate_batch, `transformers serve`)

# Tensor parallelism: value projections stay whole on every rank and each attention module keeps
# the value heads of its rank's key heads (own ones from its v_proj, borrowed ones from layer
# 0's), see `TPValueHeads`. A family's config adds these to its base plan.
TP_PLAN_OVERRIDES = {
    "layers.*.self_attn.v_proj": "replicate",
    "layers.*.self_attn": "skipv1_value_heads",
}


class SkipV1ConfigMixin:
    """The SkipV1 checks and arithmetic of a family config. The family config class declares the
    fields itself (dataclass fields are not inherited from a plain mixin):

    skip_v_heads (`int`): value heads, counted in KV heads, that every layer from the second on
        takes from the first layer's value tensor (head indices `n_kv - s .. n_kv - 1`).
    o_proj_bias (`bool`, *optional*): bias on the output projection; defaults to `attention_bias`.
    """

    # Families whose sliding-window layers SkipV1 keeps (Gemma); the others attend over the full
    # context only.
    supports_sliding_window = False
    # the dimension of the `value_projection` tensor that holds the rows (1 for a Conv1D)
    value_projection_dim = 0

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.o_proj_bias is None:
            self.o_proj_bias = self.attention_bias

    def validate_architecture(self):
        super().validate_architecture()
        n_kv, s = self.num_key_value_heads, self.skip_v_heads
        if not 0 <= s < n_kv:
            raise ValueError(
                f"skip_v_heads={s} is out of range: it must satisfy 0 <= skip_v_heads < "
                f"num_key_value_heads={n_kv}."
            )
        if self.num_attention_heads % n_kv != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={n_kv}."
            )
        if not self.supports_sliding_window and self.has_sliding_layers():
            raise ValueError(
                "layer_types has sliding_attention layers: SkipV1 attends over the full context "
                "only (set use_sliding_window=false)."
            )

    def has_sliding_layers(self) -> bool:
        return "sliding_attention" in (getattr(self, "layer_types", None) or [])

    def keeps_borrowed_values(self) -> bool:
        """Whether layer 0's cache also keeps its borrowed value heads for the whole context:
        layer 0 attends through a sliding window (its own cache holds only the window) and a later
        full-attention layer borrows from it at every position."""
        types = list(getattr(self, "layer_types", None) or [])
        return (
            bool(self.skip_v_heads)
            and types[:1] == ["sliding_attention"]
            and ("full_attention" in types[1:])
        )

    def own_value_heads(self, layer_idx: int) -> int:
        """Value heads a layer computes itself: all of them in layer 0, n_kv - s afterwards."""
        return self.num_key_value_heads - (self.skip_v_heads if layer_idx > 0 else 0)

    def value_projection(self, layer_idx: int) -> tuple[str, int]:
        """(name, rows) of the checkpoint tensor that holds a layer's value rows: its v_proj
        weight here; a fused projection's weight in a family that has one."""
        name = f"model.layers.{layer_idx}.self_attn.v_proj.weight"
        return name, self.own_value_heads(layer_idx) * self.head_dim


class FirstLayerValues:
    """Carries layer 0's value states (all KV heads, cached positions included) to later layers."""

    __slots__ = ("value", "full", "paged")

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None
        # layer 0's borrowed heads at every cached position, when its own cache keeps only a
        # sliding window (SkipV1SlidingWindowLayer); later full-attention layers read these
        self.full: torch.Tensor | None = None
        # on a paged cache: layer 0's borrowed heads as each other attention type's pages hold
        # them ({"full_attention": ..., "sliding_attention": ...}, paged_borrowed_values)
        self.paged: dict[str, torch.Tensor] | None = None


class SkipV1SlidingWindowLayer(DynamicSlidingWindowLayer):
    """Layer 0's dynamic cache when it attends through a sliding window and later full-attention
    layers borrow from it: its keys and values for the window, as transformers keeps them, plus
    the borrowed value heads (the last s) of every position in `borrowed_values`
    [batch, s, seq, head_dim]. That store is the price of borrowing from a sliding layer: s value
    heads per token, counted in the KV formula (layout.KVLayout)."""

    def __init__(self, sliding_window: int, borrowed_from: int):
        super().__init__(sliding_window=sliding_window)
        self.borrowed_from = borrowed_from  # first borrowed head in the (rank's) value tensor
        self.borrowed_values: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        new = value_states[:, self.borrowed_from :]
        old = self.borrowed_values
        self.borrowed_values = new if old is None else torch.cat([old, new], dim=-2)
        return super().update(key_states, value_states, *args, **kwargs)

    def reset(self) -> None:
        super().reset()
        self.borrowed_values = None

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)  # refuses what the window cannot undo
        if self.borrowed_values is not None:
            self.borrowed_values = self.borrowed_values[..., : self.cumulative_length, :]

    def _each_store(self, fn) -> None:
        if self.borrowed_values is not None and self.borrowed_values.numel():
            self.borrowed_values = fn(self.borrowed_values)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._each_store(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._each_store(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._each_store(lambda t: t.index_select(0, beam_idx.to(t.device)))


def first_layer_cache(cache: Cache, borrowed_from: int):
    """Layer 0's cache layer that keeps its borrowed heads for every position: a dynamic one is
    swapped for a SkipV1SlidingWindowLayer while it holds no token (a static one was swapped by
    `use_skipv1_static_layers`); None where layer 0's cache keeps every position anyway (a cache
    made without the config)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None  # layers are created on the first update, as full DynamicLayers
    layer = layers[0]
    if isinstance(layer, (SkipV1SlidingWindowLayer, SkipV1StaticFirstSlidingLayer)):
        return layer
    if type(layer) is DynamicSlidingWindowLayer and not layer.is_initialized:
        layers[0] = SkipV1SlidingWindowLayer(layer.sliding_window, borrowed_from)
        if getattr(layer, "record_past", False):  # assisted decoding rolls the cache back
            layers[0].activate_past_recording()
        return layers[0]
    if type(layer) in (DynamicLayer, StaticLayer):
        return None
    raise ValueError(
        f"SkipV1: layer 0 attends through a sliding window and later full-attention layers borrow "
        f"its values at every position, which a {type(layer).__name__} does not keep: use the "
        "dynamic cache (generate(..., cache_implementation='dynamic') or DynamicCache(config=...))."
    )


class TPValueHeads(TensorParallelLayer):
    """Tensor-parallel style of a SkipV1 attention module. Ranks hold contiguous key heads
    [a, b); the borrowed heads are the last s, so the split between own and borrowed heads is
    uneven across ranks (some ranks may hold only borrowed ones). v_proj stays whole on every
    rank (`replicate`), and the module keeps the own heads of [a, b) before caching them; layer
    0 keeps [a, b), so its local tensor holds exactly the rank's borrowed heads after them."""

    def install_forward(self, module, mesh, **_):  # transformers 5.25 adds config=, mesh_manager=
        module.tp_rank, module.tp_size = mesh.get_local_rank(), mesh.size()
        return module


ALL_PARALLEL_STYLES.register("skipv1_value_heads", TPValueHeads())


class SkipV1AttentionMixin:
    """Mixed in before a family's attention class: the family's q/k/o stay, v_proj computes the
    layer's own heads only, and the forward borrows the last s value heads from layer 0. A
    family changes how queries, keys and values are projected in `project` (Qwen3's q/k norms)."""

    tp_rank, tp_size = 0, 1  # set by TPValueHeads under tensor parallelism
    # the family's eager attention (Gemma 2's applies its logit soft-capping)
    eager_attention = staticmethod(eager_attention_forward)

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)  # by name: GPT-2's second is another
        self.own_value_heads = config.own_value_heads(layer_idx)
        self.size_projections(config)
        # Set only while uptraining with gradual conversion (skipv1.uptrain.gradual): maps
        # (hidden_states, borrowed values) to the values the borrowed heads use.
        self.value_blend: nn.Module | None = None

    def size_projections(self, config) -> None:
        """Resizes the family's projections to the layer's own value heads: v_proj here (and
        o_proj when its bias differs from q/k/v's); a family with a fused q/k/v projection
        resizes that instead."""
        self.v_proj = nn.Linear(
            config.hidden_size, self.own_value_heads * self.head_dim, bias=config.attention_bias
        )
        if config.o_proj_bias != config.attention_bias:
            self.o_proj = nn.Linear(
                config.num_attention_heads * self.head_dim,
                config.hidden_size,
                bias=config.o_proj_bias,
            )

    def rotate(self, queries, keys, position_embeddings) -> tuple:
        """Queries and keys [batch, heads, seq, head_dim] with positions applied (RoPE here): over
        the first cos.shape[-1] dims of each head, the rest passed through (Phi-3's
        partial_rotary_factor, as its apply_rotary_pos_emb)."""
        cos, sin = position_embeddings
        rotary = cos.shape[-1]
        if rotary == queries.shape[-1]:
            return apply_rotary_pos_emb(queries, keys, cos, sin)
        q, k = apply_rotary_pos_emb(queries[..., :rotary], keys[..., :rotary], cos, sin)
        return (
            torch.cat([q, queries[..., rotary:]], dim=-1),
            torch.cat([k, keys[..., rotary:]], dim=-1),
        )

    def output(self, attn_output: torch.Tensor) -> torch.Tensor:
        """The output projection of the heads' mix [batch, seq, heads * head_dim]."""
        return self.o_proj(attn_output)

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        """(queries, keys, values) as [batch, seq, heads, head_dim], before RoPE."""
        return (
            self.q_proj(hidden_states).view(hidden_shape),
            self.k_proj(hidden_states).view(hidden_shape),
            self.v_proj(hidden_states).view(hidden_shape),
        )

    def attention_kwargs(self) -> dict:
        """Extra keyword arguments of the family's attention call (Gemma: sliding_window, softcap)."""
        return {}

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        first_layer_values: FirstLayerValues | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states, key_states, value_states = (
            t.transpose(1, 2) for t in self.project(hidden_states, hidden_shape)
        )
        query_states, key_states = self.rotate(query_states, key_states, position_embeddings)
        value_states, own = self.rank_value_heads(value_states, key_states.shape[1])

        store = paged = None
        if cache is not None and self.layer_idx == 0 and self.config.skip_v_heads:
            start = self.borrowed_from(key_states.shape[1])
            # a paged cache (continuous batching) keeps them with the layers of the other type
            paged = paged_borrowed_values(cache, value_states[:, start:], kwargs)
            if paged is None and self.config.keeps_borrowed_values():
                store = first_layer_cache(cache, start)
        if cache is not None:
            extra = unused_value_heads(cache, self.layer_idx, own)
            if extra:  # write zeros there: the new tokens only, never the cached ones
                value_states = nn.functional.pad(value_states, (0, 0, 0, 0, 0, extra))
            key_states, value_states = cache.update(
                key_states, value_states, self.layer_idx, kwargs=kwargs
            )
            if extra:
                value_states = value_states[:, :own]

        # The SkipV1 difference: layer 0 publishes its values, later layers borrow the tail heads.
        if first_layer_values is None:
            raise ValueError(
                f"{type(self).__name__} needs `first_layer_values` from the SkipV1 model."
            )
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, self.eager_attention
        )
        attend = functools.partial(
            attention_interface,
            self,
            attention_mask=attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **self.attention_kwargs(),
            **kwargs,
        )
        if self.layer_idx == 0:
            first_layer_values.value = value_states
            first_layer_values.full = None if store is None else store.borrowed_values
            first_layer_values.paged = paged
        if value_states.shape[1] == key_states.shape[1]:
            # layer 0, a layer without borrowed heads on this rank, or a paged cache that read
            # the borrowed heads with the own ones (SkipV1CacheAllocator)
            attn_output, attn_weights = attend(query_states, key_states, value_states)
        else:
            borrowed = self.borrowed_values(first_layer_values, own, key_states.shape[2], cache)
            if self.value_blend is not None:
                borrowed = self.value_blend(hidden_states, borrowed)
            attn_output, attn_weights = attend_split(
                attend, query_states, key_states, value_states, borrowed, self.num_key_value_groups
            )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.output(attn_output), attn_weights

    def borrowed_values(
        self, first: FirstLayerValues, own: int, kv_length: int, cache: Cache | None = None
    ) -> torch.Tensor:
        """Layer 0's borrowed heads at the positions of this layer's keys. Without a cache, and
        for a layer whose cache is of layer 0's kind, that is layer 0's value tensor as its cache
        returned it; a full-attention layer borrowing from a sliding layer 0 reads layer 0's
        full-length store; a sliding layer borrowing from a full one takes the positions of its
        window (the last ones of a dynamic cache, `sliding_positions` of a static one).
        On a paged cache, sequences are packed: a layer of another type than layer 0 reads layer
        0's heads from its own pages' copy, at its own positions."""
        full = getattr(self, "sliding_window", None) is None
        paged = (first.paged or {}).get("full_attention" if full else "sliding_attention")
        if paged is not None:
            return paged
        if first.full is not None and full:
            return first.full
        borrowed = first.value[:, own:]
        layers = getattr(cache, "layers", None) or []
        layer = layers[self.layer_idx] if len(layers) > self.layer_idx else None
        if isinstance(layer, StaticSlidingWindowLayer) and not layers[0].is_sliding:
            start = sliding_positions(layer, kv_length)  # layer 0's buffer: position p at p
            return borrowed[..., start : start + kv_length, :]
        if borrowed.shape[-2] != kv_length:
            borrowed = borrowed[..., -kv_length:, :]
        return borrowed

    def borrowed_from(self, local_kv_heads: int) -> int:
        """Index of the first borrowed head in layer 0's (rank's) value tensor."""
        start = self.tp_rank * local_kv_heads
        shared = self.config.num_key_value_heads - self.config.skip_v_heads
        return max(0, min(start + local_kv_heads, shared) - start)

    def rank_value_heads(self, values: torch.Tensor, local_kv_heads: int):
        """(own value states, their count) for this rank's key heads: all of them without
        tensor parallelism; under it, the own heads among [a, a + local_kv_heads)."""
        if self.tp_size == 1:
            return values, self.own_value_heads
        start = self.tp_rank * local_kv_heads
        own = max(0, min(start + local_kv_heads, self.own_value_heads) - start)
        return values[:, start : start + own], own


class PerHeadQKNormMixin:
    """RMSNorm on each head's queries and keys after the split, before RoPE (Qwen3, Qwen3-MoE,
    Gemma 3; OLMo-2 normalises the whole projection instead). Goes before SkipV1AttentionMixin."""

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        queries, keys, values = super().project(hidden_states, hidden_shape)
        return self.q_norm(queries), self.k_norm(keys), values


def check_value_projection_rows(path: "str | os.PathLike", config) -> None:
    """Fails with the numbers when a local checkpoint's v_proj rows disagree with `skip_v_heads`
    (transformers' own error only says "size mismatch")."""
    index_file = os.path.join(path, "model.safetensors.index.json")
    name, expected = config.value_projection(1)
    if os.path.isfile(index_file):
        with open(index_file) as f:
            shard = json.load(f)["weight_map"].get(name)
    else:
        shard = "model.safetensors"
    if config.num_hidden_layers < 2 or not shard or not os.path.isfile(os.path.join(path, shard)):
        return
    with safe_open(os.path.join(path, shard), framework="pt") as f:
        if name not in f.keys():
            return
        shape = f.get_slice(name).get_shape()
    rows = shape[config.value_projection_dim]
    if rows != expected:
        raise ValueError(
            f"{name} has {rows} rows but skip_v_heads={config.skip_v_heads} with "
            f"num_key_value_heads={config.num_key_value_heads} and head_dim={config.head_dim} needs "
            f"n_kv - s = {config.own_value_heads(1)} own value heads, rows = {expected}: the "
            "config and the weights disagree."
        )


class SkipV1PreTrainedMixin:
    """Mixed in before a family's PreTrainedModel: static caches sized per layer, and the
    v_proj rows checked against the config before loading."""

    def _prepare_static_cache(self, *args, **kwargs) -> Cache:
        # generate() may initialize the cache before the first forward (chunked prefill)
        cache = super()._prepare_static_cache(*args, **kwargs)
        use_skipv1_static_layers(cache, self.config)
        return cache

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # transformers looks for its experts decorator in the model class's own module source;
        # a MoE family's experts are the stock ones (grouped_mm by default, fullgraph-compilable),
        # so ask the family's stock class, not this file (which would fall back to the eager loop)
        stock = next(c for c in cls.__mro__ if c.__module__.startswith("transformers.models."))
        return stock._can_set_experts_implementation()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        path = pretrained_model_name_or_path
        if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
            config = kwargs.get("config")
            if not isinstance(config, cls.config_class):
                config = cls.config_class.from_pretrained(path)
            check_value_projection_rows(path, config)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


def keep_checkpointing_flag(config) -> bool:
    """The family model's own __init__ consumes `config.gradient_checkpointing` (post_init
    enables it on the stock layers and deletes it) before the SkipV1 layers exist: read it
    first."""
    return bool(getattr(config, "gradient_checkpointing", False))


class SkipV1ModelMixin:
    """Mixed in before a family's base model: its layers are `decoder_layer_class`, and every
    forward carries a fresh `FirstLayerValues` down to the attention modules."""

    decoder_layer_class: type[nn.Module]
    layers_attribute = "layers"  # the family model's ModuleList of decoder layers

    def __init__(self, config):
        checkpointing = keep_checkpointing_flag(config)
        super().__init__(config)
        layers = [self.decoder_layer_class(config, i) for i in range(config.num_hidden_layers)]
        setattr(self, self.layers_attribute, nn.ModuleList(layers))
        if checkpointing:
            config.gradient_checkpointing = True
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if cache is not None:
            use_skipv1_static_layers(cache, self.config)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            first_layer_values=FirstLayerValues(),
            **kwargs,
        )


class SkipV1ForCausalLMMixin:
    """Mixed in before a family's ForCausalLM: its `model` is `base_model_class`."""

    base_model_class: type[nn.Module]

    def __init__(self, config):
        checkpointing = keep_checkpointing_flag(config)
        super().__init__(config)
        if checkpointing:
            config.gradient_checkpointing = True
        # `model` in most families (`gpt_neox`, `transformer` in others)
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        if checkpointing:
            config.gradient_checkpointing = True
        self.post_init()


class _TopLevelName:
    """A name on transformers' lazy-module class that only the top-level `transformers` module
    answers: importing some transformers modules swaps `sys.modules["transformers"]` for a new
    lazy module, so an attribute set on one instance is missed by code holding the other."""

    def __init__(self, value) -> None:
        self.value = value

    def __get__(self, module, owner=None):
        if module is not None and module.__name__ == "transformers":
            return self.value
        raise AttributeError  # any other lazy module: its own lookup, as before


def expose_in_transformers(model_class: type) -> None:
    """`transformers serve` finds a model class as `getattr(transformers, architectures[0])`,
    ignoring `auto_map`: give it ours (each configuration file imports its modeling file, so
    this runs with `trust_remote_code` too)."""
    import transformers

    lazy = type(transformers)
    if model_class.__name__ not in vars(lazy):
        setattr(lazy, model_class.__name__, _TopLevelName(model_class))


def share_weight_conversions(model_type: str, source_model_type: str) -> None:
    """Checkpoints keep the source's tensor names (a MoE's experts one tensor each, as on the
    Hub); transformers fuses them on loading by the model_type's conversion mapping, which a
    SkipV1 model_type (and remote code) gets only by registering the source's."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    mapping = get_checkpoint_conversion_mapping(source_model_type)
    if mapping is not None:
        register_checkpoint_conversion_mapping(model_type, mapping, overwrite=True)
