"""Families whose checkpoints fuse q/k/v into one tensor: their tensor names and shapes, where the
value rows sit inside the fused tensor, and how a later layer's tensor is rebuilt around the
init's own value rows. The modeling files read the same split from the family's config
(`value_projection`): Phi-3 `[q | k | v]` (`qkv_rows`), GPT-NeoX per head `[q_h k_h v_h]`,
GPT-2 `[q | k | v]` along the output columns of a Conv1D weight `[in, out]`.

Phi-3 is a Llama with fused projections, so the calibrated inits run it as one: `LlamaView` shows
its tensors unfused (q/k/v_proj, gate/up_proj) to the calibration pass and fuses what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a fused tensor is cut: plans stay torch-free
    import torch


@dataclass(frozen=True)
class Heads:
    """The head counts a fused tensor's rows are made of."""

    heads: int
    kv: int
    d: int


class Phi3Layout:
    """Phi-3: `qkv_proj` rows [q: heads*d | k: kv*d | v: kv*d], `gate_up_proj` rows [gate | up]."""

    default_bias = False
    describe = "[q | k | v]: all query rows, then all key rows, then the own value rows"
    prefix = "model.layers."
    value_tensors = ("self_attn.qkv_proj.weight",)
    # the family's tensors (names in a layer, no .weight/.bias) that the calibrated inits read as
    # Llama projections, and how: "qkv" (this layout's split/join), "linear" (the same tensor),
    # "conv1d" (a Conv1D weight [in, out]: transposed). Phi-3 runs as a whole Llama (LlamaView).
    llama_parts: dict[str, tuple[str, tuple[str, ...]]] = {}

    def split(self, tensor: torch.Tensor, h: Heads):
        """(q, k, v) rows of a source tensor (every value head)."""
        return tensor.split([h.heads * h.d, h.kv * h.d, h.kv * h.d], dim=0)

    def join(self, q, k, v, h: Heads) -> torch.Tensor:
        import torch

        return torch.cat([q, k, v], dim=0).contiguous()

    def fused_rows(self, h: Heads, own: int) -> int:
        return (h.heads + h.kv + own) * h.d

    def target_shape(self, shape: tuple[int, ...], rows: int) -> tuple[int, ...]:
        return (rows, *shape[1:])

    def shapes(self, unfused: dict[str, tuple[int, ...]], src) -> dict[str, tuple[int, ...]]:
        """The Llama layout's shapes (plan.SourceModel) with Phi-3's two fused pairs."""
        out = {}
        for name, shape in unfused.items():
            if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
                continue
            if name.endswith("mlp.up_proj.weight"):
                continue
            if name.endswith("self_attn.q_proj.weight"):
                rows = self.fused_rows(
                    Heads(src.heads, src.num_kv_heads, src.head_dim), src.num_kv_heads
                )
                out[name.replace("q_proj", "qkv_proj")] = (rows, shape[1])
            elif name.endswith("mlp.gate_proj.weight"):
                out[name.replace("gate_proj", "gate_up_proj")] = (2 * shape[0], shape[1])
            else:
                out[name] = shape
        return out


