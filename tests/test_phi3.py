"""The Phi-3 family: SkipV1 on transformers' Phi-3 classes (fused `qkv_proj` [q | k | v] and
`gate_up_proj`), from a tiny random Phi3ForCausalLM with grouped KV heads: s = 0 is the stock
model, uncached == cached == generate, measured cache bytes == the formula, the fused layout of
a later layer against a hand-computed split, every init (the calibrated ones through the Llama
the source computes), and `skipv1 convert` (its output loads without skipv1:
test_fused_remote_code.py)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Phi3Config, Phi3ForCausalLM

from skipv1 import SkipV1LlamaForCausalLM, SkipV1Phi3Config, SkipV1Phi3ForCausalLM
from skipv1.checkpoint_info import describe
from skipv1.convert.fused import LlamaView
from skipv1.convert.plan import SourceModel, make_plan
from skipv1.modeling.layout import KVLayout
from tests.factories import (
    assert_cache_paths_agree,
    generated_cache_bytes,
    make_checkpoint,
    token_ids,
)

VOCAB = 97
# 4 query heads over 2 KV heads: s counts KV heads, so s = 1 takes one of two value heads
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    pad_token_id=0,
    eos_token_id=0,
    bos_token_id=0,
)
D = 8  # head_dim = 32 / 4


def skipv1_model(s: int, attn="sdpa") -> SkipV1Phi3ForCausalLM:
    torch.manual_seed(0)
    config = SkipV1Phi3Config(**SHAPE, skip_v_heads=s)
    config._attn_implementation = attn
    return SkipV1Phi3ForCausalLM(config).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_zero_skip_equals_stock_phi3(attn):
    torch.manual_seed(0)
    config = Phi3Config(**SHAPE)
    config._attn_implementation = attn
    source = Phi3ForCausalLM(config).eval()
    skip = skipv1_model(0, attn=attn)
    skip.load_state_dict(source.state_dict())
    x = token_ids()
    with torch.no_grad():
        assert torch.equal(skip(x).logits, source(x).logits)


def test_gqa_head_counting_sizes_the_fused_projection_in_kv_heads():
    model = skipv1_model(1)
    rows = [layer.self_attn.qkv_proj.weight.shape[0] for layer in model.model.layers]
    # q: 4 heads, k: 2 KV heads, v: 2 in layer 0, 2 - s = 1 afterwards
    assert rows == [(4 + 2 + 2) * D, (4 + 2 + 1) * D, (4 + 2 + 1) * D]
    with pytest.raises(Exception, match="skip_v_heads=2 is out of range"):
        SkipV1Phi3Config(**SHAPE, skip_v_heads=2)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_uncached_cached_and_greedy_generate_agree(attn):
    model = skipv1_model(1, attn=attn)
    x = token_ids(length=12)
    assert_cache_paths_agree(model, x, token_ids(batch=1, length=6), atol=1e-5)


def test_generate_cache_bytes_match_the_formula():
    model = skipv1_model(1)
    measured, cache = generated_cache_bytes(model, token_ids(batch=1, length=20))
    assert cache.get_seq_length() == 20
    assert measured == 20 * KVLayout(3, 2, D, 1).bytes_per_token(dtype_bytes=4)
    assert [layer.values.shape[1] for layer in cache.layers] == [2, 1, 1]


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def phi3_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(
        tmp_path / "src", arch="phi3", tokenizer_dir=tokenizer_dir, num_key_value_heads=2
    )


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_llama_view_of_phi3_computes_the_same_function(phi3_src):
    """The calibrated inits run the Llama a Phi-3 computes, from its fused tensors cut by hand:
    the q/k/v rows, the gate/up halves; s = 0 must give the Phi-3's logits."""
    source = AutoModelForCausalLM.from_pretrained(phi3_src).eval()
    state = source.state_dict()
    view = LlamaView(SourceModel.from_config(read_config(phi3_src)))
    names = view.names(list(state))
    tensors = view.loader(lambda wanted: {n: state[n] for n in wanted})(names)
    qkv = state["model.layers.1.self_attn.qkv_proj.weight"]  # 4 q, 2 kv heads of 16 rows
    assert torch.equal(tensors["model.layers.1.self_attn.q_proj.weight"], qkv[:64])
    assert torch.equal(tensors["model.layers.1.self_attn.k_proj.weight"], qkv[64:96])
    assert torch.equal(tensors["model.layers.1.self_attn.v_proj.weight"], qkv[96:])
    gate_up = state["model.layers.1.mlp.gate_up_proj.weight"]
    assert torch.equal(tensors["model.layers.1.mlp.up_proj.weight"], gate_up[128:])
    llama = SkipV1LlamaForCausalLM(view.config(read_config(phi3_src))).eval()
    llama.load_state_dict(tensors)
    x = token_ids(vocab=320)
    with torch.no_grad():
        torch.testing.assert_close(llama(x).logits, source(x).logits, rtol=0, atol=1e-5)


