"""The calibrated inits (`reconstruct`, the default, and `calibrated`) on GPT-NeoX (parallel
residual and partial rotary: the tiny config's defaults), GPT-2 (Conv1D projections, learned
positions) and Phi-3 with partial rotary (Phi-4-mini's partial_rotary_factor; here 0.5, with a
sliding window), from tiny random checkpoints: the passes' forward through the layer faces (Phi-3:
the Llama view) is the stock model's; each init converts and is closer to the source than `mean` on held-out text; the
converted models' cache paths agree; `calibrated` moves whole heads inside the fused tensors in
the recorded order; `reconstruct` refits the attention's and the MLP's output projections."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skipv1.convert import calibrate
from skipv1.convert.config import skipv1_config
from skipv1.convert.fused import LlamaView
from skipv1.convert.plan import SourceModel, make_plan
from skipv1.families import standard_fields
from skipv1.textdata import embedded_documents
from tests.factories import (
    assert_cache_paths_agree,
    assert_passes_follow_the_stock_layers,
    make_checkpoint,
    token_ids,
)

CALIB = ["--calib-data", "embedded:train", "--calib-tokens", "2048", "--calib-seq-len", "64"]
HEADS, D, HIDDEN = 4, 16, 64  # tiny_config: 4 heads of 16
INITS = ("mean", "calibrated", "reconstruct")
# Phi-3 with half of each head rotated (Phi-4-mini: 0.75) and every layer sliding (Phi-3-mini-4k)
PHI3 = {
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    "sliding_window": 8,
}
# Phi-4-mini's RoPE: longrope over 3/4 of each head (12 of 16 dims: 6 factors per list)
PHI4_MINI = {
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5],
        "long_factor": [2.0] * 6,
    },
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "arch, fields",
    [
        ("gpt_neox", {}),
        ("gpt_neox", {"use_parallel_residual": False}),
        ("gpt2", {}),
        ("phi3", {**PHI3, "sliding_window": 4, "num_key_value_heads": 2}),
        ("phi3", PHI4_MINI),
    ],
    ids=["gpt_neox-parallel", "gpt_neox-sequential", "gpt2", "phi3-partial-windowed", "phi4-mini"],
)
def test_the_passes_compute_the_stock_layers(arch, fields, tmp_path):
    """calibrate's and reconstruct's layer-by-layer forwards (the faces: q/k/v/o cut from the
    fused tensors, partial rotary, the parallel residual, GPT-2's positions; Phi-3's Llama view:
    partial rotary, the window) give every layer's output of the stock model."""
    src = make_checkpoint(tmp_path / "src", arch=arch, **fields)
    source = standard_fields(json.loads((src / "config.json").read_text()))
    out, _ = skipv1_config(source, make_plan(source, 1, "keep"), dtype=None)
    config = calibrate.source_config(out)
    state = load_file(src / "model.safetensors")

    def load(names):
        return {name: state[name] for name in names}

    if arch == "phi3":  # the passes run the Llama a Phi-3 computes (as calibrate_source sets up)
        view = LlamaView(SourceModel.from_config(source))
        config, load = view.config(out), view.loader(load)

    x = token_ids(length=16, seed=5, vocab=320)
    assert_passes_follow_the_stock_layers(src, config, load, x)


@pytest.fixture(scope="module", params=["gpt_neox", "gpt2", "phi3"])
def family(request, tmp_path_factory, tokenizer_dir, cli):
    """(arch, source dir, {init: converted dir}) with s = 2 of 4 heads; reconstruct is the
    default init (no --init given)."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    fields = PHI3 if arch == "phi3" else {}
    src = make_checkpoint(root / "src", arch=arch, tokenizer_dir=tokenizer_dir, **fields)
    out = {}
    for init in INITS:
        args = [] if init == "reconstruct" else ["--init", init]
        result = cli("convert", src, root / init, "--quiet", "--skip-heads", 2, *args, *CALIB)
        assert result.exit_code == 0, result.output
        out[init] = root / init
    return arch, src, out


@pytest.fixture(scope="module")
def held_out(tokenizer_dir) -> torch.Tensor:
    """(4, 48) tokens of the validation documents (calibration reads the training ones)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer(" ".join(embedded_documents("validation")[:4])).input_ids
    return torch.tensor(ids[: 4 * 48]).view(4, 48)