class GPTNeoXLayout:
    """GPT-NeoX: `query_key_value` rows per head [q_h | k_h | v_h] (MHA). A later layer keeps
    [q_h k_h v_h] for its own heads h < own, then [q_h k_h] for the borrowed ones."""

    default_bias = True  # GPTNeoXConfig.attention_bias
    describe = (
        "per head [q_h | k_h | v_h] for the own value heads h < v_heads, then [q_h | k_h] "
        "for the others"
    )
    prefix = "gpt_neox.layers."
    value_tensors = ("attention.query_key_value.weight", "attention.query_key_value.bias")
    llama_parts = {
        "attention.query_key_value": (
            "qkv",
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ),
        "attention.dense": ("linear", ("self_attn.o_proj",)),
        "mlp.dense_4h_to_h": ("linear", ("mlp.down_proj",)),
    }

    def split(self, tensor: torch.Tensor, h: Heads):
        rest = tensor.shape[1:]
        heads = tensor.reshape(h.heads, 3, h.d, *rest)
        return tuple(heads[:, n].reshape(-1, *rest) for n in range(3))

    def join(self, q, k, v, h: Heads) -> torch.Tensor:
        import torch

        own, rest = v.shape[0] // h.d, q.shape[1:]
        q, k = q.reshape(h.heads, h.d, *rest), k.reshape(h.heads, h.d, *rest)
        full = torch.stack([q[:own], k[:own], v.reshape(own, h.d, *rest)], dim=1)
        part = torch.stack([q[own:], k[own:]], dim=1)
        return torch.cat([full.reshape(-1, *rest), part.reshape(-1, *rest)]).contiguous()

    def fused_rows(self, h: Heads, own: int) -> int:
        return (2 * h.heads + own) * h.d

    def target_shape(self, shape: tuple[int, ...], rows: int) -> tuple[int, ...]:
        return (rows, *shape[1:])

    def shapes(self, unfused, src) -> dict[str, tuple[int, ...]]:
        hidden, inter, bias = src.hidden, src.intermediate, src.qkv_bias
        rows = self.fused_rows(Heads(src.heads, src.num_kv_heads, src.head_dim), src.num_kv_heads)
        shapes = {"gpt_neox.embed_in.weight": (src.vocab, hidden)}
        for i in range(src.num_layers):
            p = f"{self.prefix}{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (hidden,)
            linears = {
                "attention.query_key_value": ((rows, hidden), bias),
                "attention.dense": ((hidden, src.heads * src.head_dim), bias),
                "mlp.dense_h_to_4h": ((inter, hidden), True),
                "mlp.dense_4h_to_h": ((hidden, inter), True),
            }
            for name, (shape, has_bias) in linears.items():
                shapes[f"{p}{name}.weight"] = shape
                if has_bias:
                    shapes[f"{p}{name}.bias"] = shape[:1]
        shapes["gpt_neox.final_layer_norm.weight"] = (hidden,)
        shapes["gpt_neox.final_layer_norm.bias"] = (hidden,)
        shapes["embed_out.weight"] = (src.vocab, hidden)
        return shapes


