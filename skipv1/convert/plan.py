"""The conversion plan, derived from the source config alone (no I/O): which tensors a source
checkpoint must hold, with which shapes, and what happens to each (copy, or rewrite the value
rows of a later layer's v_proj). Also the output shard layout, from tensor sizes."""

import itertools
from dataclasses import dataclass, field

from ..checkpoint_info import SOURCE_ARCHITECTURES, architecture, default_skip_heads
from ..errors import SkipV1Error
from ..families import LLAMA, Family, family_of
from ..modeling.layout import KVLayout, kv_layout, tied_embeddings
from . import fused
from .inits import DEFAULT_INIT, Init, get_init
from .names import later_attention_norm, later_attention_projection

COPY = "copy"
REWRITE_V = "rewrite_v"
# Tensors an init rewrites in place (Init.rewrites: calibrated inits refit q/k/o, down_proj).
CALIBRATE = "calibrate"
# Buffers some old checkpoints saved; the model recomputes them (GPT-2's causal masks too).
DROPPABLE_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


@dataclass(frozen=True)
class SourceModel:
    """The facts about a source (Llama family or Qwen3) that decide tensor names and shapes."""

    architecture: str
    family: Family
    num_layers: int
    hidden: int
    heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tied: bool
    qk_norm: bool = False  # q_norm / k_norm weights in every layer (shapes: family.qk_norm_scope)
    positions: int = 0  # max_position_embeddings (learned position embeddings: GPT-2)
    bare_names: bool = False  # GPT-2 names without `transformer.` (fused.has_bare_names)
    # a mixture of experts (family.experts): (experts, their intermediate size, sparse layers)
    experts: tuple[int, int, frozenset[int]] | None = None
    windowed_first_layer: bool = False  # see KVLayout

    @classmethod
    def from_config(cls, config: dict, bare_names: bool = False) -> "SourceModel":
        arch = architecture(config)
        layout = kv_layout(config)
        qwen2 = SOURCE_ARCHITECTURES.get(arch) == "qwen2"
        family = family_of(config) or LLAMA
        qkv = fused.layout_of(family)
        attention_bias = bool(config.get("attention_bias", qkv.default_bias if qkv else False))
        return cls(
            architecture=arch,
            family=family,
            num_layers=layout.num_layers,
            hidden=config["hidden_size"],
            heads=config["num_attention_heads"],
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            intermediate=config["intermediate_size"],
            vocab=config["vocab_size"],
            # Qwen2 always has q/k/v biases and never an o_proj bias.
            qkv_bias=qwen2 or attention_bias,
            o_bias=False if qwen2 else attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            tied=tied_embeddings(config),
            positions=config.get("max_position_embeddings", 0),
            bare_names=bare_names,
            qk_norm=family.qk_norm,
            experts=_experts(family, config, layout.num_layers),
            windowed_first_layer=layout.windowed_first_layer,
        )

    @property
    def qkv_layout(self):
        """Where a fused q/k/v tensor keeps the value rows (None: separate tensors)."""
        return fused.layout_of(self.family, self.bare_names)

    @property
    def kv(self) -> KVLayout:
        return KVLayout(
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            windowed_first_layer=self.windowed_first_layer,
        )

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of this config holds (lm_head optional when tied)."""
        h, q_rows, kv_rows = (
            self.hidden,
            self.heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        shapes = {"model.embed_tokens.weight": (self.vocab, h)}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            linears = {
                "self_attn.q_proj": ((q_rows, h), self.qkv_bias),
                "self_attn.k_proj": ((kv_rows, h), self.qkv_bias),
                "self_attn.v_proj": ((kv_rows, h), self.qkv_bias),
                "self_attn.o_proj": ((h, q_rows), self.o_bias),
                **self._mlp_linears(i),
            }
            for name, (shape, bias) in linears.items():
                shapes[p + name + ".weight"] = shape
                if bias:
                    shapes[p + name + ".bias"] = shape[:1]
            if self.qk_norm:
                whole = self.family.qk_norm_scope == "projection"  # OLMo-2: over all heads
                shapes[p + "self_attn.q_norm.weight"] = (q_rows if whole else self.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (kv_rows if whole else self.head_dim,)
            for norm in self.family.norms.names():
                shapes[p + norm + ".weight"] = (h,)
        shapes["model.norm.weight"] = (h,)
        shapes["lm_head.weight"] = (self.vocab, h)
        layout = self.qkv_layout
        return layout.shapes(shapes, self) if layout else shapes

    def _mlp_linears(self, i: int) -> dict[str, tuple[tuple[int, int], bool]]:
        """Layer i's MLP linears: gate/up/down, or a router and each expert's (copied as they
        are: SkipV1 changes attention only)."""
        h, layout = self.hidden, self.family.experts
        if self.experts is None or i not in self.experts[2]:
            inter = self.intermediate
            return {
                "mlp.gate_proj": ((inter, h), self.mlp_bias),
                "mlp.up_proj": ((inter, h), self.mlp_bias),
                "mlp.down_proj": ((h, inter), self.mlp_bias),
            }
        count, inter, _ = self.experts
        out = {f"{layout.block}.gate": ((count, h), False)}
        for e in range(count):
            x = f"{layout.block}.experts.{e}."
            out[x + layout.gate] = ((inter, h), False)
            out[x + layout.up] = ((inter, h), False)
            out[x + layout.down] = ((h, inter), False)
        return out

    def optional_tensors(self) -> set[str]:
        return {"lm_head.weight"} if self.tied else set()

    def value_tensor(self, layer: int) -> str:
        """The tensor that holds a layer's value rows (a fused one in some families)."""
        layout = self.qkv_layout
        if layout is None:
            return f"model.layers.{layer}.self_attn.v_proj.weight"
        return f"{layout.prefix}{layer}.{layout.value_tensors[0]}"


