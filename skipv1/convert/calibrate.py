"""`--init calibrated`: choose and refit the heads of every later layer on calibration text.

For each layer i >= 1, on the source model's own activations:

1. Every source KV head h is a candidate to give up its values; if it sits in borrowed slot j it
   reads layer 0's value head j instead. For each query head q of h, the o_proj columns W_q are
   refitted by least squares so that `P_q V0_j W_q'` is as close as possible to the source's
   `P_q V_h W_q` (P_q: q's attention probabilities; the fit has a closed form from d x d
   Gram matrices accumulated over the calibration tokens, so memory stays small). Each fit is
   a ridge regression whose strength is chosen by two-fold cross-validation over alternate
   calibration sequences, so that small calibration sets do not overfit.
2. The s (head, slot) pairs with the smallest held-out output error are chosen greedily; the
   other heads keep their own values exactly (no mean pooling).
3. The layer's KV heads are permuted so that the kept heads fill the own slots and the chosen
   ones the borrowed slots; q/k rows, v rows and o_proj columns move together, which leaves the
   source function unchanged before the drop (RoPE acts inside a head, so it does not care).

The pass runs layer by layer: one layer's weights are loaded at a time, the hidden states of the
calibration tokens are carried from layer to layer, and layer 0's values are kept. The result is
a `Calibration`, applied to tensors as the converter streams them.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers.models.llama.modeling_llama import repeat_kv

from ..errors import SkipV1Error
from ..families import SKIPV1_MODEL_TYPES
from ..modeling import FAMILY_CLASSES
from ..modeling.configuration_skipv1_llama import SkipV1LlamaConfig
from ..packing import cut_blocks, token_stream
from .experts import checkpoint_names, module_state
from .faces import FACE_FAMILIES, FaceView, LayerFace, face_family, layer_prefix
from .fused import LlamaView
from .names import later_attention_norm, later_attention_projection

LoadTensors = Callable[[list[str]], dict[str, torch.Tensor]]


@dataclass
class LayerFit:
    order: list[int]  # source KV head placed in each slot of the layer
    o_proj_columns: dict[int, torch.Tensor]  # new (hidden, d) columns per query head (new index)
    error_dropped: float  # output error if the chosen heads' contributions were simply removed
    error_fitted: float  # output error after the refit (held out: cross-validated)
    ridge: list[float] = field(default_factory=list)  # chosen strength per borrowed query head


@dataclass
class Calibration:
    heads: int
    num_kv_heads: int
    head_dim: int
    skip_heads: int
    layers: dict[int, LayerFit] = field(default_factory=dict)
    # q/k norms over the whole projection (OLMo-2): their weights move with the heads
    whole_qk_norms: bool = False

    @property
    def group(self) -> int:
        return self.heads // self.num_kv_heads

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The calibrated version of a source tensor (unchanged for tensors it does not touch)."""
        proj = later_attention_projection(name)
        if proj is None and self.whole_qk_norms:
            proj = later_attention_norm(name)
        layer = int(name.split(".")[2]) if proj else None
        if layer not in self.layers:
            return tensor
        fit, d = self.layers[layer], self.head_dim
        if proj == "v_proj":
            own = self.num_kv_heads - self.skip_heads
            return heads_in_order("v_proj", tensor, fit.order[:own], self.group, d)
        if proj != "o_proj":
            return heads_in_order(proj, tensor, fit.order, self.group, d)
        if tensor.dim() == 1:  # o_proj bias: one per output feature, untouched by head order
            return tensor
        out = heads_in_order("o_proj", tensor, fit.order, self.group, d)
        for q, columns in fit.o_proj_columns.items():
            out[:, q * d : (q + 1) * d] = columns.to(out.dtype)
        return out

    def summary(self) -> dict:
        return {
            str(i): {
                "order": fit.order,
                "error_dropped": fit.error_dropped,
                "error_fitted": fit.error_fitted,
                "ridge": fit.ridge,
            }
            for i, fit in sorted(self.layers.items())
        }


def _take_heads(tensor: torch.Tensor, heads: list[int], d: int, dim: int) -> torch.Tensor:
    index = torch.tensor([h * d + i for h in heads for i in range(d)], dtype=torch.long)
    return tensor.index_select(dim, index).contiguous()