class GPT2Layout(Phi3Layout):
    """GPT-2: Conv1D `c_attn` with weight [in, out] (transposed against a Linear) and bias [out];
    the output columns are [q | k | v] as Phi-3's rows. Tied embeddings by default."""

    default_bias = True

    def __init__(self, base: str = "transformer."):
        # the Hub's original GPT-2 checkpoints name their tensors without `transformer.`
        self.base, self.prefix = base, f"{base}h."

    value_tensors = ("attn.c_attn.weight", "attn.c_attn.bias")
    llama_parts = {
        "attn.c_attn": ("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
        "attn.c_proj": ("conv1d", ("self_attn.o_proj",)),
        "mlp.c_proj": ("conv1d", ("mlp.down_proj",)),
    }
    describe = (
        "[q | k | v] along the output dimension (dim 1 of the Conv1D weight [in, out]): all "
        "query columns, then all key columns, then the own value columns"
    )

    def split(self, tensor: torch.Tensor, h: Heads):
        rows = tensor.T if tensor.dim() == 2 else tensor  # the init reads rows, as of a Linear
        return super().split(rows, h)

    def join(self, q, k, v, h: Heads) -> torch.Tensor:
        import torch

        rows = torch.cat([q, k, v], dim=0)
        return (rows.T if rows.dim() == 2 else rows).contiguous()

    def target_shape(self, shape: tuple[int, ...], rows: int) -> tuple[int, ...]:
        return (shape[0], rows) if len(shape) == 2 else (rows,)

    def shapes(self, unfused, src) -> dict[str, tuple[int, ...]]:
        hidden, inter = src.hidden, src.intermediate
        rows = self.fused_rows(Heads(src.heads, src.num_kv_heads, src.head_dim), src.num_kv_heads)
        shapes = {
            f"{self.base}wte.weight": (src.vocab, hidden),
            f"{self.base}wpe.weight": (src.positions, hidden),
        }
        for i in range(src.num_layers):
            p = f"{self.prefix}{i}."
            for norm in ("ln_1", "ln_2"):
                shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (hidden,)
            conv1d = {
                "attn.c_attn": (hidden, rows),
                "attn.c_proj": (hidden, hidden),
                "mlp.c_fc": (hidden, inter),
                "mlp.c_proj": (inter, hidden),
            }
            for name, shape in conv1d.items():
                shapes[f"{p}{name}.weight"] = shape
                shapes[f"{p}{name}.bias"] = shape[1:]
        shapes[f"{self.base}ln_f.weight"] = shapes[f"{self.base}ln_f.bias"] = (hidden,)
        shapes["lm_head.weight"] = (src.vocab, hidden)
        return shapes


LAYOUTS = {"phi3": Phi3Layout(), "gpt_neox": GPTNeoXLayout(), "gpt2": GPT2Layout()}


BARE_GPT2 = GPT2Layout(base="")


def layout_of(family, bare: bool = False):
    """The fused layout of a family (None: q/k/v are separate tensors); `bare`: a GPT-2
    checkpoint whose names lack the `transformer.` prefix."""
    return BARE_GPT2 if bare and family.name == "gpt2" else LAYOUTS.get(family.name)


def has_bare_names(family, names) -> bool:
    """A GPT-2 checkpoint as the Hub's original ones: `wte.weight`, `h.0.attn.c_attn.weight`."""
    return family.name == "gpt2" and "wte.weight" in names and "transformer.wte.weight" not in names


def later_value_layer(layout, name: str) -> int | None:
    """i for a fused tensor of layer i >= 1 that holds value rows; None otherwise."""
    if not name.startswith(layout.prefix):
        return None
    index, _, rest = name[len(layout.prefix) :].partition(".")
    if not index.isdigit() or int(index) < 1 or rest not in layout.value_tensors:
        return None
    return int(index)


def llama_parts(layout, name: str) -> tuple[str, tuple[str, ...]] | None:
    """(how, the Llama names) of a family tensor the calibrated inits read as Llama projections:
    gpt_neox.layers.1.attention.dense.bias -> ("linear", ("model.layers.1.self_attn.o_proj.bias",));
    None for any other tensor (plans stay torch-free: this is names only)."""
    if layout is None or not name.startswith(layout.prefix):
        return None
    index, _, rest = name[len(layout.prefix) :].partition(".")
    module, _, suffix = rest.rpartition(".")
    if not index.isdigit() or module not in layout.llama_parts or suffix not in ("weight", "bias"):
        return None
    how, parts = layout.llama_parts[module]
    return how, tuple(f"model.layers.{index}.{part}.{suffix}" for part in parts)


def split_record(layout, src, skip_heads: int) -> dict:
    """How to split each layer's fused tensor, for the converted config.json (`fused_qkv_split`):
    the layout and the rows of each part in layer 0 and in the later layers."""
    h = Heads(src.heads, src.num_kv_heads, src.head_dim)
    own = src.num_kv_heads - skip_heads
    return {
        "tensor": layout.value_tensors[0].rsplit(".", 1)[0],
        "layout": layout.describe,
        "head_dim": h.d,
        "layer_0": {"q_heads": h.heads, "k_heads": h.kv, "v_heads": h.kv},
        "layers_1_on": {"q_heads": h.heads, "k_heads": h.kv, "v_heads": own},
    }


def target_shape(layout, src, skip_heads: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    h = Heads(src.heads, src.num_kv_heads, src.head_dim)
    return layout.target_shape(shape, layout.fused_rows(h, src.num_kv_heads - skip_heads))


def rewrite_values(layout, src, tensor: torch.Tensor, value_rows) -> torch.Tensor:
    """A later layer's fused tensor with its value rows replaced by `value_rows(v)` (the init's
    own heads' rows from all source value rows)."""
    h = Heads(src.heads, src.num_kv_heads, src.head_dim)
    q, k, v = layout.split(tensor, h)
    return layout.join(q, k, value_rows(v), h)


# --- the calibrated inits on a Phi-3: a Llama view ----------------------------------------------

UNFUSED = {
    "self_attn.qkv_proj.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


class LlamaView:
    """A Phi-3 source as the Llama it computes: the calibration pass loads q/k/v_proj and
    gate/up_proj cut from the fused tensors and returns tensors under those names, which
    `transform` fuses again. Exact: Phi-3's attention and MLP are Llama's on the split rows."""

    def __init__(self, src):
        self.layout = LAYOUTS["phi3"]
        self.heads = Heads(src.heads, src.num_kv_heads, src.head_dim)

    @staticmethod
    def config(out_config: dict):
        """The Llama (s = 0) the calibration pass builds, from the converted config's fields.
        A `sliding_window` applies to every layer, as Phi-3's (SkipV1LlamaConfig's rule without
        `layer_types`). A partial rotary factor (Phi-4-mini's 0.75) stays in `rope_parameters`: Llama's
        attention rotates the first dims its tables cover (SkipV1AttentionMixin.rotate), and the
        tables honour the factor for every RoPE type but Llama's default, which is the linear
        type with factor 1 (Phi-3's default RoPE, bit for bit)."""
        from ..modeling.configuration_skipv1_llama import SkipV1LlamaConfig

        drop = ("model_type", "auto_map", "architectures", "skip_v_heads")
        fields = {k: v for k, v in out_config.items() if k not in drop}
        config = SkipV1LlamaConfig(**fields, mlp_bias=False, skip_v_heads=0)
        rope = config.rope_parameters
        if rope.get("rope_type") == "default" and rope.get("partial_rotary_factor", 1.0) != 1.0:
            config.rope_parameters = {**rope, "rope_type": "linear", "factor": 1.0}
        return config

    def names(self, names: list[str]) -> list[str]:
        """The source's tensor names as the Llama's (fused ones replaced by their parts)."""
        return [part for name in names for part in self.parts(name)]

    def parts(self, name: str) -> tuple[str, ...]:
        """model.layers.i.self_attn.qkv_proj.weight -> its q/k/v_proj names (others: itself)."""
        for fused, parts in UNFUSED.items():
            if name.endswith("." + fused):
                base = name[: -len(fused)]
                return tuple(base + p for p in parts)
        return (name,)

    def fused_name(self, name: str) -> tuple[str, int] | None:
        """(the fused tensor a Llama name is cut from, which part), None for an unfused one."""
        for fused, parts in UNFUSED.items():
            for n, part in enumerate(parts):
                if name.endswith("." + part):
                    return name[: -len(part)] + fused, n
        return None

    def split(self, fused: str, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A fused tensor's parts, in `parts` order."""
        if fused.endswith("qkv_proj.weight"):
            return self.layout.split(tensor, self.heads)
        return tensor.chunk(2, dim=0)

    def loader(self, load):
        """`load` (source names -> tensors) for the Llama's names."""

        def load_unfused(names: list[str]) -> dict[str, torch.Tensor]:
            wanted = {name: self.fused_name(name) for name in names}
            fused_names = sorted({f[0] if f else n for n, f in wanted.items()})
            tensors = load(fused_names)
            out = {}
            for name, found in wanted.items():
                out[name] = (
                    tensors[name]
                    if found is None
                    else self.split(found[0], tensors[found[0]])[found[1]]
                )
            return out

        return load_unfused

    def wrap(self, result):
        return FusedResult(result, self)


class FusedResult:
    """A calibrated init's result on the Llama view, applied to the fused source tensors."""

    def __init__(self, inner, view: LlamaView):
        self.inner, self.view = inner, view

    def __getattr__(self, name):  # summary(), method, distill, tensors of the inner result
        return getattr(self.inner, name)

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        import torch

        parts = self.view.parts(name)
        if len(parts) == 1:
            return self.inner.transform(name, tensor)
        pieces = self.view.split(name, tensor)
        new = [self.inner.transform(p, t) for p, t in zip(parts, pieces, strict=True)]
        if len(new) == 3:
            return self.view.layout.join(*new, self.view.heads)
        return torch.cat(new, dim=0).contiguous()
