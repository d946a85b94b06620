"""`--init reconstruct` (the default): layer-by-layer reconstruction of the source's hidden states.

`calibrated` fits each layer on the *source's* activations and changes only the borrowed heads'
o_proj columns. Here the pass carries two streams of hidden states through the layers, the
source's and the converted model's (which drifts from the source as borrowed heads add error),
and for every later layer, on the converted stream:

1. chooses which source KV heads give up their values (as `calibrated`: the smallest held-out
   error) and permutes the layer so they sit in the borrowed slots (q/k/v/o together);
2. refits the whole o_proj (every head's columns) by ridge least squares so that the residual
   stream after attention matches the source's: the kept heads absorb part of what the
   borrowed ones lose, and the layer cancels part of the drift of the layers before it;
3. refits the MLP's down_proj the same way, so that the layer's output matches the source
   layer's output (a mixture of experts is kept: its experts are copied). With a parallel
   residual (GPT-NeoX: out = x + attn(ln1 x) + mlp(ln2 x)) step 2's target is x_src + attn_src
   and the MLP reads the converted layer input, so down_proj absorbs what the refitted attention
   still misses of the source's output. GPT-NeoX's and GPT-2's layers are read through their
   Llama-named faces (faces.py); the output projections' biases are kept.

Where the family puts norms on the attention's and the MLP's outputs (OLMo-2, Gemma), each refit's
target is the pre-norm output that the norm maps onto the wanted residual update
(`_pre_norm_target`). The passes run the family's forward as calibrate.py writes it out (scaled
embeddings, RoPE per layer type, sliding-window masks, soft-capped logits: Gemma).

Each ridge shrinks towards the source's weights, with a strength chosen by two-fold
cross-validation over alternate calibration sequences, so small calibration sets do not
overfit. Layer 0, every norm and q/k (up to the permutation), the kept value rows and the MLP's
gate/up projections stay the source's. Memory: one layer's weights plus the two streams'
hidden states of the calibration tokens (2 x tokens x hidden floats).

Tried and dropped (docs/results/post_conversion_smollm2.md): choosing which layer-0 heads are
borrowed (no visible change on SmolLM2) and a per-layer Adam refinement of q/k/v/o (too slow
on a CPU for the conversion's time budget). Also dropped: weighting each token's rows in the
refits by the inverse RMS of the source's stream there. SmolLM2's first token carries massive
activations from layer 11 on (residual RMS ~1000 against ~7) and 37% of the squared difference
between the converted and the source stream at layer 15; weighted, the default conversion went from KJV
+60.7% / CPython docs +88.2% to +63.1% / +82.6% (one run each, the same sampled calibration
text): no gain worth a second rule.
"""

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import repeat_kv

from ..modeling.configuration_skipv1_llama import SkipV1LlamaConfig
from .calibrate import (
    RIDGE_GRID,
    LoadTensors,
    _GramStats,
    _take_heads,
    add_attention,
    add_mlp,
    allowed,
    attention_input,
    attention_output_norm,
    attention_probs,
    family_of_config,
    mlp_input,
    mlp_output_norm,
    mlp_reads,
    source_layers,
    spd_solve,
)

METHOD = (
    "two-stream layer-by-layer reconstruction: per layer, head choice on the converted "
    "model's activations, then ridge refits of the whole o_proj and of mlp.down_proj to the "
    "source's residual stream (ridge towards the source weights, strength by two-fold "
    "cross-validation)"
)


