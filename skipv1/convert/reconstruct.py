"""`--init reconstruct` (the default): layer-by-layer reconstruction of the source's attention.

`calibrated` fits each layer on the *source's* activations and changes only the borrowed heads'
o_proj columns. Here the pass carries two streams of hidden states through the layers, the
source's and the converted model's (which drifts from the source as borrowed heads add error),
and for every later layer:

1. chooses which source KV heads give up their values (as `calibrated`: the smallest held-out
   error, measured on the converted model's own activations) and permutes the layer so they sit
   in the borrowed slots;
2. refits the whole o_proj (every head's columns, not only the borrowed ones) by ridge least
   squares, so that the converted layer's attention output on the converted stream matches the
   source layer's on the source stream: the other heads absorb what the borrowed ones lose, and
   the layer corrects part of the drift of the layers before it. The ridge is chosen by two-fold
   cross-validation over alternate calibration sequences, as in `calibrated`;
3. optionally refines q/k/v/o of that layer by a few Adam steps on the same objective (the
   MLP and norms are never touched), keeping the best held-out fit.

Layer 0 is kept unchanged, except that its KV heads may be reordered (a free permutation): the
pass first tries each choice of layer-0 heads for the borrowed slots on a short prefix of the
calibration text and keeps the one with the smallest total error.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from ..modeling.configuration_skipv1_llama import SkipV1LlamaConfig
from .calibrate import (
    RIDGE_GRID,
    LoadTensors,
    _GramStats,
    _load_layer,
    _ridge_solve,
    _rotary,
    _take_heads,
)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class ReconstructSettings:
    target: str = "attention"  # "attention": source attention output; "residual": + drift
    steps: int = 0  # Adam steps of the per-layer refinement (0: closed form only)
    lr: float = 1e-4
    batch_size: int = 8
    mlp: str = "keep"  # "refit": down_proj refitted to the source layer's output


@dataclass
class Reconstruction:
    """New attention tensors per layer, applied to source tensors as the converter streams them."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: dict[int, dict] = field(default_factory=dict)
    layer0_order: list[int] = field(default_factory=list)

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        new = self.tensors.get(name)
        return tensor if new is None else new.to(tensor.dtype)

    def summary(self) -> dict:
        return {
            "layer0_order": self.layer0_order,
            "layers": {str(i): record for i, record in sorted(self.layers.items())},
        }


class _Layer:
    """One decoder layer's attention written out, with its KV heads in a chosen order."""

    def __init__(self, layer, order: list[int], own: int, group: int):
        self.layer, self.attn = layer, layer.self_attn
        self.d, self.own, self.group = self.attn.head_dim, own, group
        self.order = order
        query_order = [h * group + r for h in order for r in range(group)]
        a = self.attn
        self.wq = _take_heads(a.q_proj.weight.detach(), query_order, self.d, 0)
        self.wk = _take_heads(a.k_proj.weight.detach(), order, self.d, 0)
        self.wv = _take_heads(a.v_proj.weight.detach(), order[:own], self.d, 0)
        self.wo = _take_heads(a.o_proj.weight.detach(), query_order, self.d, 1)
        bias = lambda lin, heads: (  # noqa: E731
            None if lin.bias is None else _take_heads(lin.bias.detach()[:, None], heads, self.d, 0)[:, 0]
        )
        self.bq, self.bk = bias(a.q_proj, query_order), bias(a.k_proj, order)
        self.bv = bias(a.v_proj, order[:own])
        self.bo = None if a.o_proj.bias is None else a.o_proj.bias.detach()

    def params(self) -> dict[str, torch.Tensor | None]:
        return {"wq": self.wq, "wk": self.wk, "wv": self.wv, "wo": self.wo, "bq": self.bq,
                "bk": self.bk, "bv": self.bv, "bo": self.bo}

    def mixed(self, hidden, cos, sin, borrowed, p=None):
        """(B, T, H*d) attention mix before o_proj; `borrowed` (B, s, T, d) from layer 0."""
        p = p or self.params()
        b, t, _ = hidden.shape
        x = self.layer.input_layernorm(hidden)
        shape = (b, t, -1, self.d)
        lin = torch.nn.functional.linear
        q = lin(x, p["wq"], p["bq"]).view(shape).transpose(1, 2)
        k = lin(x, p["wk"], p["bk"]).view(shape).transpose(1, 2)
        v = lin(x, p["wv"], p["bv"]).view(shape).transpose(1, 2)
        if borrowed is not None and borrowed.shape[1]:
            v = torch.cat([v, borrowed], dim=1)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, self.group), repeat_kv(v, self.group), is_causal=True,
            scale=self.attn.scaling,
        )
        return out.transpose(1, 2).reshape(b, t, -1)

    def attention(self, hidden, cos, sin, borrowed, p=None):
        p = p or self.params()
        return torch.nn.functional.linear(self.mixed(hidden, cos, sin, borrowed, p), p["wo"], p["bo"])

    def finish(self, hidden, attn_out):
        hidden = hidden + attn_out
        return hidden + self.layer.mlp(self.layer.post_attention_layernorm(hidden))