def test_convert_keep_cuts_the_value_rows_from_qkv_proj(phi3_src, tmp_path, cli):
    dst = tmp_path / "dst"
    dry = cli("convert", phi3_src, dst, "--init", "keep", "--skip-heads", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "2 rewritten" in dry.output and not dst.exists()
    result = cli("convert", phi3_src, dst, "--init", "keep", "--skip-heads", "1", "--quiet")
    assert result.exit_code == 0, result.output

    config = read_config(dst)
    assert config["model_type"] == "skipv1_phi3"
    assert config["architectures"] == ["SkipV1Phi3ForCausalLM"]
    assert (
        config["auto_map"]["AutoModelForCausalLM"] == "modeling_skipv1_phi3.SkipV1Phi3ForCausalLM"
    )
    assert config["fused_qkv_split"]["layers_1_on"] == {"q_heads": 4, "k_heads": 2, "v_heads": 1}
    for name in ("configuration_skipv1_phi3.py", "modeling_skipv1_phi3.py"):
        assert (dst / name).read_text() == (Path("skipv1/modeling") / name).read_text()
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["architecture"] == "Phi3ForCausalLM" and record["skip_heads"] == 1
    assert {t["name"] for t in record["tensors_changed"]} == {
        f"model.layers.{i}.self_attn.qkv_proj.weight" for i in (1, 2)
    }
    assert "fused `self_attn.qkv_proj`" in (dst / "README.md").read_text()

    # by hand: a later layer's qkv_proj is [q (64 rows) | k (32) | v head 0 (16 of 32)]
    source = AutoModelForCausalLM.from_pretrained(phi3_src).eval()
    state = source.state_dict()
    for i in (1, 2):
        qkv = state[f"model.layers.{i}.self_attn.qkv_proj.weight"]
        state[f"model.layers.{i}.self_attn.qkv_proj.weight"] = torch.cat([qkv[:96], qkv[96:112]])
    expected = SkipV1Phi3ForCausalLM(SkipV1Phi3Config(**source.config.to_dict(), skip_v_heads=1))
    expected.load_state_dict(state)
    x = token_ids(vocab=320)
    with torch.no_grad():
        want = expected.eval()(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1Phi3ForCausalLM
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)


@pytest.mark.slow
def test_every_init_converts_phi3_and_the_fitted_ones_are_closest(phi3_src, tmp_path, cli):
    """mean, calibrated and the default (reconstruct, here without its distillation stage, and
    with it for a few steps): the fitted inits follow the source more closely."""
    calib = ["--calib-data", "embedded:train", "--calib-tokens", "1024", "--calib-seq-len", "64"]
    tokens = token_ids(batch=4, length=48, seed=3, vocab=320)
    source = AutoModelForCausalLM.from_pretrained(phi3_src).eval()
    runs = {
        "mean": ["--init", "mean"],
        "calibrated": ["--init", "calibrated", *calib],
        "reconstruct": [*calib, "--calib-distill-steps", "0"],  # the default init
        "distilled": [*calib, "--calib-distill-steps", "4"],
    }
    errors = {}
    for label, args in runs.items():
        dst = tmp_path / label
        result = cli("convert", phi3_src, dst, "--skip-heads", "1", "--quiet", *args)
        assert result.exit_code == 0, result.output
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1Phi3ForCausalLM
        with torch.no_grad():
            errors[label] = (model(tokens).logits - source(tokens).logits).pow(2).mean().item()
    record = json.loads((tmp_path / "distilled" / "skipv1_conversion.json").read_text())
    assert record["init"] == "reconstruct" and record["calibration"]["distill"]["steps"] == 4
    assert errors["distilled"] <= errors["reconstruct"] < errors["calibrated"] < errors["mean"]


def test_calibrated_inits_refuse_a_partial_rotary_phi3(tmp_path, cli):
    src = make_checkpoint(
        tmp_path / "src",
        arch="phi3",
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )
    result = cli("convert", src, tmp_path / "dst", "--quiet")
    assert result.exit_code == 2, result.output
    assert "partial_rotary_factor=0.5" in result.output and "--init keep" in result.output
    assert make_plan(read_config(src), 1, "mean").skip_heads == 1


def test_inspect_counts_the_real_parameters(phi3_src):
    info = describe(phi3_src, skip_v_heads=1)
    source = AutoModelForCausalLM.from_pretrained(phi3_src)
    assert info["parameters"] == sum(p.numel() for p in source.parameters())
    skip = SkipV1Phi3ForCausalLM(SkipV1Phi3Config(**source.config.to_dict(), skip_v_heads=1))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(3, 2, 16, 1).bytes_per_token(2)