@dataclass
class Reconstruction:
    """New tensors per layer, applied to source tensors as the converter streams them."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: dict[int, dict] = field(default_factory=dict)
    method: str = METHOD
    distill: dict | None = None  # the optional last stage's record (distill_attention.py)

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        new = self.tensors.get(name)
        return tensor if new is None else new.to(tensor.dtype)

    def summary(self) -> dict:
        return {str(i): record for i, record in sorted(self.layers.items())}


class _Attention:
    """A decoder layer's attention with its KV heads in a chosen order; the first `own` value
    heads are its own, the rest come from layer 0."""

    def __init__(self, layer, order: list[int], own: int):
        attn = layer.self_attn
        self.layer, self.d, self.scaling = layer, attn.head_dim, attn.scaling
        self.softcap = attn.attention_kwargs().get("softcap")
        self.group = attn.num_key_value_groups
        queries = [h * self.group + r for h in order for r in range(self.group)]
        self.q = _permuted(attn.q_proj, queries, self.d)
        self.k = _permuted(attn.k_proj, order, self.d)
        self.v = _permuted(attn.v_proj, order[:own], self.d)
        self.o_weight = _take_heads(attn.o_proj.weight.detach(), queries, self.d, dim=1)
        if family_of_config(attn.config).qk_norm_scope == "projection":
            # RMSNorm over all heads of q and of k (OLMo-2): its weights move with the heads
            self.q_norm = _WholeNorm(attn.q_norm, queries, self.d)
            self.k_norm = _WholeNorm(attn.k_norm, order, self.d)
        else:
            # per-head RMSNorm of queries and keys where the family has it (Qwen3): one weight
            # shared by every head, so the head order does not touch it
            identity = torch.nn.Identity()
            self.q_norm = getattr(attn, "q_norm", identity)
            self.k_norm = getattr(attn, "k_norm", identity)
        self.o_bias = None if attn.o_proj.bias is None else attn.o_proj.bias.detach()

    def mixed(self, hidden, cos, sin, borrowed=None):
        """(B, T, H*d): the attention mix o_proj reads; `borrowed` (B, s, T, d) from layer 0."""
        b, t, _ = hidden.shape
        x = attention_input(self.layer, hidden)
        q, k, v = (F.linear(x, *p).view(b, t, -1, self.d) for p in self.qkv)
        q, k, v = (t_.transpose(1, 2) for t_ in (self.q_norm(q), self.k_norm(k), v))
        if borrowed is not None:
            v = torch.cat([v, borrowed], dim=1)
        q, k = self.layer.self_attn.rotate(q, k, (cos, sin))
        if self.softcap:  # SDPA cannot cap the logits (Gemma 2)
            out = attention_probs(self.layer.self_attn, q, k) @ repeat_kv(v, self.group)
        else:
            k, v = repeat_kv(k, self.group), repeat_kv(v, self.group)
            sliding = self.layer.self_attn.attention_kwargs().get("sliding_window")
            mask = allowed(self.layer.self_attn, t, hidden.device) if sliding else None
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scaling
            )
        return out.transpose(1, 2).reshape(b, t, -1)

    @property
    def qkv(self):
        return self.q, self.k, self.v

    def __call__(self, hidden, cos, sin, borrowed=None):
        return F.linear(self.mixed(hidden, cos, sin, borrowed), self.o_weight, self.o_bias)


class _WholeNorm:
    """A family's RMSNorm over a whole q or k projection, its weight in a chosen head order;
    called on (B, T, heads, d)."""

    def __init__(self, norm, heads: list[int], d: int):
        self.norm = copy.deepcopy(norm)
        self.norm.weight = torch.nn.Parameter(_take_heads(norm.weight.detach(), heads, d, dim=0))

    @property
    def weight(self) -> torch.Tensor:
        return self.norm.weight.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.flatten(-2)).view_as(x)


def _permuted(linear, heads: list[int], d: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = _take_heads(linear.weight.detach(), heads, d, dim=0)
    bias = None if linear.bias is None else _take_heads(linear.bias.detach(), heads, d, dim=0)
    return weight, bias


def _down_input(layer, hidden):
    """What the MLP's down_proj reads from the stream `hidden` its input norm reads:
    act(gate(x)) * up(x); GPT-NeoX's and GPT-2's act(fc(x)) (faces.MLPFace)."""
    x = mlp_input(layer, hidden)
    if hasattr(layer.mlp, "down_input"):
        return layer.mlp.down_input(x)
    return layer.mlp.act_fn(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x)


def _dense_mlp(layer) -> bool:
    """A gate/up/down MLP, whose down_proj is refitted; a mixture of experts is kept as it is
    (its experts are copied: the attention fit does not reach them)."""
    return isinstance(getattr(layer.mlp, "down_proj", None), torch.nn.Linear)


def _pre_norm_target(norm, wanted: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """What a linear layer followed by `norm` (an RMSNorm on its output: OLMo-2's and Gemma's
    post-norms) should output for the norm to give `wanted`: RMSNorm is scale-invariant, so
    wanted / gain (`_gain`), scaled per token to the rms of `reference` (the source layer's own
    pre-norm output: the exact answer when nothing drifted). `norm` None: `wanted` itself."""
    if norm is None:
        return wanted
    w = _gain(norm)
    w = torch.where(w.abs() < 1e-6, torch.full_like(w, 1e-6), w)
    y = wanted / w

    def rms(t):
        return t.pow(2).mean(-1, keepdim=True).sqrt()

    return y * (rms(reference) / rms(y).clamp_min(1e-12))


def _gain(norm) -> torch.Tensor:
    """An RMSNorm's per-feature gain (weight; Gemma's 1 + weight) up to a constant factor, which
    `_pre_norm_target` rescales away: its output for an all-ones input."""
    weight = norm.weight.detach()
    return norm(torch.ones(1, weight.shape[-1], dtype=weight.dtype, device=weight.device))[0]


def _batches(n: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


@torch.no_grad()
def reconstruct(
    config: SkipV1LlamaConfig,
    load: LoadTensors,
    input_ids: torch.Tensor,
    skip_heads: int,
    batch_size: int = 8,
    on_layer: Callable[[int], None] | None = None,
    device: "str | torch.device" = "cpu",
) -> Reconstruction:
    """Fits every later layer; `config` describes the source (its skip_v_heads must be 0)."""
    result = Reconstruction()
    own = config.num_key_value_heads - skip_heads
    hidden, layers = source_layers(config, load, input_ids, device)
    batches = _batches(hidden.shape[0], batch_size)
    # Layer 0 is unchanged: both streams leave it equal; its values are what later layers borrow.
    _, layer, (cos, sin) = next(layers)
    first = _Attention(layer, list(range(config.num_key_value_heads)), config.num_key_value_heads)
    borrowed = torch.cat([_values(first, hidden[b])[:, own:] for b in batches])
    source = torch.cat(
        [
            add_mlp(layer, add_attention(layer, hidden[b], first(hidden[b], cos, sin)), hidden[b])
            for b in batches
        ]
    )
    converted = source
    if on_layer:
        on_layer(0)
    for i, layer, (cos, sin) in layers:
        fit = _LayerFit(layer, config, skip_heads, cos, sin, batches)
        source, converted, result.layers[i] = fit.run(source, converted, borrowed)
        prefix = f"model.layers.{i}."
        for name, tensor in fit.tensors().items():
            result.tensors[prefix + name] = tensor.float().cpu().contiguous()
        del layer, fit
        if on_layer:
            on_layer(i)
    return result


@torch.no_grad()
def source_hidden_states(config, load: LoadTensors, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """The source stream of the reconstruct init after each layer (its own attention and MLP
    written out); the model's own forward gives the same (tests/test_gemma.py)."""
    hidden, layers = source_layers(config, load, input_ids)
    states, kv = [], config.num_key_value_heads
    for _, layer, (cos, sin) in layers:
        attn = _Attention(layer, list(range(kv)), kv)
        hidden = add_mlp(layer, add_attention(layer, hidden, attn(hidden, cos, sin)), hidden)
        states.append(hidden)
    return states


