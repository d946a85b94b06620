"""The Qwen3 family: SkipV1 on transformers' Qwen3 classes (q/k norms, explicit head_dim), from a
tiny random Qwen3ForCausalLM: s = 0 is the stock model, uncached == cached == generate (dynamic,
static and paged caches), measured cache bytes == the formula, and `skipv1 convert` output
loads with and without skipv1."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    ContinuousBatchingConfig,
    GenerationConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from typer.testing import CliRunner

from skipv1 import SkipV1Qwen3Config, SkipV1Qwen3ForCausalLM
from skipv1.checkpoint_info import describe
from skipv1.cli import app
from skipv1.convert.plan import make_plan
from skipv1.modeling.layout import KVLayout
from tests.factories import (
    assert_cache_paths_agree,
    assert_loads_without_skipv1,
    generated_cache_bytes,
    make_checkpoint,
    tiny_config,
)

VOCAB = 97
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # != hidden / heads: the explicit head_dim must be honoured
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=128,
)


def stock(seed=0, attn="sdpa") -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(**SHAPE)
    config._attn_implementation = attn
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial q/k norms, so that skipping them would show
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
    return model


def skipv1_model(s: int, attn="sdpa", layers=3) -> SkipV1Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = SkipV1Qwen3Config(**{**SHAPE, "num_hidden_layers": layers}, skip_v_heads=s)
    config._attn_implementation = attn
    model = SkipV1Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
    return model


def ids(batch=2, length=12, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_zero_skip_equals_stock_qwen3(attn):
    source = stock(attn=attn)
    skip = skipv1_model(0, attn=attn)
    skip.load_state_dict(source.state_dict())
    with torch.no_grad():
        assert torch.equal(skip(ids()).logits, source(ids()).logits)


def test_later_layers_hold_own_value_heads_and_keep_qk_norms():
    model = skipv1_model(1)
    rows = [layer.self_attn.v_proj.weight.shape[0] for layer in model.model.layers]
    assert rows == [2 * 16, 1 * 16, 1 * 16]
    assert model.model.layers[1].self_attn.q_norm.weight.shape == (16,)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_uncached_cached_and_greedy_generate_agree(attn):
    model = skipv1_model(1, attn=attn)
    x = ids(length=12)
    assert_cache_paths_agree(model, x, ids(batch=1, length=6), atol=1e-4)


def test_generate_cache_bytes_match_the_formula():
    model = skipv1_model(1, layers=3)
    measured, cache = generated_cache_bytes(model, ids(batch=1, length=20))
    assert cache.get_seq_length() == 20
    assert measured == 20 * KVLayout(3, 2, 16, 1).bytes_per_token(dtype_bytes=4)
    assert [layer.values.shape[1] for layer in cache.layers] == [2, 1, 1]


def test_static_cache_and_continuous_batching_give_the_dynamic_cache_tokens():
    model = skipv1_model(1)
    prompts = [list(range(3, 3 + n)) for n in (5, 2, 9)]
    dynamic = [
        model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]
    static = model.generate(
        torch.tensor([prompts[0]]),
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        cache_implementation="static",
        return_dict_in_generate=True,
    )
    assert static.sequences[0, 5:].tolist() == dynamic[0]
    assert [layer.values.shape[1] for layer in static.cache.layers] == [2, 1, 1]
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=16, page_size=4, max_batch_tokens=16)
    out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb)
    by_index = sorted(out.values(), key=lambda r: int(r.request_id.split("_")[-1]))
    assert [r.generated_tokens for r in by_index] == dynamic


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def qwen3_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(
        tmp_path / "src", arch="qwen3", tokenizer_dir=tokenizer_dir, num_key_value_heads=2
    )


def source_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_plan_expects_q_and_k_norms_per_layer(qwen3_src):
    plan = make_plan(source_config(qwen3_src), 1, "keep")
    for i in range(3):
        for norm in ("q_norm", "k_norm"):
            task = plan.tasks[f"model.layers.{i}.self_attn.{norm}.weight"]
            assert task.source_shape == task.target_shape == (16,) and task.action == "copy"
    assert plan.tasks["model.layers.1.self_attn.v_proj.weight"].target_shape == (16, 64)


@pytest.mark.slow
def test_every_init_converts_qwen3_and_the_fitted_ones_are_closest(tmp_path, tokenizer_dir, cli):
    """The calibrated inits run Qwen3's own layers (q/k norms included): a forward written
    without the norms would fit the wrong function and lose this ordering (the norms' weights
    are far from 1 so that they matter)."""
    torch.manual_seed(0)
    stock_model = Qwen3ForCausalLM(tiny_config("qwen3", num_key_value_heads=2)).eval()
    with torch.no_grad():
        for name, p in stock_model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.1, 4.0)
    qwen3_src = tmp_path / "src"
    stock_model.save_pretrained(qwen3_src)
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, qwen3_src / file.name)
    calib = ["--calib-data", "embedded:train", "--calib-tokens", "1024", "--calib-seq-len", "64"]
    tokens = ids(batch=4, length=48, seed=3)
    source = AutoModelForCausalLM.from_pretrained(qwen3_src).eval()
    errors = {}
    for init in ("mean", "calibrated", "reconstruct"):
        dst = tmp_path / init
        args = ["convert", str(qwen3_src), str(dst), "--init", init, "--skip-heads", "1", "--quiet"]
        # reconstruct without its last (end-to-end) stage: the layer-by-layer refits alone must
        # follow Qwen3's forward
        extra = calib + (["--calib-distill-steps", "0"] if init == "reconstruct" else [])
        result = cli(*args, *(extra if init != "mean" else []))
        assert result.exit_code == 0, result.output
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model).__name__ == "SkipV1Qwen3ForCausalLM"
        with torch.no_grad():
            errors[init] = (model(tokens).logits - source(tokens).logits).pow(2).mean().item()
    assert errors["reconstruct"] < errors["calibrated"] < errors["mean"], errors


def test_inspect_counts_the_real_parameters(qwen3_src, tmp_path):
    info = describe(qwen3_src, skip_v_heads=1)
    source = AutoModelForCausalLM.from_pretrained(qwen3_src)
    assert info["parameters"] == sum(p.numel() for p in source.parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(3, 2, 16, 1).bytes_per_token(2)
    skip = SkipV1Qwen3ForCausalLM(SkipV1Qwen3Config(**source.config.to_dict(), skip_v_heads=1))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())


def test_convert_keep_loads_with_auto_classes_and_remote_code(qwen3_src, tmp_path):
    dst = tmp_path / "dst"
    runner = CliRunner()
    dry = runner.invoke(app, ["convert", str(qwen3_src), str(dst), "--init", "keep", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert not dst.exists()
    result = runner.invoke(
        app, ["convert", str(qwen3_src), str(dst), "--init", "keep", "--skip-heads", "1", "--quiet"]
    )
    assert result.exit_code == 0, result.output

    config = source_config(dst)
    assert config["model_type"] == "skipv1_qwen3"
    assert config["architectures"] == ["SkipV1Qwen3ForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_skipv1_qwen3.SkipV1Qwen3Config",
        "AutoModelForCausalLM": "modeling_skipv1_qwen3.SkipV1Qwen3ForCausalLM",
    }
    for name in ("configuration_skipv1_qwen3.py", "modeling_skipv1_qwen3.py"):
        assert (dst / name).read_text() == (Path("skipv1/modeling") / name).read_text()
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["architecture"] == "Qwen3ForCausalLM" and record["skip_heads"] == 1

    # --init keep == the source's weights with later layers' v_proj cut to their first head
    source = AutoModelForCausalLM.from_pretrained(qwen3_src).eval()
    state = {
        k: v[:16] if ".v_proj." in k and not k.startswith("model.layers.0.") else v
        for k, v in source.state_dict().items()
    }
    expected = SkipV1Qwen3ForCausalLM(SkipV1Qwen3Config(**source.config.to_dict(), skip_v_heads=1))
    expected.load_state_dict(state)
    x = ids()
    with torch.no_grad():
        want = expected.eval()(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1Qwen3ForCausalLM
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
    assert_loads_without_skipv1(dst, x, want, "SkipV1Qwen3ForCausalLM", tmp_path)
