"""The GPT-NeoX family: SkipV1 on transformers' GPT-NeoX classes (fused `query_key_value`
interleaved per head, partial rotary, parallel residual, multi-head attention), from a tiny
random GPTNeoXForCausalLM: s = 0 is the stock model, uncached == cached == generate, measured
cache bytes == the formula, the interleaved layout of a later layer against a hand-computed
split, and `skipv1 convert` (its output loads without skipv1: test_fused_remote_code.py)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM

from skipv1 import SkipV1GPTNeoXConfig, SkipV1GPTNeoXForCausalLM
from skipv1.checkpoint_info import describe
from skipv1.modeling.layout import KVLayout
from tests.factories import (
    assert_cache_paths_agree,
    generated_cache_bytes,
    make_checkpoint,
    token_ids,
)

SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=97,
    max_position_embeddings=128,
)
D = 8  # head_dim = 32 / 4; rotary on the first 2 dims of each head (GPT-NeoX's default 0.25)


def skipv1_model(s: int, attn="sdpa", **extra) -> SkipV1GPTNeoXForCausalLM:
    torch.manual_seed(0)
    config = SkipV1GPTNeoXConfig(**SHAPE, **extra, skip_v_heads=s)
    config._attn_implementation = attn
    model = SkipV1GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():  # non-zero biases, so that their rows' layout matters
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize(("attn", "parallel"), [("eager", True), ("sdpa", True), ("sdpa", False)])
def test_zero_skip_equals_stock_gpt_neox(attn, parallel):
    config = GPTNeoXConfig(**SHAPE, use_parallel_residual=parallel)
    config._attn_implementation = attn
    source = GPTNeoXForCausalLM(config).eval()
    skip = skipv1_model(0, attn=attn, use_parallel_residual=parallel)
    source.load_state_dict(skip.state_dict())
    x = token_ids()
    with torch.no_grad():
        assert torch.equal(skip(x).logits, source(x).logits)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_uncached_cached_and_greedy_generate_agree(attn):
    model = skipv1_model(2, attn=attn)
    x = token_ids(length=12)
    assert_cache_paths_agree(model, x, token_ids(batch=1, length=6), atol=1e-5)


def test_generate_cache_bytes_match_the_formula():
    model = skipv1_model(3)
    measured, cache = generated_cache_bytes(model, token_ids(batch=1, length=20))
    assert cache.get_seq_length() == 20
    assert measured == 20 * KVLayout(3, 4, D, 3).bytes_per_token(dtype_bytes=4)
    assert [layer.values.shape[1] for layer in cache.layers] == [4, 1, 1]


def test_config_refuses_grouped_kv_heads():
    with pytest.raises(Exception, match="multi-head attention only"):
        SkipV1GPTNeoXConfig(**SHAPE, num_key_value_heads=2)


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def neox_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(tmp_path / "src", arch="gpt_neox", tokenizer_dir=tokenizer_dir)


def by_hand(qkv: torch.Tensor) -> torch.Tensor:
    """A later layer's query_key_value for 4 heads of 16 rows with heads 2, 3 borrowed (keep):
    head h's rows are [q_h k_h v_h] = 48h .. 48h + 47; the borrowed heads lose their v rows."""
    rows = [*range(0, 48), *range(48, 96), *range(96, 128), *range(144, 176)]
    return qkv[rows]


def test_convert_keep_removes_the_borrowed_heads_value_rows(neox_src, tmp_path, cli):
    dst = tmp_path / "dst"
    dry = cli("convert", neox_src, dst, "--init", "keep", "--skip-heads", "2", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "4 rewritten" in dry.output and not dst.exists()
    result = cli("convert", neox_src, dst, "--init", "keep", "--skip-heads", "2", "--quiet")
    assert result.exit_code == 0, result.output

    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "skipv1_gpt_neox"
    assert config["architectures"] == ["SkipV1GPTNeoXForCausalLM"]
    assert config["auto_map"]["AutoConfig"] == "configuration_skipv1_gpt_neox.SkipV1GPTNeoXConfig"
    assert config["fused_qkv_split"]["layers_1_on"]["v_heads"] == 2
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["architecture"] == "GPTNeoXForCausalLM" and record["skip_heads"] == 2
    assert {t["name"] for t in record["tensors_changed"]} == {
        f"gpt_neox.layers.{i}.attention.query_key_value.{kind}"
        for i in (1, 2)
        for kind in ("weight", "bias")
    }

    source = AutoModelForCausalLM.from_pretrained(neox_src).eval()
    state = source.state_dict()
    for i in (1, 2):
        for kind in ("weight", "bias"):
            name = f"gpt_neox.layers.{i}.attention.query_key_value.{kind}"
            state[name] = by_hand(state[name])
    expected = SkipV1GPTNeoXForCausalLM(
        SkipV1GPTNeoXConfig(**source.config.to_dict(), skip_v_heads=2)
    )
    expected.load_state_dict(state)
    x = token_ids(vocab=320)
    with torch.no_grad():
        want = expected.eval()(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1GPTNeoXForCausalLM
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
        # the source's output head `embed_out` is loaded, not left random
        assert torch.equal(model.lm_head.weight, source.lm_head.weight)


def test_convert_mean_and_the_default_init(neox_src, tmp_path, cli):
    """--init mean converts; the default (reconstruct) and calibrated are refused by name."""
    result = cli("convert", neox_src, tmp_path / "mean", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "mean")
    source = AutoModelForCausalLM.from_pretrained(neox_src)
    # own head j of a later layer = mean of source value heads (2j, 2j+1), by hand
    qkv = source.state_dict()["gpt_neox.layers.1.attention.query_key_value.weight"]
    heads = qkv.reshape(4, 3, 16, -1)
    values = heads[:, 2].reshape(2, 2, 16, -1).mean(1)
    got = model.state_dict()["gpt_neox.layers.1.attention.query_key_value.weight"]
    torch.testing.assert_close(got[:96].reshape(2, 3, 16, -1)[:, 2], values)
    for init in ("reconstruct", "calibrated"):
        args = ["--init", init] if init != "reconstruct" else []
        refused = cli("convert", neox_src, tmp_path / init, "--quiet", *args)
        assert refused.exit_code == 2, refused.output
        assert f"--init {init} is not available for GPTNeoXForCausalLM" in refused.output
        assert "--init keep or --init mean" in refused.output


def test_inspect_counts_the_real_parameters(neox_src):
    info = describe(neox_src, skip_v_heads=2)
    source = AutoModelForCausalLM.from_pretrained(neox_src)
    assert info["parameters"] == sum(p.numel() for p in source.parameters())
    skip = SkipV1GPTNeoXForCausalLM(SkipV1GPTNeoXConfig(**source.config.to_dict(), skip_v_heads=2))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(3, 4, 16, 2).bytes_per_token(2)
