"""The GPT-2 family: SkipV1 on transformers' GPT-2 classes (Conv1D `c_attn` with weight [in, out],
learned positions, multi-head attention), from a tiny random GPT2LMHeadModel: s = 0 is the stock
model, uncached == cached == generate, measured cache bytes == the formula, the fused layout of
a later layer against a hand-computed split, and `skipv1 convert` (its output loads without
skipv1: test_fused_remote_code.py)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from skipv1 import SkipV1GPT2Config, SkipV1GPT2ForCausalLM
from skipv1.checkpoint_info import describe
from skipv1.modeling.layout import KVLayout
from tests.factories import (
    assert_cache_paths_agree,
    generated_cache_bytes,
    make_checkpoint,
    token_ids,
)

SHAPE = dict(n_embd=32, n_head=4, n_layer=3, vocab_size=97, n_positions=64)
D = 8  # head_dim = 32 / 4


def skipv1_model(s: int, attn="sdpa") -> SkipV1GPT2ForCausalLM:
    torch.manual_seed(0)
    config = SkipV1GPT2Config(**SHAPE, skip_v_heads=s)
    config._attn_implementation = attn
    model = SkipV1GPT2ForCausalLM(config).eval()
    with torch.no_grad():  # non-zero biases, so that their columns' layout matters
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_zero_skip_equals_stock_gpt2(attn):
    config = GPT2Config(**SHAPE)
    config._attn_implementation = attn
    source = GPT2LMHeadModel(config).eval()
    skip = skipv1_model(0, attn=attn)
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
    model = skipv1_model(1)
    measured, cache = generated_cache_bytes(model, token_ids(batch=1, length=20))
    assert cache.get_seq_length() == 20
    assert measured == 20 * KVLayout(3, 4, D, 1).bytes_per_token(dtype_bytes=4)
    assert [layer.values.shape[1] for layer in cache.layers] == [4, 3, 3]


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def gpt2_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(tmp_path / "src", arch="gpt2", tokenizer_dir=tokenizer_dir)


def test_convert_keep_cuts_the_value_columns_of_c_attn(gpt2_src, tmp_path, cli):
    dst = tmp_path / "dst"
    dry = cli("convert", gpt2_src, dst, "--init", "keep", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "4 rewritten" in dry.output and not dst.exists()
    result = cli("convert", gpt2_src, dst, "--init", "keep", "--skip-heads", "2", "--quiet")
    assert result.exit_code == 0, result.output

    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "skipv1_gpt2"
    assert config["architectures"] == ["SkipV1GPT2ForCausalLM"]
    assert (
        config["auto_map"]["AutoModelForCausalLM"] == "modeling_skipv1_gpt2.SkipV1GPT2ForCausalLM"
    )
    assert config["fused_qkv_split"]["layers_1_on"]["v_heads"] == 2
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert {(t["name"], tuple(t["to"])) for t in record["tensors_changed"]} == {
        (f"transformer.h.{i}.attn.c_attn.{kind}", shape)
        for i in (1, 2)
        for kind, shape in (("weight", (64, 160)), ("bias", (160,)))
    }

    # by hand: c_attn's weight is [in, out]; out = [q 0..63 | k 64..127 | v 128..191] and keep
    # leaves the value columns of heads 0, 1 (128..159)
    source = AutoModelForCausalLM.from_pretrained(gpt2_src).eval()
    state = source.state_dict()
    for i in (1, 2):
        weight = state[f"transformer.h.{i}.attn.c_attn.weight"]
        state[f"transformer.h.{i}.attn.c_attn.weight"] = weight[:, :160]
        state[f"transformer.h.{i}.attn.c_attn.bias"] = state[f"transformer.h.{i}.attn.c_attn.bias"][
            :160
        ]
    expected = SkipV1GPT2ForCausalLM(SkipV1GPT2Config(**source.config.to_dict(), skip_v_heads=2))
    expected.load_state_dict(state)
    x = token_ids(vocab=320)
    with torch.no_grad():
        want = expected.eval()(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1GPT2ForCausalLM
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)


def test_convert_mean_pools_value_columns_and_the_default_init_is_refused(gpt2_src, tmp_path, cli):
    result = cli("convert", gpt2_src, tmp_path / "mean", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    source = AutoModelForCausalLM.from_pretrained(gpt2_src).state_dict()
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "mean").state_dict()
    weight = source["transformer.h.1.attn.c_attn.weight"]  # [64, 192]
    values = weight[:, 128:].reshape(64, 2, 2, 16).mean(2).reshape(64, 32)  # heads (0,1), (2,3)
    torch.testing.assert_close(got["transformer.h.1.attn.c_attn.weight"][:, 128:], values)
    assert torch.equal(got["transformer.h.1.attn.c_attn.weight"][:, :128], weight[:, :128])
    refused = cli("convert", gpt2_src, tmp_path / "default", "--quiet")
    assert refused.exit_code == 2, refused.output
    assert "not available for GPT2LMHeadModel" in refused.output
    assert "--init keep or --init mean" in refused.output


def test_inspect_reads_gpt2_field_names(gpt2_src):
    """GPT-2's config.json says n_embd, n_head, n_layer: inspect counts from them."""
    info = describe(gpt2_src, skip_v_heads=2)
    source = AutoModelForCausalLM.from_pretrained(gpt2_src)
    assert info["parameters"] == sum(p.numel() for p in source.parameters())
    skip = SkipV1GPT2ForCausalLM(SkipV1GPT2Config(**source.config.to_dict(), skip_v_heads=2))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(3, 4, 16, 2).bytes_per_token(2)


def test_convert_reads_the_hubs_original_gpt2_layout(gpt2_src, tmp_path, cli):
    """The Hub's original GPT-2 checkpoints name tensors without `transformer.` and store each
    layer's causal mask (`h.{i}.attn.bias`): the masks are dropped, the names kept."""
    state = load_file(gpt2_src / "model.safetensors")
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    for i in range(3):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, 256, 256).tril()
    (gpt2_src / "model.safetensors").unlink()
    save_file(state, gpt2_src / "model.safetensors", metadata={"format": "pt"})
    dst = tmp_path / "dst"
    result = cli("convert", gpt2_src, dst, "--init", "keep", "--skip-heads", "2")
    assert result.exit_code == 0, result.output
    assert "dropped 3 recomputed buffer(s)" in result.output
    written = load_file(dst / "model.safetensors")
    assert written["h.1.attn.c_attn.weight"].shape == (64, 160)
    assert torch.equal(written["h.1.attn.c_attn.weight"], state["h.1.attn.c_attn.weight"][:, :160])
    assert not any(name.endswith(".attn.bias") for name in written)
    model = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert torch.equal(model.transformer.h[1].attn.c_attn.weight, written["h.1.attn.c_attn.weight"])
