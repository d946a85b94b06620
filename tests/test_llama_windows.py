"""The Llama family's sliding windows (Mistral: every layer slides; Qwen2: the layers from
max_window_layers on, or as layer_types say), kept as Gemma's are: from tiny random models made
by transformers with a window of 4, on sequences longer than it. s = 0 is the stock model (which
a full-attention model is not); s > 0: uncached == DynamicCache == token by token == greedy
generate; layer 0's cache keeps its borrowed heads for the full context where a later layer
attends globally; measured cache bytes == the formula; continuous batching == generate beyond
the window; the static cache (sized per layer, chunked prefill) == the uncached forward; `skipv1 convert` keeps the window and its output loads with and without skipv1."""

import json

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    StaticCache,
)
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from skipv1 import SkipV1LlamaConfig, SkipV1LlamaForCausalLM
from skipv1.convert.config import skipv1_config
from skipv1.convert.plan import make_plan
from skipv1.evaluate.kv_memory import measure_kv
from skipv1.modeling.layout import KVLayout, kv_layout
from tests.factories import (
    NOT_FIELDS,
    assert_all_load_without_skipv1,
    assert_cache_paths_agree,
    assert_passes_follow_the_stock_layers,
    assert_windowed_batches_give_generate_s_tokens,
    assert_windowed_static_cache_agrees,
    make_checkpoint,
    token_ids,
)

VOCAB, WINDOW, LENGTH = 97, 4, 14
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    sliding_window=WINDOW,
)
S, F = "sliding_attention", "full_attention"
# case -> (stock config, stock model, its window fields, the layer types they mean)
CASES = {
    "mistral": (MistralConfig, MistralForCausalLM, {}, [S, S, S]),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(use_sliding_window=True, max_window_layers=1),
        [F, S, S],
    ),
    # a sliding layer 0 that a later global layer borrows from: layer 0 keeps a store
    "qwen2-types": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(use_sliding_window=True, layer_types=[S, F, S]),
        [S, F, S],
    ),
}


def stock(case: str, attn: str = "eager", **fields):
    config_cls, model_cls, extra, _ = CASES[case]
    torch.manual_seed(0)
    config = config_cls(**{**SHAPE, **extra, **fields})
    config._attn_implementation = attn
    return model_cls(config).eval()


def converted_config(model, s: int) -> SkipV1LlamaConfig:
    """The SkipV1 config `skipv1 convert` writes for this source model."""
    source = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    out, _ = skipv1_config(source, make_plan(source, s, "keep"), dtype=None)
    config = SkipV1LlamaConfig(**{k: v for k, v in out.items() if k not in NOT_FIELDS})
    config._attn_implementation = model.config._attn_implementation
    return config


def skipv1_model(case: str, s: int, attn: str = "eager"):
    config = converted_config(stock(case, attn), s)
    torch.manual_seed(0)
    return SkipV1LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", CASES)
def test_zero_skip_equals_the_stock_model_beyond_the_window(case, attn):
    source = stock(case, attn)
    skip = SkipV1LlamaForCausalLM(converted_config(source, 0)).eval()
    assert skip.config.layer_types == CASES[case][3]
    skip.load_state_dict(source.state_dict())
    x = token_ids(length=LENGTH, vocab=VOCAB)
    with torch.no_grad():
        want = source(x).logits
        assert torch.equal(skip(x).logits, want)
        # the window matters: the same weights attending over the full context differ
        qwen2 = {"use_sliding_window": False, "layer_types": [F] * 3} if "qwen2" in case else {}
        unwindowed = stock(case, attn, sliding_window=None, **qwen2)
        unwindowed.load_state_dict(source.state_dict())
        assert not torch.allclose(unwindowed(x).logits, want, atol=1e-3)


@pytest.mark.parametrize("case", CASES)
def test_uncached_cached_and_token_by_token_agree_beyond_the_window(case):
    model = skipv1_model(case, 1)
    x, prompt = token_ids(length=LENGTH, vocab=VOCAB), token_ids(batch=1, length=3, vocab=VOCAB)
    assert_cache_paths_agree(model, x, prompt, prefill=2)  # prefill within the window
    assert_cache_paths_agree(model, x, prompt, prefill=9)  # and past it
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x, cache=cache, use_cache=True)
    first = cache.layers[0]
    kind = {S: DynamicSlidingWindowLayer, F: DynamicLayer}[CASES[case][3][0]]
    assert isinstance(first, kind)
    store = getattr(first, "borrowed_values", None)
    if case == "qwen2-types":  # the borrowed head of every position, for the global layer 1
        assert store.shape == (2, 1, LENGTH, 8) and first.keys.shape[2] == WINDOW - 1
    else:
        assert store is None