def heads_in_order(proj: str, tensor: torch.Tensor, order: list[int], group: int, d: int):
    """A later layer's attention tensor with its KV heads in `order` (each head's `group` query
    heads follow it): q/k/v rows, o_proj's weight columns, and the weights of q/k norms over the
    whole projection; anything else (o_proj's bias) is returned as it is."""
    queries = [h * group + r for h in order for r in range(group)]
    if proj in ("q_proj", "q_norm"):
        return _take_heads(tensor, queries, d, dim=0)
    if proj in ("k_proj", "k_norm", "v_proj"):
        return _take_heads(tensor, order, d, dim=0)
    if proj == "o_proj" and tensor.dim() == 2:
        return _take_heads(tensor, queries, d, dim=1)
    return tensor


def calibrate(
    config: SkipV1LlamaConfig,
    load: LoadTensors,
    input_ids: torch.Tensor,
    skip_heads: int,
    batch_size: int = 8,
    on_layer: Callable[[int], None] | None = None,
    device: "str | torch.device" = "cpu",
) -> Calibration:
    """Fits every later layer; `config` describes the source (its skip_v_heads must be 0)."""
    calibration = Calibration(
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        skip_heads,
        whole_qk_norms=family_of_config(config).qk_norm_scope == "projection",
    )
    hidden, layers = source_layers(config, load, input_ids, device)
    first_values = None
    for i, layer, (cos, sin) in layers:
        stats = _GramStats(config, skip_heads, device) if i > 0 and skip_heads > 0 else None
        outputs, values = [], []
        for start in range(0, hidden.shape[0], batch_size):
            h = hidden[start : start + batch_size]
            v0 = first_values[start : start + batch_size] if first_values is not None else None
            out, v = _layer_forward(layer, h, cos, sin, stats, v0)
            outputs.append(out)
            values.append(v)
        if i == 0:
            first_values = torch.cat(values)
        if stats is not None:
            calibration.layers[i] = stats.fit(layer.self_attn.o_proj.weight.detach().cpu())
        hidden = torch.cat(outputs)
        del layer
        if on_layer is not None:
            on_layer(i)
    return calibration


def _rotary(config: SkipV1LlamaConfig):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config)


def family_of_config(config):
    """The family of a SkipV1 config object."""
    return SKIPV1_MODEL_TYPES[config.model_type]


# --- the family's forward, written out (here and in reconstruct.py): embeddings, RoPE, the
# attention's mask and soft-capping, where the norms sit ---