def _experts(family: Family, config: dict, layers: int):
    layout = family.experts
    if layout is None:
        return None
    sparse = frozenset(i for i in range(layers) if layout.is_sparse(config, i))
    return layout.count(config), config[layout.intermediate_field], sparse


@dataclass(frozen=True)
class TensorTask:
    name: str
    action: str  # COPY | REWRITE_V
    source_shape: tuple[int, ...]
    target_shape: tuple[int, ...]


@dataclass(frozen=True)
class ConversionPlan:
    source: SourceModel
    skip_heads: int
    init: str
    tasks: dict[str, TensorTask] = field(repr=False)

    @property
    def own_heads(self) -> int:
        return self.source.num_kv_heads - self.skip_heads

    @property
    def init_method(self) -> Init:
        return get_init(self.init)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Source value heads each own head of a later layer is made from."""
        return self.init_method.groups(self.source.num_kv_heads, self.skip_heads)

    @property
    def kv_after(self) -> KVLayout:
        return self.source.kv.with_skip(self.skip_heads)

    def changed(self) -> list[TensorTask]:
        return [t for t in self.tasks.values() if t.action != COPY]

    def rewrite_values(self, name: str, tensor):
        """A REWRITE_V tensor with its value rows made by the init (the rest of a fused
        tensor kept)."""
        n_kv, s = self.source.num_kv_heads, self.skip_heads
        layout = self.source.qkv_layout
        if layout is None:
            return self.init_method.value_rows(tensor, n_kv, s)
        own_rows = lambda v: self.init_method.value_rows(v, n_kv, s)  # noqa: E731
        return fused.rewrite_values(layout, self.source, tensor, own_rows)


def make_plan(
    config: dict,
    skip_heads: int | None = None,
    init: str = DEFAULT_INIT,
    bare_names: bool = False,
) -> ConversionPlan:
    """The plan for a source config; raises SkipV1Error for options the config cannot take.
    `bare_names`: a GPT-2 checkpoint whose tensor names lack `transformer.`."""
    source = SourceModel.from_config(config, bare_names)
    n_kv = source.num_kv_heads
    s = default_skip_heads(n_kv) if skip_heads is None else skip_heads
    if not 0 <= s < n_kv:
        raise SkipV1Error(
            f"--skip-heads {s} is out of range: this model has {n_kv} KV heads, "
            f"choose 0 <= N <= {n_kv - 1}"
        )
    method = get_init(init)
    layout = source.qkv_layout
    tasks = {}
    for name, shape in source.expected_shapes().items():
        projection = later_attention_projection(name) if s else None
        if projection == "v_proj":
            target = ((n_kv - s) * source.head_dim, *shape[1:])
            tasks[name] = TensorTask(name, REWRITE_V, shape, target)
        elif s and layout and fused.later_value_layer(layout, name):
            target = fused.target_shape(layout, source, s, shape)
            tasks[name] = TensorTask(name, REWRITE_V, shape, target)
        elif s and (_rewritten(layout, method, name) or _moves_with_heads(source, method, name)):
            tasks[name] = TensorTask(name, CALIBRATE, shape, shape)
        else:
            tasks[name] = TensorTask(name, COPY, shape, shape)
    return ConversionPlan(source, s, init, tasks)


def _rewritten(layout, method: Init, name: str) -> bool:
    """Whether the init rewrites a tensor, asked in the Llama names (GPT-NeoX's attention.dense
    is an o_proj, GPT-2's mlp.c_proj a down_proj: fused.llama_parts)."""
    parts = fused.llama_parts(layout, name)
    return any(map(method.rewrites, parts[1] if parts else (name,)))


def _moves_with_heads(source: SourceModel, method: Init, name: str) -> bool:
    """A q/k norm over the whole projection (OLMo-2) has a weight per head's row: an init that
    permutes a later layer's heads (it rewrites q_proj) permutes that weight with them."""
    norm = later_attention_norm(name)
    if norm is None or source.family.qk_norm_scope != "projection":
        return False
    return method.rewrites(name.replace(f".{norm}.", ".q_proj."))


def shard_layout(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Greedy, in order: a shard takes tensors while it stays under the limit; a tensor larger
    than the limit gets a shard of its own. huggingface_hub's splitter gives the same shards
    except there, where it takes the big tensor out of read order; the writer fills shards in
    read order, so this stays ours (tests/test_shard_layout.py pins both)."""
    shards: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for name, nbytes in sizes:
        if current and filled + nbytes > max_shard_bytes:
            shards.append(current)
            current, filled = [], 0
        current.append(name)
        filled += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def shard_layout_by_source_file(
    sizes: list[tuple[str, int]], file_of: dict[str, str], max_shard_bytes: int
) -> list[list[str]]:
    """shard_layout within each source file (sizes in read order): an output shard never holds
    tensors of two source files, so that the writer can keep every byte-copied tensor at its
    source's offset within a page (writer.shard_header), which one header cannot do for two
    files whose headers differ in length. The output has at least as many shards as the
    source."""
    groups = itertools.groupby(sizes, key=lambda item: file_of[item[0]])
    return [shard for _, group in groups for shard in shard_layout(list(group), max_shard_bytes)]


def shard_file_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