@pytest.mark.parametrize("case", CASES)
def test_cache_bytes_match_the_formula(case):
    model = skipv1_model(case, 1)
    kv = measure_kv(model, token_ids(batch=1, length=20, vocab=VOCAB))
    windowed = case == "qwen2-types"
    # fp32, head_dim 8: layer 0's 2 key + 2 value heads, later layers' 2 key + 1 own value
    # heads, + layer 0's borrowed head per token where a global layer borrows from it
    assert kv.bytes_per_token == 4 * 8 * (4 + 2 * 3 + windowed) == kv.formula_bytes_per_token
    assert kv_layout(model.config) == KVLayout(3, 2, 8, 1, windowed)


@pytest.mark.parametrize("case", CASES)
def test_static_cache_beyond_the_window_agrees_with_the_uncached_forward(case):
    """(Continuous batching for these windows: test_continuous_batching.py and
    test_family_serving.py compare it with generate().)"""
    assert_windowed_static_cache_agrees(skipv1_model(case, 1), VOCAB)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_fullgraph_compiled_static_decode_beyond_the_window_matches_the_uncached_forward(case):
    model = skipv1_model(case, 1)
    x = token_ids(batch=1, length=11, vocab=VOCAB)
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        full = model(x).logits
        model(x[:, :8], cache=cache, use_cache=True)  # eager prefill past the window of 4
        step = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        got = [
            step(x[:, t : t + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[t]]))
            for t in range(8, 11)
        ]
    torch._dynamo.reset()
    got = torch.cat([out.logits for out in got], dim=1)
    torch.testing.assert_close(got, full[:, 8:], rtol=0, atol=1e-5)


SOURCES = {
    "mistral": (dict(sliding_window=WINDOW), [S, S, S]),
    "qwen2": (dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=1), [F, S, S]),
}


def test_convert_keeps_the_window_and_loads_with_and_without_skipv1(tmp_path, cli):
    children = []
    for arch, (fields, types) in SOURCES.items():
        src = make_checkpoint(tmp_path / f"src-{arch}", arch=arch, num_key_value_heads=2, **fields)
        dst = tmp_path / f"dst-{arch}"
        result = cli("convert", src, dst, "--init", "keep", "--skip-heads", "1", "--quiet")
        assert result.exit_code == 0, result.output
        assert "max_position_embeddings" not in result.stderr  # no clamp warning
        config = json.loads((dst / "config.json").read_text())
        assert config["sliding_window"] == WINDOW and config["layer_types"] == types
        assert config["max_position_embeddings"] == 256  # not clamped to the window
        for key in fields:
            assert config[key] == fields[key]

        # --init keep == the source's weights with later layers' v_proj cut to their own head
        source = AutoModelForCausalLM.from_pretrained(src).eval()
        own = 64 // 4  # head_dim
        state = {
            k: v[:own] if ".v_proj." in k and not k.startswith("model.layers.0.") else v
            for k, v in source.state_dict().items()
        }
        expected = SkipV1LlamaForCausalLM(SkipV1LlamaConfig.from_pretrained(dst)).eval()
        expected.load_state_dict(state)
        x = token_ids(length=12, seed=4, vocab=320)  # longer than the window
        with torch.no_grad():
            want = expected(x).logits
            model = AutoModelForCausalLM.from_pretrained(dst).eval()
            assert type(model) is SkipV1LlamaForCausalLM and model.config.layer_types == types
            torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
        children.append((dst, x, want, "SkipV1LlamaForCausalLM"))
    assert_all_load_without_skipv1(children, tmp_path)


@pytest.mark.parametrize("arch", SOURCES)
def test_the_fitted_inits_forward_applies_the_window(tmp_path, arch):
    """calibrated and reconstruct run the source's layers through a forward written out by hand:
    every layer's output must be the windowed model's."""
    from safetensors.torch import load_file

    from skipv1.convert import calibrate

    fields, _ = SOURCES[arch]
    src = make_checkpoint(tmp_path / "src", arch=arch, num_key_value_heads=2, **fields)
    source = json.loads((src / "config.json").read_text())
    out, _ = skipv1_config(source, make_plan(source, 1, "keep"), dtype=None)
    config = calibrate.source_config(out)
    state = load_file(src / "model.safetensors")

    def load(names):
        return {name: state[name] for name in names}

    x = token_ids(length=16, seed=5, vocab=320)  # four windows
    want = assert_passes_follow_the_stock_layers(src, config, load, x)
    unwindowed = calibrate.source_config({**out, "sliding_window": None, "layer_types": None})
    assert not torch.allclose(calibrate.source_hidden_states(unwindowed, load, x)[-1], want[-1])


@pytest.mark.parametrize("case", CASES)
def test_continuous_batching_beyond_the_window_gives_generate_s_tokens(case):
    """Prompts and generations longer than the window of 4, in pages of 4 tokens, several
    requests per batch: the paged cache's windows and borrowed heads per layer type."""
    assert_windowed_batches_give_generate_s_tokens(skipv1_model(case, 1))
