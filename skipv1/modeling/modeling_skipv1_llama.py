"""SkipV1Former on transformers' Llama: Llama, except that layers >= 1 compute only their first
`n_kv - s` value heads and read the last `s` from layer 0's value tensor.

Layer 0's values reach later layers through the forward pass (a `FirstLayerValues` holder passed
down as a keyword argument), never only through the cache, so uncached training, cached prefill
and token-by-token decoding compute the same function. Later layers cache only their own value
heads: that is the KV-cache saving.

This file is copied next to converted weights (see `auto_map`), so it imports only torch,
transformers, safetensors (their dependency) and its sibling configuration and paged-cache files.
"""

import functools
import json
import os
from collections.abc import Callable

import torch
from safetensors import safe_open
from torch import nn
from transformers.cache_utils import Cache, StaticLayer
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, TensorParallelLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_skipv1_llama import SkipV1LlamaConfig
from .paged_cache_skipv1 import register as register_paged_cache

register_paged_cache()  # continuous batching (generate_batch, `transformers serve`)


class FirstLayerValues:
    """Carries layer 0's value states (all KV heads, cached positions included) to later layers."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class SkipV1StaticLayer(StaticLayer):
    """A static cache layer for a later SkipV1 layer: its value buffer holds only the layer's own
    value heads (transformers sizes keys and values alike, from the keys)."""

    def __init__(self, max_cache_len: int, value_heads: int | None = None, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.value_heads = value_heads

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        # early initialization passes the keys' head count for the values too
        heads = self.value_heads or value_states.shape[1]
        if self.values.shape[1] != heads:
            shape = (self.batch_size, heads, self.max_cache_len, self.v_head_dim)
            self.values = torch.zeros(shape, dtype=value_states.dtype, device=self.device)
            if not torch.compiler.is_compiling():
                torch._dynamo.mark_static_address(self.values)


def use_skipv1_static_layers(cache: Cache, config: SkipV1LlamaConfig) -> None:
    """Swap transformers' StaticLayers of later layers for SkipV1StaticLayers; an early
    initialized layer (chunked prefill, export) that holds no token yet is re-initialized with
    the layer's own value heads."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        # compiled steps run on a cache an eager step prepared; an exported program keeps the
        # cache buffers its wrapper registered
        return
    layers = getattr(cache, "layers", [])
    for i, layer in enumerate(layers):
        own = config.own_value_heads(i)
        if type(layer) is not StaticLayer or own == config.num_key_value_heads:
            continue
        if layer.is_initialized and int(layer.cumulative_length) != 0:
            continue  # holds tokens written by another model: leave it alone
        new = SkipV1StaticLayer(max_cache_len=layer.max_cache_len, value_heads=own)
        if layer.is_initialized:
            new.lazy_initialization(layer.keys[:, :, :0], layer.values[:, :own, :0])
        layers[i] = new


class TPValueHeads(TensorParallelLayer):
    """Tensor-parallel style of a SkipV1 attention module. Ranks hold contiguous key heads
    [a, b); the borrowed heads are the last s, so the split between own and borrowed heads is
    uneven across ranks (some ranks may hold only borrowed ones). v_proj stays whole on every
    rank (`replicate`), and the module keeps the own heads of [a, b) before caching them; layer
    0 keeps [a, b), so its local tensor holds exactly the rank's borrowed heads after them."""

    def install_forward(self, module, mesh):
        module.tp_rank, module.tp_size = mesh.get_local_rank(), mesh.size()
        return module


ALL_PARALLEL_STYLES.register("skipv1_value_heads", TPValueHeads())


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


