"""The families with fused q/k/v projections, one table: GPT-2 (Conv1D `c_attn` [in, out],
learned positions), GPT-NeoX (`query_key_value` interleaved per head, partial rotary, parallel
residual), Phi-3 (`qkv_proj` [q | k | v], grouped KV heads). From tiny random models made by
transformers: s = 0 is the stock model, uncached == cached == generate, measured cache bytes ==
the formula, inspect counts the real parameters, and `skipv1 convert --init keep` cuts a later
layer's value rows as a hand-computed split does (its output loads without skipv1:
test_fused_remote_code.py). What only one family has stays in test_gpt2.py, test_gpt_neox.py
and test_phi3.py."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)

from skipv1 import (
    SkipV1GPT2Config,
    SkipV1GPT2ForCausalLM,
    SkipV1GPTNeoXConfig,
    SkipV1GPTNeoXForCausalLM,
    SkipV1Phi3Config,
    SkipV1Phi3ForCausalLM,
)
from skipv1.checkpoint_info import describe
from skipv1.modeling.layout import KVLayout
from tests.factories import (
    assert_cache_paths_agree,
    generated_cache_bytes,
    make_checkpoint,
    token_ids,
)

D = 8  # the model tests' head_dim: 32 / 4
TOKENS = dict(pad_token_id=0, eos_token_id=0, bos_token_id=0)


@dataclass(frozen=True)
class Fused:
    stock_config: type
    stock_model: type
    config: type
    model: type
    shape: dict  # the model tests' config fields
    kv: int  # KV heads of `shape`
    biases: bool  # q/k/v biases: made non-zero, so that their rows' layout matters
    cache_s: int  # s of the cache-path test
    bytes_s: int  # s of the cache-bytes test


FAMILIES = {
    "gpt2": Fused(
        GPT2Config,
        GPT2LMHeadModel,
        SkipV1GPT2Config,
        SkipV1GPT2ForCausalLM,
        dict(n_embd=32, n_head=4, n_layer=3, vocab_size=97, n_positions=64),
        kv=4,
        biases=True,
        cache_s=2,
        bytes_s=1,
    ),
    # rotary on the first 2 dims of each head (GPT-NeoX's default 0.25)
    "gpt_neox": Fused(
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        SkipV1GPTNeoXConfig,
        SkipV1GPTNeoXForCausalLM,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_hidden_layers=3,
            intermediate_size=64,
            vocab_size=97,
            max_position_embeddings=128,
        ),
        kv=4,
        biases=True,
        cache_s=2,
        bytes_s=3,
    ),
    # 4 query heads over 2 KV heads: s counts KV heads, so s = 1 takes one of two value heads
    "phi3": Fused(
        Phi3Config,
        Phi3ForCausalLM,
        SkipV1Phi3Config,
        SkipV1Phi3ForCausalLM,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            intermediate_size=64,
            vocab_size=97,
            max_position_embeddings=128,
            **TOKENS,
        ),
        kv=2,
        biases=False,
        cache_s=1,
        bytes_s=1,
    ),
}
ATTENTION = [(family, attn) for family in FAMILIES for attn in ("eager", "sdpa")]


def skipv1_model(family: str, s: int, attn: str = "sdpa", **extra):
    f = FAMILIES[family]
    torch.manual_seed(0)
    config = f.config(**f.shape, **extra, skip_v_heads=s)
    config._attn_implementation = attn
    model = f.model(config).eval()
    if f.biases:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize(
    ("family", "attn", "extra"),
    [
        *((family, attn, {}) for family, attn in ATTENTION if family != "gpt_neox"),
        ("gpt_neox", "eager", dict(use_parallel_residual=True)),
        ("gpt_neox", "sdpa", dict(use_parallel_residual=True)),
        ("gpt_neox", "sdpa", dict(use_parallel_residual=False)),
    ],
)
def test_zero_skip_equals_the_stock_model(family, attn, extra):
    f = FAMILIES[family]
    config = f.stock_config(**f.shape, **extra)
    config._attn_implementation = attn
    source = f.stock_model(config).eval()
    skip = skipv1_model(family, 0, attn, **extra)
    source.load_state_dict(skip.state_dict())
    x = token_ids()
    with torch.no_grad():
        assert torch.equal(skip(x).logits, source(x).logits)


@pytest.mark.parametrize(("family", "attn"), ATTENTION)
def test_uncached_cached_and_greedy_generate_agree(family, attn):
    model = skipv1_model(family, FAMILIES[family].cache_s, attn)
    x = token_ids(length=12)
    assert_cache_paths_agree(model, x, token_ids(batch=1, length=6), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_cache_bytes_match_the_formula(family):
    f = FAMILIES[family]
    model = skipv1_model(family, f.bytes_s)
    measured, cache = generated_cache_bytes(model, token_ids(batch=1, length=20))
    assert cache.get_seq_length() == 20
    assert measured == 20 * KVLayout(3, f.kv, D, f.bytes_s).bytes_per_token(dtype_bytes=4)
    assert [layer.values.shape[1] for layer in cache.layers] == [f.kv] + [f.kv - f.bytes_s] * 2


# --- convert ----------------------------------------------------------------------------------


def _gpt2_by_hand(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """c_attn's weight is [in, out]; out = [q 0..63 | k 64..127 | v 128..191] and keep leaves
    the value columns of heads 0, 1 (128..159)."""
    return tensor[:, :160] if tensor.dim() == 2 else tensor[:160]


def _neox_by_hand(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """4 heads of 16 rows with heads 2, 3 borrowed: head h's rows are [q_h k_h v_h] = 48h ..
    48h + 47; the borrowed heads lose their v rows."""
    rows = [*range(0, 48), *range(48, 96), *range(96, 128), *range(144, 176)]
    return tensor[rows]


def _phi3_by_hand(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """[q (64 rows) | k (32) | v head 0 (16 of 32)]."""
    return torch.cat([tensor[:96], tensor[96:112]])


# family -> (source kind, config fields, s, fused tensor names of layer i with their new shapes,
# the split of layers >= 1, the hand-computed cut)
CONVERT = {
    "gpt2": (
        "GPT2LMHeadModel",
        {},
        2,
        lambda i: {
            f"transformer.h.{i}.attn.c_attn.weight": (64, 160),
            f"transformer.h.{i}.attn.c_attn.bias": (160,),
        },
        {"q_heads": 4, "k_heads": 4, "v_heads": 2},
        _gpt2_by_hand,
    ),
    "gpt_neox": (
        "GPTNeoXForCausalLM",
        {},
        2,
        lambda i: {
            f"gpt_neox.layers.{i}.attention.query_key_value.weight": (160, 64),
            f"gpt_neox.layers.{i}.attention.query_key_value.bias": (160,),
        },
        {"q_heads": 4, "k_heads": 4, "v_heads": 2},
        _neox_by_hand,
    ),
    "phi3": (
        "Phi3ForCausalLM",
        dict(num_key_value_heads=2),
        1,
        lambda i: {f"model.layers.{i}.self_attn.qkv_proj.weight": (112, 64)},
        {"q_heads": 4, "k_heads": 2, "v_heads": 1},
        _phi3_by_hand,
    ),
}


@pytest.fixture
def source(tmp_path, tokenizer_dir):
    def _make(family: str) -> Path:
        fields = CONVERT[family][1]
        return make_checkpoint(tmp_path / "src", arch=family, tokenizer_dir=tokenizer_dir, **fields)

    return _make


@pytest.mark.parametrize("family", FAMILIES)
def test_convert_keep_cuts_the_value_rows_of_the_fused_tensor(family, source, tmp_path, cli):
    architecture, _, s, changed, split, by_hand = CONVERT[family]
    f, src, dst = FAMILIES[family], source(family), tmp_path / "dst"
    args = ["--init", "keep", "--skip-heads", str(s)]
    dry = cli("convert", src, dst, *args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    rewritten = {**changed(1), **changed(2)}
    assert f"{len(rewritten)} rewritten" in dry.output and not dst.exists()
    result = cli("convert", src, dst, *args, "--quiet")
    assert result.exit_code == 0, result.output

    config = json.loads((dst / "config.json").read_text())
    prefix = f.model.__name__.removesuffix("ForCausalLM")
    assert config["model_type"] == f"skipv1_{family}"
    assert config["architectures"] == [f.model.__name__]
    assert config["auto_map"] == {
        "AutoConfig": f"configuration_skipv1_{family}.{prefix}Config",
        "AutoModelForCausalLM": f"modeling_skipv1_{family}.{f.model.__name__}",
    }
    assert config["fused_qkv_split"]["layers_1_on"] == split
    for name in (f"configuration_skipv1_{family}.py", f"modeling_skipv1_{family}.py"):
        assert (dst / name).read_text() == (Path("skipv1/modeling") / name).read_text()
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["architecture"] == architecture and record["skip_heads"] == s
    assert {(t["name"], tuple(t["to"])) for t in record["tensors_changed"]} == set(
        rewritten.items()
    )
    assert f"fused `{config['fused_qkv_split']['tensor']}`" in (dst / "README.md").read_text()

    model_source = AutoModelForCausalLM.from_pretrained(src).eval()
    state = model_source.state_dict()
    for name in rewritten:
        state[name] = by_hand(name, state[name])
    expected = f.model(f.config(**model_source.config.to_dict(), skip_v_heads=s))
    expected.load_state_dict(state)
    x = token_ids(vocab=320)
    with torch.no_grad():
        want = expected.eval()(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is f.model
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
        # the source's output head (GPT-NeoX: `embed_out`) is loaded, not left random
        assert torch.equal(model.lm_head.weight, model_source.lm_head.weight)


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_counts_the_real_parameters(family, source):
    """From the family's config.json fields (GPT-2's n_embd, n_head, n_layer)."""
    f, (_, _, s, *_) = FAMILIES[family], CONVERT[family]
    src = source(family)
    info = describe(src, skip_v_heads=s)
    model = AutoModelForCausalLM.from_pretrained(src)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    skip = f.model(f.config(**model.config.to_dict(), skip_v_heads=s))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())
    kv = model.config.num_key_value_heads if family == "phi3" else 4
    assert info["kv_bytes_per_token_skipv1_bf16"] == KVLayout(3, kv, 16, s).bytes_per_token(2)