def _values(attn: _Attention, hidden: torch.Tensor) -> torch.Tensor:
    b, t, _ = hidden.shape
    x = attention_input(attn.layer, hidden)
    return F.linear(x, *attn.v).view(b, t, -1, attn.d).transpose(1, 2)


class _LayerFit:
    """Steps 1-3 of the module docstring for one later layer."""

    def __init__(self, layer, config, skip_heads, cos, sin, batches):
        self.layer, self.config, self.skip_heads = layer, config, skip_heads
        self.cos, self.sin, self.batches = cos, sin, batches
        self.own = config.num_key_value_heads - skip_heads

    def run(self, source, converted, borrowed):
        kv, layer = self.config.num_key_value_heads, self.layer
        src_attn = _Attention(layer, list(range(kv)), kv)
        src_mid = self._map(
            lambda b: add_attention(layer, source[b], src_attn(source[b], self.cos, self.sin))
        )
        src_out = self._map(lambda b: add_mlp(layer, src_mid[b], source[b]))
        order, choice_error = self._choose_heads(converted, borrowed)
        self.attn = _Attention(layer, order, self.own)
        mixed = lambda b: self.attn.mixed(converted[b], self.cos, self.sin, borrowed[b])  # noqa: E731
        # o_proj: converted + attention ~ the source's stream after attention.
        attn_norm = attention_output_norm(layer)
        self.attn.o_weight, o_ridge = _ridge_fit(
            self._pairs(
                mixed,
                lambda b: _pre_norm_target(
                    attn_norm,
                    src_mid[b] - converted[b],
                    None if attn_norm is None else src_attn(source[b], self.cos, self.sin),
                ),
                self.attn.o_bias,
            ),
            self.attn.o_weight,
        )
        mid = self._map(
            lambda b: add_attention(
                layer, converted[b], self.attn(converted[b], self.cos, self.sin, borrowed[b])
            )
        )
        down_ridge = None
        self.dense = _dense_mlp(layer)
        if self.dense:  # down_proj: mid + MLP ~ the source layer's output.
            # With a parallel residual the MLP reads the layer's input, not mid; the target is
            # the same: what the source layer's output lacks after the refitted attention.
            down, mlp_norm = layer.mlp.down_proj, mlp_output_norm(layer)
            down.weight.data, down_ridge = _ridge_fit(
                self._pairs(
                    lambda b: _down_input(layer, mlp_reads(layer, converted[b], mid[b])),
                    lambda b: _pre_norm_target(
                        mlp_norm,
                        src_out[b] - mid[b],
                        None
                        if mlp_norm is None
                        else layer.mlp(mlp_input(layer, mlp_reads(layer, source[b], src_mid[b]))),
                    ),
                    down.bias,
                ),
                down.weight.detach(),
            )
        out = self._map(lambda b: add_mlp(layer, mid[b], converted[b]))
        record = {
            "order": order,
            "error_head_choice": choice_error,
            "ridge_o_proj": o_ridge,
            "ridge_down_proj": down_ridge,
            # |converted - source|^2 / |source layer's update|^2 at the layer's output
            "error_out": _ratio(out - src_out, src_out - source),
        }
        return src_out, out, record

    def tensors(self) -> dict[str, torch.Tensor]:
        names = {"q_proj": self.attn.q, "k_proj": self.attn.k, "v_proj": self.attn.v}
        out = {}
        for proj, (weight, bias) in names.items():
            out[f"self_attn.{proj}.weight"] = weight
            if bias is not None:
                out[f"self_attn.{proj}.bias"] = bias
        out["self_attn.o_proj.weight"] = self.attn.o_weight
        if isinstance(self.attn.q_norm, _WholeNorm):
            out["self_attn.q_norm.weight"] = self.attn.q_norm.weight
            out["self_attn.k_norm.weight"] = self.attn.k_norm.weight
        if self.dense:
            out["mlp.down_proj.weight"] = self.layer.mlp.down_proj.weight.detach()
        return out

    def _choose_heads(self, converted, borrowed) -> tuple[list[int], float]:
        """The calibrated init's held-out head choice, on the converted stream."""
        stats = _GramStats(self.config, self.skip_heads, converted.device)
        attn = _Attention(self.layer, list(range(self.config.num_key_value_heads)), 0)
        for b in self.batches:
            probs, mixed = _probs_and_mix(attn, converted[b], self.cos, self.sin)
            stats.add(probs, mixed, _pad_own_slots(borrowed[b], self.own))
        fit = stats.fit(self.layer.self_attn.o_proj.weight.detach().cpu())
        return fit.order, fit.error_fitted

    def _map(self, fn) -> torch.Tensor:
        return torch.cat([fn(b) for b in self.batches])

    def _pairs(self, features, target, bias) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for b in self.batches:
            t = target(b)
            yield b.start, features(b), t if bias is None else t - bias