def embed_inputs(config, load: LoadTensors, input_ids: torch.Tensor) -> torch.Tensor:
    """Input embeddings of the calibration tokens (float); Gemma scales them by sqrt(hidden),
    GPT-2 adds its learned positions (faces.py)."""
    if face_family(config):
        return face_family(config).embed(load, input_ids)
    embed = load(["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    hidden = embed.float()[input_ids]
    scaled = family_of_config(config).scaled_embeddings
    return hidden * config.hidden_size**0.5 if scaled else hidden


def rotary_tables(config, like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) of every layer for positions 0..T-1 of `like` (B, T, hidden): one RoPE for all
    layers, or one per layer type where the config has them (Gemma 3: local and global bases)."""
    if face_family(config):  # GPT-NeoX's partial rotary, GPT-2's none
        return face_family(config).rotary_tables(config, like)
    positions = torch.arange(like.shape[1], device=like.device).unsqueeze(0)
    types = list(getattr(config, "layer_types", None) or ["full_attention"])
    types += [types[-1]] * (config.num_hidden_layers - len(types))
    rope = getattr(config, "rope_parameters", None) or {}
    if set(types) <= set(rope):  # rope_parameters keyed by layer type
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

        rotary = Gemma3RotaryEmbedding(config).to(like.device)
        table = {t: rotary(like[:1], positions, t) for t in set(types)}
    else:
        both = _rotary(config).to(like.device)(like[:1], positions)
        table = dict.fromkeys(set(types), both)
    return [table[t] for t in types]


def attention_probs(attn, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) attention probabilities of roped q (B, H, T, d) and k (B, KV, T, d): causal,
    within the layer's sliding window where it has one, logits soft-capped where the family caps
    them (Gemma 2); the same call arguments the model's attention passes (`attention_kwargs`)."""
    extra = attn.attention_kwargs()
    scores = q @ repeat_kv(k, attn.num_key_value_groups).transpose(2, 3) * attn.scaling
    if extra.get("softcap"):
        scores = torch.tanh(scores / extra["softcap"]) * extra["softcap"]
    return scores.masked_fill(~allowed(attn, q.shape[2], q.device), float("-inf")).softmax(-1)


def allowed(attn, length: int, device) -> torch.Tensor:
    """(T, T) bool, True where a query may attend: causal, and within a sliding window."""
    pos = torch.arange(length, device=device)
    distance = pos[:, None] - pos[None, :]
    window = attn.attention_kwargs().get("sliding_window")
    return (distance >= 0) & (distance < window) if window else distance >= 0


def _norm(layer, slot: str):
    """The layer's norm at `slot` of its family's LayerNorms (None: the family has none there)."""
    name = getattr(family_of_config(layer.self_attn.config).norms, slot)
    return None if name is None else getattr(layer, name)


def _apply(norm, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)


def attention_input(layer, hidden: torch.Tensor) -> torch.Tensor:
    return _apply(_norm(layer, "attention_input"), hidden)


def attention_output_norm(layer):
    """The norm applied to the attention's output before the residual add (OLMo-2, Gemma; None:
    none)."""
    return _norm(layer, "attention_output")


def add_attention(layer, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The residual stream after attention, from its input and the attention's output."""
    return hidden + _apply(attention_output_norm(layer), out)


def mlp_input(layer, hidden: torch.Tensor) -> torch.Tensor:
    return _apply(_norm(layer, "mlp_input"), hidden)


def mlp_output_norm(layer):
    """The norm applied to the MLP's output before the residual add (OLMo-2, Gemma; None: none)."""
    return _norm(layer, "mlp_output")


def mlp_reads(layer, layer_input: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
    """The stream the MLP's input norm reads: the one after attention, or with a parallel
    residual (GPT-NeoX: out = x + attn(ln1 x) + mlp(ln2 x)) the layer's input."""
    return layer_input if getattr(layer, "parallel_residual", False) else mid


def add_mlp(layer, mid: torch.Tensor, layer_input: torch.Tensor) -> torch.Tensor:
    """The layer's output from the stream after attention (`mid`) and the layer's input."""
    x = mlp_input(layer, mlp_reads(layer, layer_input, mid))
    return mid + _apply(mlp_output_norm(layer), layer.mlp(x))


def _load_layer(config: SkipV1LlamaConfig, load: LoadTensors, i: int):
    """Decoder layer i of the source, of the config's family (Llama, Qwen3...); GPT-NeoX's and
    GPT-2's behind their Llama-named faces (faces.py)."""
    causal_lm = FAMILY_CLASSES[config.model_type][1]
    with torch.device("meta"):
        layer = causal_lm.base_model_class.decoder_layer_class(config, i)
    face = face_family(config)
    prefix = layer_prefix(face, i) if face else f"model.layers.{i}."
    names = [prefix + name for name in layer.state_dict()]
    tensors = module_state(config, load(checkpoint_names(config, names)))
    state = {name[len(prefix) :]: t.float() for name, t in tensors.items()}
    layer.load_state_dict(state, assign=True, strict=True)
    return (LayerFace(face, layer) if face else layer).eval()


def source_layers(
    config, load: LoadTensors, input_ids: torch.Tensor, device: "str | torch.device" = "cpu"
) -> tuple[torch.Tensor, Iterator[tuple[int, torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]]]:
    """How every layer-by-layer pass over the source starts (calibrated, reconstruct and their
    reference forwards): the calibration tokens' input embeddings on `device`, and
    (i, decoder layer i on `device`, its RoPE (cos, sin)) for each layer in turn, each layer
    loaded only when the loop reaches it, so one layer's weights are in memory at a time."""
    hidden = embed_inputs(config, load, input_ids).to(device)
    tables = rotary_tables(config, hidden)
    layers = (
        (i, _load_layer(config, load, i).to(device), tables[i])
        for i in range(config.num_hidden_layers)
    )
    return hidden, layers


@torch.no_grad()
def source_hidden_states(config, load: LoadTensors, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """The source's residual stream after each layer as the calibrated init computes it (its
    hand-written forward); the model's own forward gives the same (tests/test_gemma.py)."""
    hidden, layers = source_layers(config, load, input_ids)
    states = []
    for _, layer, (cos, sin) in layers:
        hidden, _ = _layer_forward(layer, hidden, cos, sin, None, None)
        states.append(hidden)
    return states


@torch.no_grad()
def _layer_forward(layer, hidden, cos, sin, stats, first_values):
    """The source layer's forward, written out to expose attention probabilities and values."""
    attn = layer.self_attn
    batch, length, _ = hidden.shape
    x = attention_input(layer, hidden)
    # the family's own projections (Qwen3: q/k RMSNorm per head), before RoPE
    q, k, v = (t.transpose(1, 2) for t in attn.project(x, (batch, length, -1, attn.head_dim)))
    q, k = attn.rotate(q, k, (cos, sin))  # the family's RoPE (GPT-NeoX: partial; GPT-2: none)
    probs = attention_probs(attn, q, k)
    mixed = probs @ repeat_kv(v, attn.num_key_value_groups)  # (B, H, T, d)
    if stats is not None:
        stats.add(probs, mixed, first_values)
    attn_out = attn.o_proj(mixed.transpose(1, 2).reshape(batch, length, -1))
    return add_mlp(layer, add_attention(layer, hidden, attn_out), hidden), v


# Relative ridge strengths tried for each fit (times the mean diagonal of the fold's Z^T Z).
RIDGE_GRID = (1e-6, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


class _GramStats:
    """d x d Gram matrices per (query head, borrowed slot): Z = P_q V0_j, Y = P_q V_h.

    Kept in two folds (alternate calibration sequences) so that each fit's ridge is chosen by
    cross-validation: with a few thousand tokens a nearly unregularised fit overfits badly
    (SmolLM2, 8k calibration tokens: perplexity 55.1 with a fixed relative ridge of 1e-6, 24.4
    cross-validated; docs/results/post_conversion_smollm2.md), while with more data a small
    ridge is best.
    """

    def __init__(self, config: SkipV1LlamaConfig, skip_heads: int, device="cpu"):
        self.heads, self.kv = config.num_attention_heads, config.num_key_value_heads
        self.d, self.s = config.head_dim, skip_heads
        self.slots = list(range(self.kv - skip_heads, self.kv))
        shape = (2, len(self.slots), self.heads, self.d, self.d)
        self.zz = torch.zeros(shape, dtype=torch.float64, device=device)
        self.zy = torch.zeros_like(self.zz)
        self.yy = torch.zeros((2, *shape[2:]), dtype=torch.float64, device=device)

    def add(self, probs, mixed, first_values) -> None:
        for fold in (0, 1):
            p, y = probs[fold::2], mixed[fold::2].double()
            if not len(y):
                continue
            self.yy[fold] += torch.einsum("bhtd,bhte->hde", y, y)
            for n, j in enumerate(self.slots):
                z = (p @ first_values[fold::2, j : j + 1]).double()  # (B, H, T, d)
                self.zz[fold, n] += torch.einsum("bhtd,bhte->hde", z, z)
                self.zy[fold, n] += torch.einsum("bhtd,bhte->hde", z, y)

    def fit(self, o_proj: torch.Tensor) -> LayerFit:
        """Closed-form fits on the CPU (d x d systems), from statistics gathered on any device."""
        self.zz, self.zy, self.yy = self.zz.cpu(), self.zy.cpu(), self.yy.cpu()
        d, group = self.d, self.heads // self.kv
        blocks = o_proj.double().reshape(o_proj.shape[0], self.heads, d).permute(1, 0, 2)
        gram_o = blocks.transpose(1, 2) @ blocks  # (H, d, d): W_q^T W_q
        zz, zy, yy = self.zz.sum(0), self.zy.sum(0), self.yy.sum(0)
        maps, ridges = {}, {}
        errors = torch.zeros(self.kv, len(self.slots), dtype=torch.float64)
        for n in range(len(self.slots)):
            ridge, error = self._cross_validate(n, gram_o, zz[n])
            maps[n] = _ridge_solve(zz[n], zy[n], ridge)
            if error is None:  # one calibration sequence: no held-out fold, in-sample error
                error = _output_error(maps[n], zz[n], zy[n], yy, gram_o)
            errors[:, n] = error.reshape(self.kv, group).sum(1)
            ridges[n] = ridge
        chosen = _greedy_assignment(errors, self.s)
        kept = [h for h in range(self.kv) if h not in chosen.values()]
        order = kept + [chosen[n] for n in range(len(self.slots))]
        columns, strengths = {}, []
        for n, h in chosen.items():
            for r in range(group):
                q_src = h * group + r
                new_q = (self.kv - self.s + n) * group + r
                # Output = Z M W_q^T, so the new (hidden, d) block is W_q M^T.
                columns[new_q] = (blocks[q_src] @ maps[n][q_src].transpose(0, 1)).float()
                scale = self._relative_ridge(zz[n][q_src], 1.0)
                strengths.append(float(f"{float(ridges[n][q_src] / scale):.3g}"))
        dropped = sum(
            float((yy[h * group + r] * gram_o[h * group + r]).sum())
            for h in chosen.values()
            for r in range(group)
        )
        fitted = float(sum(errors[h, n] for n, h in chosen.items()))
        return LayerFit(order, columns, dropped, fitted, strengths)

    def _cross_validate(self, n: int, gram_o: torch.Tensor, zz_all: torch.Tensor):
        """Per query head, the absolute ridge whose fit on one fold best predicts the other (on
        the output error), and that held-out error summed over both folds. The ridge is kept in
        absolute terms, so relative to all the data it is about half what won on one fold."""
        if not bool(self.yy[1].diagonal(dim1=-2, dim2=-1).sum() > 0):
            return self._relative_ridge(zz_all, RIDGE_GRID[0]), None
        best_error = best_ridge = None
        for strength in RIDGE_GRID:
            error = torch.zeros(self.heads, dtype=torch.float64)
            ridge = torch.zeros(self.heads, dtype=torch.float64)
            for train, test in ((0, 1), (1, 0)):
                lam = self._relative_ridge(self.zz[train, n], strength)
                m = _ridge_solve(self.zz[train, n], self.zy[train, n], lam)
                error += _output_error(m, self.zz[test, n], self.zy[test, n], self.yy[test], gram_o)
                ridge += lam / 2
            if best_error is None:
                best_error, best_ridge = error, ridge
            else:
                better = error < best_error
                best_error = torch.where(better, error, best_error)
                best_ridge = torch.where(better, ridge, best_ridge)
        return best_ridge, best_error

    @staticmethod
    def _relative_ridge(zz: torch.Tensor, strength: float) -> torch.Tensor:
        return strength * zz.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-12)


def _ridge_solve(zz: torch.Tensor, zy: torch.Tensor, ridge: torch.Tensor) -> torch.Tensor:
    """argmin_M |Z M - Y|^2 + ridge |M|^2 per query head, from Grams (H, d, d) and ridge (H,)."""
    eye = torch.eye(zz.shape[-1], dtype=zz.dtype)
    return spd_solve(zz + ridge[:, None, None] * eye, zy)


def spd_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^-1 b for a ridge-regularised Gram a (symmetric positive definite, batched or not).
    Cholesky costs half an LU solve (a SmolLM2 down_proj fit: 99 vs 198 ms per solve here), which
    matters because each fit's cross-validation solves 25 times; a Gram that is not numerically
    positive definite (all-zero features, no ridge) falls back to the general solver."""
    factor, info = torch.linalg.cholesky_ex(a)
    if bool((info != 0).any()):
        return torch.linalg.solve(a, b)
    return torch.cholesky_solve(b, factor)


def _output_error(m, zz, zy, yy, gram_o) -> torch.Tensor:
    """Per query head, |Z M W^T - Y W^T|^2 from Grams: tr((M'ZZM - 2 sym(M'ZY) + YY) W'W)."""
    mt = m.transpose(1, 2)
    resid = mt @ zz @ m - 2 * _sym(mt @ zy) + yy
    return (resid * gram_o).sum(dim=(1, 2))  # tr(E G) with E, G symmetric


def _sym(m: torch.Tensor) -> torch.Tensor:
    return (m + m.transpose(-1, -2)) / 2


def _greedy_assignment(errors: torch.Tensor, count: int) -> dict[int, int]:
    """slot -> source head, taking the cheapest remaining (head, slot) pair each time."""
    chosen: dict[int, int] = {}
    cost = errors.clone()
    for _ in range(count):
        flat = int(torch.argmin(cost))
        head, slot = divmod(flat, cost.shape[1])
        chosen[slot] = head
        cost[head, :] = float("inf")
        cost[:, slot] = float("inf")
    return chosen


def calibration_token_blocks(
    tokenizer, texts: Iterator[str], tokens: int, seq_len: int
) -> torch.Tensor:
    """(N, seq_len) token ids packed by packing.py, at most `tokens` in all (at least one block)."""
    stream = token_stream(texts, tokenizer, max(seq_len, tokens // seq_len * seq_len))
    blocks = cut_blocks(stream, seq_len)
    if len(blocks) == 0:
        raise SkipV1Error(
            f"the calibration text has {len(stream)} tokens, fewer than one sequence of "
            f"{seq_len}: give more text (--calib-data) or a smaller --calib-seq-len"
        )
    return torch.from_numpy(blocks)


# --- glue with the converter ------------------------------------------------------------------


def _as_is(result):
    return result


@dataclass
class CalibrationRun:
    """What a calibrated init's `fit` reads: the source, its calibration tokens, the options."""

    config: SkipV1LlamaConfig  # the source as a SkipV1 config with s = 0
    load: LoadTensors
    ids: torch.Tensor  # (N, seq_len) calibration tokens
    skip_heads: int
    options: object  # ConvertOptions
    tensor_names: list[str]  # every tensor of the source, for passes that need the whole model
    progress: object  # a rich Progress
    device: str
    # the passes' result (Llama names) -> one applied to the source's tensor names (faces.py)
    wrap: Callable = _as_is

    def layer_progress(self, label: str) -> Callable[[int], None]:
        task = self.progress.add_task(f"{label}: layers", total=self.config.num_hidden_layers)
        return lambda i: self.progress.advance(task)


def calibrate_source(prepared, options, quiet: bool):
    """Runs the plan's calibrated init on a validated source (see api.prepare), reading one
    layer at a time; returns an object with `transform` and `summary`."""
    from ..console import step_progress
    from ..textdata import iter_documents
    from .reader import iter_tensors
    from .sampled import is_sampled, sampled_documents

    plan = prepared.plan
    tokenizer = _tokenizer(prepared.root, plan.init)
    if not is_sampled(options.calib_data):  # text: tokenized before the progress bars start
        ids = calibration_token_blocks(
            tokenizer,
            iter_documents(options.calib_data),
            options.calib_tokens,
            options.calib_seq_len,
        )

    def load(names: list[str]) -> dict[str, torch.Tensor]:
        return dict(iter_tensors(prepared.weights, set(names)))

    config, names, wrap = None, prepared.order, _as_is
    view = LlamaView(plan.source) if plan.source.family.name == "phi3" else None
    if view is not None:  # fused projections: the pass runs the Llama the source computes
        config, load, names = view.config(prepared.out_config), view.loader(load), view.names(names)
    elif prepared.out_config["model_type"] in FACE_FAMILIES:  # GPT-NeoX, GPT-2: layer faces
        face = FaceView(plan.source, prepared.out_config["model_type"])
        load, names, wrap = face.loader(load), face.names(names), face.wrap
    with step_progress(quiet) as progress:
        if is_sampled(options.calib_data):
            texts = sampled_documents(
                prepared.root,
                tokenizer,
                options.calib_tokens,
                options.calib_seq_len,
                device=calibration_device(),
                progress=progress,
            )
            ids = calibration_token_blocks(
                tokenizer, iter(texts), options.calib_tokens, options.calib_seq_len
            )
        run = CalibrationRun(
            config or source_config(prepared.out_config),
            load,
            ids,
            plan.skip_heads,
            options,
            names,
            progress,
            calibration_device(),
            wrap,
        )
        result = plan.init_method.fit(run)
    result = result if view is None else view.wrap(result)
    result.tokens_used = int(ids.numel())  # fewer than asked where the text is shorter
    return result


def calibration_device() -> str:
    """The calibration pass is forward-only and small: a GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def source_config(out_config: dict):
    """The source model as a SkipV1 config of its family with s = 0 (same function, our module
    classes)."""
    config_class = FAMILY_CLASSES[out_config["model_type"]][0]
    fields = {k: v for k, v in out_config.items() if k not in ("model_type", "auto_map")}
    fields.pop("architectures", None)
    config = config_class(**{**fields, "skip_v_heads": 0})
    # the passes build single decoder layers, outside the model that would choose a MoE's
    # experts implementation: transformers' plain loop
    config._experts_implementation = "eager"
    return config


def _tokenizer(root, init: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(root)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"--init {init} needs the source's tokenizer for its calibration text, which failed "
            f"to load from {root} ({str(err).splitlines()[0]}): add the tokenizer files, or "
            "pass --init keep (no calibration, much worse quality)"
        ) from None


METHOD = (
    "per-layer head choice + ridge least-squares refit of borrowed heads' o_proj "
    "(ridge chosen by two-fold cross-validation)"
)


def calibration_record(calibration, options) -> dict:
    """Settings and per-layer results for skipv1_conversion.json."""
    used = {"tokens": calibration.tokens_used}
    if calibration.tokens_used != options.calib_tokens:  # a shorter text, used whole
        used["tokens_asked"] = options.calib_tokens
    return {
        "data": str(options.calib_data),
        **used,
        "seq_len": options.calib_seq_len,
        "method": getattr(calibration, "method", METHOD),
        **({"distill": calibration.distill} if getattr(calibration, "distill", None) else {}),
        "device": calibration_device(),
        "layers": calibration.summary(),
    }