def test_calibrated_inits_are_closer_to_the_source_than_mean(family, held_out):
    arch, src, converted = family
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src).eval()(held_out).logits
        errors = {}
        for init, dst in converted.items():
            model = AutoModelForCausalLM.from_pretrained(dst).eval()
            errors[init] = (model(held_out).logits - want).pow(2).mean().item()
    assert errors["calibrated"] < errors["mean"], errors
    assert errors["reconstruct"] < errors["calibrated"], errors


@pytest.mark.parametrize("init", ["calibrated", "reconstruct"])
def test_the_converted_models_cache_paths_agree(family, init):
    _, _, converted = family
    model = AutoModelForCausalLM.from_pretrained(converted[init]).eval()
    assert_cache_paths_agree(model, token_ids(length=12, vocab=320), token_ids(length=4, vocab=320))


def _per_head(arch: str, state: dict, i: int, own: int) -> dict[str, torch.Tensor]:
    """Layer i's q/k/v heads (head, d, hidden), the output projection's inputs per head
    (head, d, hidden) and the MLP's output projection (hidden, inter), computed by hand from
    the fused layout; `own` value heads (4 in the source)."""
    if arch == "gpt_neox":
        p = f"gpt_neox.layers.{i}."
        qkv = state[p + "attention.query_key_value.weight"]
        full, part = qkv[: own * 3 * D].reshape(own, 3, D, HIDDEN), qkv[own * 3 * D :]
        part = part.reshape(HEADS - own, 2, D, HIDDEN)
        q, k = torch.cat([full[:, 0], part[:, 0]]), torch.cat([full[:, 1], part[:, 1]])
        o = state[p + "attention.dense.weight"].T.reshape(HEADS, D, HIDDEN)
        down = state[p + "mlp.dense_4h_to_h.weight"]
        return {"q": q, "k": k, "v": full[:, 2], "o": o, "down": down}
    if arch == "phi3":
        p = f"model.layers.{i}."
        q, k, v = state[p + "self_attn.qkv_proj.weight"].split([HEADS * D, HEADS * D, own * D])
        o = state[p + "self_attn.o_proj.weight"].T.reshape(HEADS, D, HIDDEN)
        heads = {n: t.reshape(-1, D, HIDDEN) for n, t in (("q", q), ("k", k), ("v", v))}
        return {**heads, "o": o, "down": state[p + "mlp.down_proj.weight"]}
    p = f"transformer.h.{i}."
    cols = state[p + "attn.c_attn.weight"].T  # Conv1D [in, out]: columns [q | k | v]
    q, k, v = cols.split([HEADS * D, HEADS * D, own * D])
    o = state[p + "attn.c_proj.weight"].reshape(HEADS, D, HIDDEN)  # [in, out]: rows per head
    down = state[p + "mlp.c_proj.weight"].T
    heads = {n: t.reshape(-1, D, HIDDEN) for n, t in (("q", q), ("k", k), ("v", v))}
    return {**heads, "o": o, "down": down}