class SkipV1LlamaAttention(LlamaAttention):
    tp_rank, tp_size = 0, 1  # set by TPValueHeads under tensor parallelism

    def __init__(self, config: SkipV1LlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.own_value_heads = config.own_value_heads(layer_idx)
        self.v_proj = nn.Linear(
            config.hidden_size, self.own_value_heads * self.head_dim, bias=config.attention_bias
        )
        if config.o_proj_bias != config.attention_bias:
            self.o_proj = nn.Linear(
                config.num_attention_heads * self.head_dim,
                config.hidden_size,
                bias=config.o_proj_bias,
            )
        # Set only while uptraining with gradual conversion (skipv1.uptrain.gradual): maps
        # (hidden_states, borrowed values) to the values the borrowed heads use.
        self.value_blend: nn.Module | None = None

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

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        value_states, own = self.rank_value_heads(value_states, key_states.shape[1])

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
                "SkipV1LlamaAttention needs `first_layer_values` from SkipV1LlamaModel."
            )
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attend = functools.partial(
            attention_interface,
            self,
            attention_mask=attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        if self.layer_idx == 0:
            first_layer_values.value = value_states
        if self.layer_idx == 0 or own == key_states.shape[1]:
            attn_output, attn_weights = attend(query_states, key_states, value_states)
        else:
            borrowed = first_layer_values.value[:, own:]
            if self.value_blend is not None:
                borrowed = self.value_blend(hidden_states, borrowed)
            # Two attention calls over head slices instead of one over torch.cat([own, borrowed]):
            # the concatenation would copy the layer's whole value cache at every decode step.
            split = own * self.num_key_value_groups  # query heads served by the own KV heads
            parts = [(query_states[:, split:], key_states[:, own:], borrowed)]
            if own:  # a tensor-parallel rank may hold borrowed heads only
                parts.insert(0, (query_states[:, :split], key_states[:, :own], value_states))
            outputs, weights = zip(*(attend(*part) for part in parts), strict=True)
            attn_output = torch.cat(outputs, dim=2)  # [batch, q_len, heads, d]
            attn_weights = None if weights[0] is None else torch.cat(weights, dim=1)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    def rank_value_heads(self, values: torch.Tensor, local_kv_heads: int):
        """(own value states, their count) for this rank's key heads: all of them without
        tensor parallelism; under it, the own heads among [a, a + local_kv_heads)."""
        if self.tp_size == 1:
            return values, self.own_value_heads
        start = self.tp_rank * local_kv_heads
        own = max(0, min(start + local_kv_heads, self.own_value_heads) - start)
        return values[:, start : start + own], own


class SkipV1LlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: SkipV1LlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = SkipV1LlamaAttention(config=config, layer_idx=layer_idx)


def check_value_projection_rows(path: "str | os.PathLike", config: SkipV1LlamaConfig) -> None:
    """Fails with the numbers when a local checkpoint's v_proj rows disagree with `skip_v_heads`
    (transformers' own error only says "size mismatch")."""
    index_file = os.path.join(path, "model.safetensors.index.json")
    name = "model.layers.1.self_attn.v_proj.weight"
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
        rows = f.get_slice(name).get_shape()[0]
    expected = config.own_value_heads(1) * config.head_dim
    if rows != expected:
        raise ValueError(
            f"{name} has {rows} rows but skip_v_heads={config.skip_v_heads} with "
            f"num_key_value_heads={config.num_key_value_heads} and head_dim={config.head_dim} needs "
            f"(n_kv - s) * head_dim = {expected}: the config and the weights disagree."
        )


class SkipV1LlamaPreTrainedModel(LlamaPreTrainedModel):
    config_class = SkipV1LlamaConfig
    config: SkipV1LlamaConfig
    _no_split_modules = ["SkipV1LlamaDecoderLayer"]
    # fullgraph compile of the static-cache decode step is tested (tests/test_model_paths.py)
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": SkipV1LlamaDecoderLayer,
        "attentions": SkipV1LlamaAttention,
    }

    def _prepare_static_cache(self, *args, **kwargs) -> Cache:
        # generate() may initialize the cache before the first forward (chunked prefill)
        cache = super()._prepare_static_cache(*args, **kwargs)
        use_skipv1_static_layers(cache, self.config)
        return cache

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        path = pretrained_model_name_or_path
        if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
            config = kwargs.get("config")
            if not isinstance(config, SkipV1LlamaConfig):
                config = SkipV1LlamaConfig.from_pretrained(path)
            check_value_projection_rows(path, config)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


def _keep_checkpointing_flag(config: SkipV1LlamaConfig) -> bool:
    """Llama's own __init__ consumes `config.gradient_checkpointing` (post_init enables it on
    the stock layers and deletes it) before the SkipV1 layers exist: read it first."""
    return bool(getattr(config, "gradient_checkpointing", False))


class SkipV1LlamaModel(SkipV1LlamaPreTrainedModel, LlamaModel):
    def __init__(self, config: SkipV1LlamaConfig):
        checkpointing = _keep_checkpointing_flag(config)
        super().__init__(config)
        self.layers = nn.ModuleList(
            [SkipV1LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
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
        return LlamaModel.forward(
            self,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            first_layer_values=FirstLayerValues(),
            **kwargs,
        )


class SkipV1LlamaForCausalLM(SkipV1LlamaPreTrainedModel, LlamaForCausalLM):
    def __init__(self, config: SkipV1LlamaConfig):
        checkpointing = _keep_checkpointing_flag(config)
        super().__init__(config)
        if checkpointing:
            config.gradient_checkpointing = True
        self.model = SkipV1LlamaModel(config)
        if checkpointing:
            config.gradient_checkpointing = True
        self.post_init()


SkipV1LlamaConfig.register_for_auto_class()
SkipV1LlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")


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


def expose_in_transformers() -> None:
    """`transformers serve` finds a model class as `getattr(transformers, architectures[0])`,
    ignoring `auto_map`: give it ours (the configuration file imports this module, so this runs
    with `trust_remote_code` too)."""
    import transformers

    lazy = type(transformers)
    if "SkipV1LlamaForCausalLM" not in vars(lazy):
        lazy.SkipV1LlamaForCausalLM = _TopLevelName(SkipV1LlamaForCausalLM)


expose_in_transformers()

__all__ = [
    "SkipV1LlamaForCausalLM",
    "SkipV1LlamaModel",
    "SkipV1LlamaPreTrainedModel",
    "SkipV1StaticLayer",
]
