"""GPT-NeoX and GPT-2 as the calibrated inits read them. The passes (calibrate.py,
reconstruct.py) name a decoder layer's parts as Llama does; here each layer of the family's own
classes, loaded from the checkpoint, is put behind a face with those names:
`self_attn.{q,k,v,o}_proj` and `mlp.down_proj` are Linear layers cut from the fused, per-head
interleaved (GPT-NeoX) or Conv1D (GPT-2) tensors (`fused.llama_parts`), the two LayerNorms are
`input_layernorm` and `post_attention_layernorm`, the MLP's first projection and activation are
transformers' own modules, and `parallel_residual` says whether the MLP reads the layer's input
(GPT-NeoX's default) or the stream after attention. `FaceView` takes the passes' results, keyed
by the Llama names, back onto the family's tensors.

What differs per family is its `FaceFamily` row: the tensor prefixes, the embeddings (GPT-2 adds
learned positions), the rotary tables (GPT-NeoX's partial rotary; GPT-2 has none) and the
renames its model class applies when loading (GPT-NeoX's `embed_out`).
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from . import fused


@dataclass(frozen=True)
class FaceFamily:
    layout: object  # the fused layout of the standard (prefixed) checkpoint names
    attention: str  # the attention module's name in the decoder layer
    fc: str  # the MLP's first projection (in the decoder layer's mlp)
    norms: tuple[str, str]  # the LayerNorms before attention and before the MLP
    embeddings: tuple[str, ...]  # token embedding (then GPT-2's position embedding)
    model_renames: dict[str, str] = field(default_factory=dict)  # checkpoint -> module names

    def parallel_residual(self, config) -> bool:
        return bool(getattr(config, "use_parallel_residual", False))

    def embed(self, load, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (plus learned positions 0..T-1 where the family has them)."""
        tensors = load(list(self.embeddings))
        hidden = tensors[self.embeddings[0]].float()[input_ids]
        if len(self.embeddings) > 1:
            hidden = hidden + tensors[self.embeddings[1]].float()[: input_ids.shape[1]]
        return hidden

    def rotary_tables(self, config, like: torch.Tensor) -> list:
        """(cos, sin) per layer: GPT-NeoX's partial rotary; (None, None) without RoPE (GPT-2)."""
        if self.attention != "attention":
            return [(None, None)] * config.num_hidden_layers
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

        positions = torch.arange(like.shape[1], device=like.device).unsqueeze(0)
        table = GPTNeoXRotaryEmbedding(config).to(like.device)(like[:1], positions)
        return [table] * config.num_hidden_layers


FACE_FAMILIES = {
    "skipv1_gpt_neox": FaceFamily(
        fused.GPTNeoXLayout(),
        "attention",
        "dense_h_to_4h",
        ("input_layernorm", "post_attention_layernorm"),
        ("gpt_neox.embed_in.weight",),
        {"embed_out.weight": "lm_head.weight"},
    ),
    "skipv1_gpt2": FaceFamily(
        fused.GPT2Layout(),
        "attn",
        "c_fc",
        ("ln_1", "ln_2"),
        ("transformer.wte.weight", "transformer.wpe.weight"),
    ),
}


def face_family(config) -> FaceFamily | None:
    """The row of a SkipV1 config object's family (None: the passes read its layers directly)."""
    return FACE_FAMILIES.get(config.model_type)


def _heads(config) -> fused.Heads:
    return fused.Heads(config.num_attention_heads, config.num_key_value_heads, config.head_dim)


def split(how: str, tensor: torch.Tensor, layout, heads: fused.Heads) -> tuple[torch.Tensor, ...]:
    """A family tensor as the Llama tensors `fused.llama_parts` names (Linear orientation)."""
    if how == "qkv":
        return tuple(layout.split(tensor, heads))
    if how == "conv1d" and tensor.dim() == 2:
        return (tensor.T,)
    return (tensor,)


def join(how: str, pieces, layout, heads: fused.Heads) -> torch.Tensor:
    """`split`'s inverse (a later layer's fused tensor with its own value heads only)."""
    if how == "qkv":
        return layout.join(*pieces, heads)
    (tensor,) = pieces
    return (tensor.T if how == "conv1d" and tensor.dim() == 2 else tensor).contiguous()


def layer_prefix(family: FaceFamily, i: int) -> str:
    return f"{family.layout.prefix}{i}."


class AttentionFace(nn.Module):
    """A family's attention under Llama's names (what the passes call on `layer.self_attn`)."""

    def __init__(self, attn, projections: dict[str, nn.Linear]):
        super().__init__()
        self.config, self.head_dim, self.scaling = attn.config, attn.head_dim, attn.scaling
        self.num_key_value_groups = 1  # both families are multi-head
        for name, linear in projections.items():
            setattr(self, name, linear)
        # GPT-NeoX's partial rotary or GPT-2's identity: stateless, so the stock module (and
        # its fused weights) is not kept
        self._rotate = type(attn).rotate

    def project(self, hidden_states: torch.Tensor, hidden_shape: tuple) -> tuple:
        return tuple(
            p(hidden_states).view(hidden_shape) for p in (self.q_proj, self.k_proj, self.v_proj)
        )

    def rotate(self, queries, keys, position_embeddings) -> tuple:
        return self._rotate(self, queries, keys, position_embeddings)

    def attention_kwargs(self) -> dict:
        return {}  # no sliding windows, no soft-capping


