"""The OLMo-2, Mixtral and Qwen3-MoE families: SkipV1 on transformers' classes (OLMo-2's norms
over the whole q/k projections and after attention and MLP; the experts of Mixtral and
Qwen3-MoE), from tiny random models made by transformers: s = 0 is the stock model,
uncached == DynamicCache == token by token, measured cache bytes == the formula, `skipv1
convert` output loads with and without skipv1, and the default init converts each family
closer to the source than `mean`."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DynamicCache
from typer.testing import CliRunner

from skipv1.checkpoint_info import describe
from skipv1.cli import app
from skipv1.convert.config import skipv1_config
from skipv1.convert.experts import module_state
from skipv1.convert.plan import make_plan
from skipv1.families import family_of
from skipv1.modeling import FAMILY_CLASSES
from skipv1.modeling.layout import KVLayout
from tests.factories import ARCHS, assert_all_load_without_skipv1, tiny_config

FAMILIES = ("olmo2", "mixtral", "qwen3_moe")
# a Mixtral whose window of 4 is active (every layer slides): converted with it kept, for the
# default init's and the remote-code load's tests (the rest: test_family_windows.py)
WINDOWED = "mixtral-window"
SKIPV1_CLASS = {
    "olmo2": "SkipV1Olmo2ForCausalLM",
    "mixtral": "SkipV1MixtralForCausalLM",
    "qwen3_moe": "SkipV1Qwen3MoeForCausalLM",
    WINDOWED: "SkipV1MixtralForCausalLM",
}
LAYERS, KV, HEAD_DIM = 3, 2, 16


def stock(arch: str, seed: int = 0):
    """A tiny random source model whose norms are far from 1, so that a forward skipping one
    (or applying it per head instead of over the projection) would show; OLMo-2's q/k norms
    very far (0.1 to 4), so that a calibrated init that did not move them with the heads loses
    to `mean` (checked by mutation)."""
    torch.manual_seed(seed)
    # Qwen3-MoE: layer 1 keeps a dense MLP (mlp_only_layers), as some of its configs do
    extra = {"mlp_only_layers": [1]} if arch == "qwen3_moe" else {}
    if arch == WINDOWED:
        arch, extra = "mixtral", {"sliding_window": 4}
    model = ARCHS[arch][1](tiny_config(arch, num_key_value_heads=KV, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            if arch == "olmo2" and name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.1, 4.0)
    return model


def skipv1_of(model, s: int):
    """The SkipV1 model of the source's family with the source's weights where they fit."""
    config = model.config.to_dict()
    config_class, causal_lm = FAMILY_CLASSES[family_of(config).model_type]
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    skip = causal_lm(config_class(**fields, skip_v_heads=s)).eval()
    state = {
        k: v[: (KV - s) * HEAD_DIM] if ".v_proj." in k and ".layers.0." not in k else v
        for k, v in model.state_dict().items()
    }
    skip.load_state_dict(state)
    return skip


def ids(batch=2, length=12, seed=1):
    return torch.randint(0, 320, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=FAMILIES)
def source(request):
    return request.param, stock(request.param)


def test_zero_skip_equals_stock(source):
    arch, model = source
    skip = skipv1_of(model, 0)
    assert type(skip).__name__ == SKIPV1_CLASS[arch]
    with torch.no_grad():
        assert torch.equal(skip(ids()).logits, model(ids()).logits)


def test_uncached_cached_token_by_token_and_cache_bytes(source):
    arch, model = source
    skip = skipv1_of(model, 1)
    x = ids(length=12)
    with torch.no_grad():
        full = skip(x).logits
        cache = DynamicCache(config=skip.config)
        prefill = skip(x[:, :5], cache=cache, use_cache=True).logits
        steps = [skip(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-4, rtol=0)
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert [layer.values.shape[1] for layer in cache.layers] == [KV, KV - 1, KV - 1]
    assert measured == 2 * 12 * KVLayout(LAYERS, KV, HEAD_DIM, 1).bytes_per_token(dtype_bytes=4)


@pytest.mark.parametrize("arch", FAMILIES)
def test_inspect_counts_the_real_parameters(arch, tmp_path):
    model = stock(arch)
    model.save_pretrained(tmp_path)
    info = describe(tmp_path, skip_v_heads=1)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["parameters_skipv1"] == sum(p.numel() for p in skipv1_of(model, 1).parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(
        LAYERS, KV, HEAD_DIM, 1
    ).bytes_per_token(2)


# --- convert ----------------------------------------------------------------------------------


def test_plan_copies_experts_and_norms_and_moves_whole_projection_norms():
    configs = {arch: stock(arch).config.to_dict() for arch in FAMILIES}
    for arch in FAMILIES:
        configs[arch]["architectures"] = [type(stock(arch)).__name__]
    olmo2 = make_plan(configs["olmo2"], 1, "reconstruct").tasks
    p = "model.layers.1."
    # OLMo-2: the norms see the whole projections and follow the head permutation
    assert olmo2[p + "self_attn.q_norm.weight"].source_shape == (4 * HEAD_DIM,)
    assert olmo2[p + "self_attn.k_norm.weight"].source_shape == (KV * HEAD_DIM,)
    assert olmo2[p + "self_attn.q_norm.weight"].action == "calibrate"
    assert olmo2["model.layers.0.self_attn.q_norm.weight"].action == "copy"
    assert {p + "post_attention_layernorm.weight", p + "post_feedforward_layernorm.weight"} < set(
        olmo2
    ) and p + "input_layernorm.weight" not in olmo2
    mixtral = make_plan(configs["mixtral"], 1, "reconstruct").tasks
    assert mixtral[p + "block_sparse_moe.gate.weight"].target_shape == (4, 64)
    for e in range(4):
        for w, shape in (("w1", (128, 64)), ("w2", (64, 128)), ("w3", (128, 64))):
            task = mixtral[f"{p}block_sparse_moe.experts.{e}.{w}.weight"]
            assert task.action == "copy" and task.target_shape == shape
    qwen3_moe = make_plan(configs["qwen3_moe"], 1, "reconstruct").tasks
    assert qwen3_moe["model.layers.0.mlp.experts.3.down_proj.weight"].target_shape == (64, 32)
    assert qwen3_moe[p + "mlp.down_proj.weight"].action == "calibrate"  # the dense layer
    assert qwen3_moe[p + "self_attn.q_norm.weight"].source_shape == (HEAD_DIM,)
    assert qwen3_moe[p + "self_attn.v_proj.weight"].target_shape == (HEAD_DIM, 64)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_active_sliding_windows_are_kept(arch):
    """Mixtral's and Qwen3-MoE's windows are kept as the Llama family keeps Mistral's
    (test_family_windows.py), not clamped or refused."""
    window = {"use_sliding_window": True} if arch == "qwen3_moe" else {}
    source = tiny_config(arch, num_key_value_heads=KV, sliding_window=32, **window).to_dict()
    source["architectures"] = [ARCHS[arch][1].__name__]
    out, changes = skipv1_config(source, make_plan(source, 1, "keep"), None)
    assert out["sliding_window"] == 32 and out["max_position_embeddings"] == 256
    assert not {"sliding_window", "max_position_embeddings"} & {c.field for c in changes}


@pytest.fixture(scope="module")
def conversions(tmp_path_factory, tokenizer_dir):
    """Each family's tiny source converted with the default init (reconstruct, a short
    distillation) and with `mean`, s = 1, OLMo-2 also with `calibrated` and with reconstruct
    without its distillation: {arch: (source model, source dir, {init: dst})}."""
    calib = ["--calib-data", "embedded:train", "--calib-tokens", "1024", "--calib-seq-len", "64"]
    runner, out = CliRunner(), {}
    for arch in (*FAMILIES, WINDOWED):
        root = tmp_path_factory.mktemp(arch)
        source, src = stock(arch), root / "src"
        source.save_pretrained(src)
        for file in tokenizer_dir.iterdir():
            shutil.copy(file, src / file.name)
        dsts, inits = (
            {},
            {
                "default": [*calib, "--calib-distill-steps", "4"],
                "mean": ["--init", "mean"],
            },
        )
        if arch == "olmo2":
            inits["calibrated"] = ["--init", "calibrated", *calib]
            inits["layers"] = ["--init", "reconstruct", *calib, "--calib-distill-steps", "0"]
        for init, args in inits.items():
            dsts[init] = root / init
            command = ["convert", str(src), str(dsts[init]), "--skip-heads", "1", "--quiet"]
            result = runner.invoke(app, [*command, *args])
            assert result.exit_code == 0, result.output
        out[arch] = source, src, dsts
    return out


@pytest.mark.parametrize("arch", [*FAMILIES, WINDOWED])
def test_default_init_converts_the_family_closer_than_mean(arch, conversions, cli, tmp_path):
    """The default init (reconstruct) runs the family's own layers (OLMo-2's post-norms and
    whole-projection q/k norms, the MoE's experts) and ends closer to the source than `mean`;
    dry run, config, modeling files, provenance and model card as for every family."""
    source, src, dsts = conversions[arch]
    dry = cli("convert", src, tmp_path / "dry", "--dry-run")
    assert dry.exit_code == 0 and not (tmp_path / "dry").exists(), dry.output
    errors = logit_errors(source, dsts)
    assert errors["default"] < errors["mean"], errors

    dst = dsts["default"]
    config = json.loads((dst / "config.json").read_text())
    family = family_of(config)
    assert config["model_type"] == f"skipv1_{family.name}" and config["auto_map"] == family.auto_map
    if arch == WINDOWED:  # kept, not clamped
        assert (config["sliding_window"], config["max_position_embeddings"]) == (4, 256)
    for name in family.modeling_files:
        assert (dst / name).read_text() == (Path("skipv1/modeling") / name).read_text()
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["architecture"] == type(source).__name__ and record["init"] == "reconstruct"
    assert "SkipV1Former conversion" in (dst / "README.md").read_text()


def logit_errors(source, dsts: dict) -> dict[str, float]:
    x = ids(batch=4, length=48, seed=3)
    errors = {}
    with torch.no_grad():
        want = source(x).logits
        for init, dst in dsts.items():
            model = AutoModelForCausalLM.from_pretrained(dst).eval()
            assert type(model).__name__ == SKIPV1_CLASS[family_of(source.config.to_dict()).name]
            errors[init] = (model(x).logits - want).pow(2).mean().item()
    return errors


def test_olmo2_fitted_inits_follow_its_norms(conversions):
    """reconstruct's layer-by-layer refits (no distillation) < calibrated < mean: their forwards
    apply OLMo-2's post-norms and whole-projection q/k norms, and move the norms' weights with
    the permuted heads (not moving them: calibrated 0.047 > mean 0.045, layers 0.043 > 0.041)."""
    source, _, dsts = conversions["olmo2"]
    errors = logit_errors(source, dsts)
    assert errors["layers"] < errors["calibrated"] < errors["mean"], errors


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_expert_tensors_stack_as_transformers_loads_them(arch, tmp_path):
    """The calibrated inits build MoE layers from the checkpoint's per-expert tensors: stacked
    exactly as transformers' own loading stacks them."""
    model = stock(arch)
    model.save_pretrained(tmp_path)
    config = model.config.to_dict()
    config_class, _ = FAMILY_CLASSES[family_of(config).model_type]
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    stacked = module_state(config_class(**fields), load_file(tmp_path / "model.safetensors"))
    want = model.state_dict()
    assert set(stacked) == set(want)
    assert all(torch.equal(stacked[k], want[k]) for k in stacked)


def test_converted_families_load_with_remote_code_without_skipv1(conversions, tmp_path):
    cases, x = [], ids(batch=1, length=16)
    for arch, (_, _, dsts) in conversions.items():
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(dsts["default"]).eval()(x).logits
        cases.append((dsts["default"], x, want, SKIPV1_CLASS[arch]))
    assert_all_load_without_skipv1(cases, tmp_path)