def _batches(n: int, size: int):
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


@torch.no_grad()
def _source_layer0(layer, hidden, cos, sin, batch_size, kv):
    """Layer 0 of the source: its outputs and its values (all heads)."""
    block = _Layer(layer, list(range(kv)), kv, layer.self_attn.num_key_value_groups)
    outs, values = [], []
    for sl in _batches(hidden.shape[0], batch_size):
        h = hidden[sl]
        x = layer.input_layernorm(h)
        v = torch.nn.functional.linear(x, block.wv, block.bv)
        values.append(v.view(*h.shape[:2], kv, -1).transpose(1, 2))
        outs.append(block.finish(h, block.attention(h, cos, sin, None)))
    return torch.cat(outs), torch.cat(values)


def reconstruct(
    config: SkipV1LlamaConfig,
    load: LoadTensors,
    input_ids: torch.Tensor,
    skip_heads: int,
    settings: ReconstructSettings | None = None,
    on_layer: Callable[[int], None] | None = None,
    device: "str | torch.device" = "cpu",
    layer0_order: list[int] | None = None,
) -> Reconstruction:
    settings = settings or ReconstructSettings()
    kv, d = config.num_key_value_heads, config.head_dim
    group = config.num_attention_heads // kv
    own = kv - skip_heads
    result = Reconstruction()
    embed = load(["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    hidden = embed.float()[input_ids].to(device)
    positions = torch.arange(input_ids.shape[1], device=device).unsqueeze(0)
    cos, sin = _rotary(config).to(device)(hidden[:1], positions)

    layer = _load_layer(config, load, 0).to(device)
    h_src, v0_all = _source_layer0(layer, hidden, cos, sin, settings.batch_size, kv)
    order0 = layer0_order or list(range(kv))
    result.layer0_order = order0
    if order0 != list(range(kv)):
        block = _Layer(layer, order0, kv, group)
        _store(result, 0, block, config)
    v0 = v0_all[:, order0]
    h_stu = h_src
    if on_layer:
        on_layer(0)
    for i in range(1, config.num_hidden_layers):
        layer = _load_layer(config, load, i).to(device)
        h_src, h_stu, record, block = _fit_layer(
            layer, h_src, h_stu, v0, cos, sin, config, skip_heads, settings, device
        )
        _store(result, i, block, config)
        result.layers[i] = record
        del layer
        if on_layer:
            on_layer(i)
    return result


def _store(result: Reconstruction, i: int, block: _Layer, config) -> None:
    prefix = f"model.layers.{i}.self_attn."
    names = {"wq": "q_proj.weight", "wk": "k_proj.weight", "wv": "v_proj.weight",
             "wo": "o_proj.weight", "bq": "q_proj.bias", "bk": "k_proj.bias", "bv": "v_proj.bias",
             "bo": "o_proj.bias"}
    for key, tensor in block.params().items():
        if tensor is not None:
            result.tensors[prefix + names[key]] = tensor.detach().float().cpu().contiguous()
    if getattr(block, "down", None) is not None:
        name = f"model.layers.{i}.mlp.down_proj.weight"
        result.tensors[name] = block.down.detach().float().cpu().contiguous()


@torch.no_grad()
def _fit_layer(layer, h_src, h_stu, v0, cos, sin, config, skip_heads, settings, device):
    kv = config.num_key_value_heads
    group = config.num_attention_heads // kv
    own = kv - skip_heads
    n, bs = h_src.shape[0], settings.batch_size
    source = _Layer(layer, list(range(kv)), kv, group)
    # 1. head choice on the converted stream (the calibrated init's held-out criterion).
    stats = _GramStats(config, skip_heads, device)
    attn = layer.self_attn
    for sl in _batches(n, bs):
        probs, mixed = _probs_and_mix(attn, layer, h_stu[sl], cos, sin, group)
        stats.add(probs, mixed, v0[sl])
        del probs
    choice = stats.fit(attn.o_proj.weight.detach().cpu())
    block = _Layer(layer, choice.order, own, group)
    borrowed = v0[:, own:]
    # 2. targets: the source layer's attention output on the source stream.
    targets, next_src = [], []
    for sl in _batches(n, bs):
        t = source.attention(h_src[sl], cos, sin, None)
        targets.append(t)
        next_src.append(source.finish(h_src[sl], t))
    target = torch.cat(targets)
    if settings.target == "residual":
        target = target + (h_src - h_stu)
    # 3. joint ridge refit of o_proj with a cross-validated strength.
    before = _relative_error(block, h_stu, cos, sin, borrowed, target, bs)
    wo, ridge = _refit_o_proj(block, h_stu, cos, sin, borrowed, target, bs)
    block.wo = wo.to(block.wo.dtype)
    after = _relative_error(block, h_stu, cos, sin, borrowed, target, bs)
    record = {"order": choice.order, "ridge": ridge, "error_before": before, "error_refit": after}
    # 4. optional gradient refinement.
    if settings.steps:
        with torch.enable_grad():
            record["error_refined"] = _refine(block, h_stu, cos, sin, borrowed, target, settings)
    # 5. advance the converted stream with the fitted layer.
    mid = torch.cat(
        [h_stu[sl] + block.attention(h_stu[sl], cos, sin, borrowed[sl]) for sl in _batches(n, bs)]
    )
    next_src = torch.cat(next_src)
    if settings.mlp == "refit":
        # down_proj refitted so that the layer's output matches the source's: corrects drift.
        mlp = layer.mlp

        def pairs():
            for sl in _batches(n, bs):
                t = next_src[sl] - mid[sl]
                yield sl.start, _mlp_input(layer, mid[sl]), t if mlp.down_proj.bias is None else t - mlp.down_proj.bias

        down, record["mlp_ridge"] = _ridge_fit(pairs(), mlp.down_proj.weight.detach())
        block.down = down
        mlp.down_proj.weight.data = down
    next_stu = torch.cat([mid[sl] + layer.mlp(layer.post_attention_layernorm(mid[sl])) for sl in _batches(n, bs)])
    out_err = float((next_stu - next_src).double().pow(2).sum() / (next_src - h_src).double().pow(2).sum())
    record["error_layer_out"] = out_err
    return next_src, next_stu, record, block


def _probs_and_mix(attn, layer, hidden, cos, sin, group):
    b, t, _ = hidden.shape
    x = layer.input_layernorm(hidden)
    shape = (b, t, -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    scores = q @ repeat_kv(k, group).transpose(2, 3) * attn.scaling
    causal = torch.ones(t, t, dtype=torch.bool, device=hidden.device).triu(1)
    probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
    return probs, probs @ repeat_kv(v, group)


def _relative_error(block, hidden, cos, sin, borrowed, target, bs) -> float:
    num = den = 0.0
    for sl in _batches(hidden.shape[0], bs):
        out = block.attention(hidden[sl], cos, sin, borrowed[sl])
        num += float((out - target[sl]).double().pow(2).sum())
        den += float(target[sl].double().pow(2).sum())
    return num / max(den, 1e-30)


def _refit_o_proj(block, hidden, cos, sin, borrowed, target, bs):
    """o_proj = argmin |Z W^T + b - T|^2 + ridge |W - W_src|^2 over the attention mix Z."""

    def pairs():
        for sl in _batches(hidden.shape[0], bs):
            z = block.mixed(hidden[sl], cos, sin, borrowed[sl])
            t = target[sl] if block.bo is None else target[sl] - block.bo
            yield sl.start, z, t

    return _ridge_fit(pairs(), block.wo)


def _mlp_input(layer, hidden):
    """The activations the MLP's down_proj reads: act(gate(x)) * up(x)."""
    mlp = layer.mlp
    x = layer.post_attention_layernorm(hidden)
    return mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)


def _ridge_fit(pairs, prior: torch.Tensor):
    """W (out, in) = argmin sum |Z W^T - T|^2 + ridge |W - prior|^2 from batches (start, Z, T) of
    sequences; the ridge strength (relative to the mean Gram diagonal) is chosen by two-fold
    cross-validation over alternate sequences. Returns (W, strength)."""
    n_in, n_out = prior.shape[1], prior.shape[0]
    device = prior.device
    zz = torch.zeros(2, n_in, n_in, dtype=torch.float64, device=device)
    zt = torch.zeros(2, n_in, n_out, dtype=torch.float64, device=device)
    tt = torch.zeros(2, dtype=torch.float64, device=device)
    for start, z, t in pairs:
        for fold in (0, 1):
            rows = [r for r in range(z.shape[0]) if (start + r) % 2 == fold]
            if not rows:
                continue
            zf, tf = z[rows].flatten(0, 1).double(), t[rows].flatten(0, 1).double()
            zz[fold] += zf.T @ zf
            zt[fold] += zf.T @ tf
            tt[fold] += tf.pow(2).sum()
    zz, zt, tt = zz.cpu(), zt.cpu(), tt.cpu()
    prior_t = prior.detach().double().cpu().T
    eye = torch.eye(n_in, dtype=torch.float64)

    def solve(a, b, lam):
        return torch.linalg.solve(a + lam * eye, b + lam * prior_t)

    def error(w, a, b, c):
        return float((w * (a @ w)).sum() - 2 * (w * b).sum() + c)

    best = None
    if tt[1] > 0:
        for strength in RIDGE_GRID:
            err = 0.0
            for train, test in ((0, 1), (1, 0)):
                lam = strength * float(zz[train].diagonal().mean())
                err += error(solve(zz[train], zt[train], lam), zz[test], zt[test], tt[test])
            if best is None or err < best[0]:
                best = (err, strength)
    strength = best[1] if best else RIDGE_GRID[0]
    a, b = zz.sum(0), zt.sum(0)
    # The absolute ridge that won on one fold, i.e. about half the strength relative to both.
    w = solve(a, b, strength * float(a.diagonal().mean()) / 2)
    return w.T.to(prior.dtype).to(device), strength


def _refine(block, hidden, cos, sin, borrowed, target, settings) -> float:
    """A few Adam steps on q/k/v/o of one layer; keeps the parameters with the best held-out
    error (odd sequences held out)."""
    n = hidden.shape[0]
    train = [i for i in range(n) if i % 2 == 0] or list(range(n))
    held = [i for i in range(n) if i % 2 == 1] or train
    params = {k: v.clone().requires_grad_(True) for k, v in block.params().items() if v is not None}
    opt = torch.optim.Adam(params.values(), lr=settings.lr)
    def held_error():
        with torch.no_grad():
            return _error_on(block, params, hidden, cos, sin, borrowed, target, held, settings.batch_size)
    best_err, best = held_error(), {k: v.detach().clone() for k, v in params.items()}
    gen = torch.Generator().manual_seed(0)
    bs = settings.batch_size
    for step in range(settings.steps):
        pick = torch.tensor(train)[torch.randperm(len(train), generator=gen)[:bs]]
        full = {**{k: None for k in ("bq", "bk", "bv", "bo")}, **params}
        out = block.attention(hidden[pick], cos, sin, borrowed[pick], full)
        loss = (out - target[pick]).pow(2).mean() / target[pick].pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % max(1, settings.steps // 4) == 0 or step + 1 == settings.steps:
            err = held_error()
            if err < best_err:
                best_err, best = err, {k: v.detach().clone() for k, v in params.items()}
    for k, v in best.items():
        setattr(block, k, v)
    return best_err


def _error_on(block, params, hidden, cos, sin, borrowed, target, rows, bs):
    full = {**{k: None for k in ("bq", "bk", "bv", "bo")}, **params}
    num = den = 0.0
    for s in range(0, len(rows), bs):
        pick = torch.tensor(rows[s : s + bs])
        out = block.attention(hidden[pick], cos, sin, borrowed[pick], full)
        num += float((out - target[pick]).double().pow(2).sum())
        den += float(target[pick].double().pow(2).sum())
    return num / max(den, 1e-30)