def test_calibrated_moves_whole_heads_inside_the_fused_tensors(family):
    """Each later layer's heads sit in the recorded order: q/k of every head and v of the own
    ones are the source's rows of that head; the own heads' output columns are the source's,
    the borrowed ones' are refitted; the MLP is untouched."""
    arch, src, converted = family
    source, out = (
        load_file(src / "model.safetensors"),
        load_file(converted["calibrated"] / "model.safetensors"),
    )
    record = json.loads((converted["calibrated"] / "skipv1_conversion.json").read_text())
    for i in (1, 2):
        order = record["calibration"]["layers"][str(i)]["order"]
        assert sorted(order) == list(range(HEADS))
        before, after = _per_head(arch, source, i, HEADS), _per_head(arch, out, i, 2)
        for name in ("q", "k"):
            assert torch.equal(after[name], before[name][order]), (i, name)
        assert torch.equal(after["v"], before["v"][order[:2]])
        assert torch.equal(after["o"][:2], before["o"][order[:2]])
        assert not torch.allclose(after["o"][2:], before["o"][order[2:]])
        assert torch.equal(after["down"], before["down"])
    assert torch.equal(_per_head(arch, out, 0, HEADS)["v"], _per_head(arch, source, 0, HEADS)["v"])


def test_reconstruct_refits_both_output_projections(family):
    """Later layers' attention and MLP output projections are refitted; layer 0, the MLP's first
    projection and the output projections' biases stay the source's."""
    arch, src, converted = family
    source = load_file(src / "model.safetensors")
    out = load_file(converted["reconstruct"] / "model.safetensors")
    for i in (1, 2):
        before, after = _per_head(arch, source, i, HEADS), _per_head(arch, out, i, 2)
        assert not torch.allclose(after["down"], before["down"])
        assert after["o"].shape == before["o"].shape
    fc, biases = {
        "gpt_neox": (
            "mlp.dense_h_to_4h.weight",
            ("attention.dense.bias", "mlp.dense_4h_to_h.bias"),
        ),
        "gpt2": ("mlp.c_fc.weight", ("attn.c_proj.bias", "mlp.c_proj.bias")),
        "phi3": ("mlp.gate_up_proj.weight", ()),  # no biases
    }[arch]
    prefix = {"gpt_neox": "gpt_neox.layers.", "gpt2": "transformer.h.", "phi3": "model.layers."}
    prefix = prefix[arch]
    kept = [f"{prefix}1.{n}" for n in (fc, *biases)] + [
        n for n in source if n.startswith(f"{prefix}0.")
    ]
    for name in kept:
        assert torch.equal(out[name], source[name]), name


def test_no_borrowed_heads_reproduce_the_source(family, tmp_path, cli):
    arch, src, _ = family
    result = cli("convert", src, tmp_path / "s0", "--quiet", "--skip-heads", 0, *CALIB)
    assert result.exit_code == 0, result.output
    x = token_ids(length=12, vocab=320)
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src).eval()(x).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "s0").eval()(x).logits
    assert torch.equal(got, want)


def test_a_gpt2_with_the_hubs_bare_names_converts_alike(tmp_path, tokenizer_dir, cli):
    """The Hub's original GPT-2 names (no `transformer.`): the default init (reconstruct, its
    distillation included) reads and writes them, giving the prefixed checkpoint's tensors."""
    src = make_checkpoint(tmp_path / "src", arch="gpt2", tokenizer_dir=tokenizer_dir)
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in src.iterdir():
        (bare / file.name).write_bytes(file.read_bytes())
    state = load_file(src / "model.safetensors")
    (bare / "model.safetensors").unlink()
    bare_state = {k.removeprefix("transformer."): v for k, v in state.items()}
    save_file(bare_state, bare / "model.safetensors", metadata={"format": "pt"})
    for path in (src, bare):
        args = ("--skip-heads", 2, *CALIB)
        result = cli("convert", path, tmp_path / f"{path.name}-out", "--quiet", *args)
        assert result.exit_code == 0, result.output
    want = load_file(tmp_path / "src-out" / "model.safetensors")
    got = load_file(tmp_path / "bare-out" / "model.safetensors")
    assert set(got) == {k.removeprefix("transformer.") for k in want}
    for name, tensor in want.items():
        assert torch.equal(got[name.removeprefix("transformer.")], tensor), name