class MLPFace(nn.Module):
    """fc -> activation (transformers' modules) -> down_proj (a Linear cut from the family's)."""

    def __init__(self, fc: nn.Module, act: nn.Module, down_proj: nn.Linear):
        super().__init__()
        self.fc, self.act, self.down_proj = fc, act, down_proj

    def down_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.down_input(x))


class LayerFace(nn.Module):
    def __init__(self, family: FaceFamily, layer: nn.Module):
        super().__init__()
        config = getattr(layer, family.attention).config
        heads, linears = _heads(config), {}
        for module_name, (how, parts) in family.layout.llama_parts.items():
            module = layer.get_submodule(module_name)
            weights = split(how, module.weight.detach(), family.layout, heads)
            biases = (None,) * len(parts)
            if module.bias is not None:
                biases = split(how, module.bias.detach(), family.layout, heads)
            for part, weight, bias in zip(parts, weights, biases, strict=True):
                linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
                linear.weight = nn.Parameter(weight.contiguous())
                if bias is not None:
                    linear.bias = nn.Parameter(bias.contiguous())
                linears[part] = linear
        self.input_layernorm = layer.get_submodule(family.norms[0])
        self.post_attention_layernorm = layer.get_submodule(family.norms[1])
        attention = {p.split(".")[1]: m for p, m in linears.items() if p.startswith("self_attn.")}
        self.self_attn = AttentionFace(getattr(layer, family.attention), attention)
        mlp = layer.mlp
        self.mlp = MLPFace(getattr(mlp, family.fc), mlp.act, linears["mlp.down_proj"])
        self.parallel_residual = family.parallel_residual(config)


class FaceView:
    """A GPT-NeoX or GPT-2 source for the passes: the loader under the standard names (a GPT-2
    checkpoint without `transformer.` reads as one with it) and their results applied back to the
    checkpoint's own tensors."""

    def __init__(self, src, out_config_type: str):
        self.checkpoint_layout = src.qkv_layout  # the checkpoint's names (bare GPT-2 or not)
        self.family = FACE_FAMILIES[out_config_type]
        self.heads = fused.Heads(src.heads, src.num_kv_heads, src.head_dim)
        self.bare = src.bare_names

    def standard(self, name: str) -> str:
        """A checkpoint name (or a standard one: the distillation passes those) as standard."""
        bare = self.bare and not name.startswith("transformer.")
        return f"transformer.{name}" if bare else name

    def checkpoint(self, name: str) -> str:
        return name.removeprefix("transformer.") if self.bare else name

    def names(self, names: list[str]) -> list[str]:
        return [self.standard(n) for n in names]

    def loader(self, load):
        if not self.bare:
            return load

        def load_standard(names: list[str]) -> dict[str, torch.Tensor]:
            tensors = load([self.checkpoint(n) for n in names])
            return {self.standard(n): t for n, t in tensors.items()}

        return load_standard

    def wrap(self, result) -> "FaceResult":
        return FaceResult(result, self)


class FaceResult:
    """A pass's result (keyed by the Llama names) applied to the family's tensors; `tensors`
    holds whole tensors by the standard family names (reconstruct's distillation), which win."""

    def __init__(self, inner, view: FaceView):
        self.inner, self.view, self.tensors = inner, view, {}

    def __getattr__(self, name):  # summary(), method, distill of the inner result
        return getattr(self.inner, name)

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        name = self.view.standard(name)
        if name in self.tensors:
            return self.tensors[name].to(tensor.dtype)
        found = fused.llama_parts(self.view.family.layout, name)
        if found is None:
            return self.inner.transform(name, tensor)
        how, parts = found
        layout, heads = self.view.family.layout, self.view.heads
        pieces = split(how, tensor, layout, heads)
        new = [self.inner.transform(p, t) for p, t in zip(parts, pieces, strict=True)]
        return join(how, new, layout, heads).to(tensor.dtype)


def model_state(config, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names -> the model's module names (GPT-NeoX's embed_out is lm_head)."""
    family = face_family(config)
    if family is None:
        return state
    return {family.model_renames.get(n, n): t for n, t in state.items()}


def llama_names(config, name: str) -> tuple[str, ...]:
    """The Llama names the passes give a family tensor (itself for the Llama layout)."""
    family = face_family(config)
    found = fused.llama_parts(family.layout, name) if family else None
    return found[1] if found else (name,)