def _pad_own_slots(borrowed: torch.Tensor, own: int) -> torch.Tensor:
    """Layer 0's values as `_GramStats` indexes them (by slot, all KV heads); it reads only the
    borrowed slots, so the own ones are zeros."""
    pad = borrowed.new_zeros(borrowed.shape[0], own, *borrowed.shape[2:])
    return torch.cat([pad, borrowed], dim=1)


def _probs_and_mix(attn: _Attention, hidden, cos, sin):
    """Attention probabilities (B, H, T, T) and the source's mix (B, H, T, d), all heads own."""
    b, t, _ = hidden.shape
    x = attention_input(attn.layer, hidden)
    q, k = (F.linear(x, *p).view(b, t, -1, attn.d) for p in (attn.q, attn.k))
    q, k = attn.q_norm(q).transpose(1, 2), attn.k_norm(k).transpose(1, 2)
    v = F.linear(x, attn.layer.self_attn.v_proj.weight, attn.layer.self_attn.v_proj.bias)
    v = v.view(b, t, -1, attn.d).transpose(1, 2)
    q, k = attn.layer.self_attn.rotate(q, k, (cos, sin))
    probs = attention_probs(attn.layer.self_attn, q, k)
    return probs, probs @ repeat_kv(v, attn.group)


def _ratio(diff: torch.Tensor, ref: torch.Tensor) -> float:
    return float(diff.double().pow(2).sum() / ref.double().pow(2).sum().clamp_min(1e-30))


def _ridge_fit(pairs, prior: torch.Tensor) -> tuple[torch.Tensor, float]:
    """W (out, in) = argmin sum |Z W^T - T|^2 + ridge |W - prior|^2 from batches (start, Z, T)
    of whole sequences; the ridge strength (relative to the mean Gram diagonal) is chosen by
    two-fold cross-validation over alternate sequences. Returns (W, strength)."""
    n_in, n_out = prior.shape[1], prior.shape[0]
    zz = torch.zeros(2, n_in, n_in, dtype=torch.float64, device=prior.device)
    zt = torch.zeros(2, n_in, n_out, dtype=torch.float64, device=prior.device)
    tt = torch.zeros(2, dtype=torch.float64, device=prior.device)
    for start, z, t in pairs:
        for fold in (0, 1):
            rows = [r for r in range(z.shape[0]) if (start + r) % 2 == fold]
            if rows:
                # One batch's Gram in float32 (a few thousand rows), summed in float64.
                zf, tf = z[rows].flatten(0, 1).float(), t[rows].flatten(0, 1).float()
                zz[fold] += (zf.T @ zf).double()
                zt[fold] += (zf.T @ tf).double()
                tt[fold] += tf.double().pow(2).sum()
    zz, zt, tt = zz.cpu(), zt.cpu(), tt.cpu()
    prior_t = prior.detach().double().cpu().T
    eye = torch.eye(n_in, dtype=torch.float64)

    def solve(a, b, lam):
        return spd_solve(a + lam * eye, b + lam * prior_t)

    def held_out_error(w, a, b, c):  # |Z W - T|^2 from the Grams
        return float((w * (a @ w)).sum() - 2 * (w * b).sum() + c)

    strength, best = RIDGE_GRID[0], None
    if tt[1] > 0:  # at least two sequences: cross-validate
        for candidate in RIDGE_GRID:
            error = 0.0
            for train, test in ((0, 1), (1, 0)):
                lam = candidate * float(zz[train].diagonal().mean())
                w = solve(zz[train], zt[train], lam)
                error += held_out_error(w, zz[test], zt[test], tt[test])
            if best is None or error < best:
                strength, best = candidate, error
    a, b = zz.sum(0), zt.sum(0)
    # The absolute ridge that won on one fold: about half the strength relative to both.
    w = solve(a, b, strength * float(a.diagonal().mean()) / 2)
    return w.T.to(prior.dtype).to(prior.device), strength
