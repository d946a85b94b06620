"""Mixtral with an active sliding window (every layer slides, as Mistral's), kept as the Llama
family keeps Mistral's: from a tiny random MixtralForCausalLM with a window of 4 on sequences
longer than it. s = 0 is the stock model (which full attention is not); s > 0: uncached ==
DynamicCache == token by token == greedy generate, prefill within and past the window; the cache
holds the window in every layer and its bytes per token are the formula's (no store: no layer
attends globally); continuous batching == generate; the calibrated inits' forward applies the
window; `skipv1 convert` keeps the window and its output loads. The default init on a windowed
Mixtral and its output's load with trust_remote_code where skipv1 is not installed:
test_families_olmo2_moe.py (`WINDOWED`)."""

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from skipv1.convert import calibrate, reconstruct
from skipv1.convert.config import skipv1_config
from skipv1.convert.plan import make_plan
from skipv1.evaluate.kv_memory import measure_kv
from skipv1.modeling import FAMILY_CLASSES
from skipv1.modeling.layout import KVLayout, kv_layout
from tests.factories import (
    ARCHS,
    NOT_FIELDS,
    assert_cache_paths_agree,
    make_checkpoint,
    tiny_config,
    token_ids,
)

WINDOW, KV, HEAD_DIM, LENGTH = 4, 2, 16, 14
FIELDS = dict(num_key_value_heads=KV, sliding_window=WINDOW)


def stock(**fields):
    torch.manual_seed(0)
    return ARCHS["mixtral"][1](tiny_config("mixtral", **{**FIELDS, **fields})).eval()


def converted(model, s: int):
    """The SkipV1 model `skipv1 convert --init keep` makes of `model` (its config as convert
    writes it)."""
    source = {**model.config.to_dict(), "architectures": ["MixtralForCausalLM"]}
    out, _ = skipv1_config(source, make_plan(source, s, "keep"), dtype=None)
    config_class, causal_lm = FAMILY_CLASSES["skipv1_mixtral"]
    skip = causal_lm(config_class(**{k: v for k, v in out.items() if k not in NOT_FIELDS})).eval()
    own = (KV - s) * HEAD_DIM
    skip.load_state_dict(
        {
            k: v[:own] if ".v_proj." in k and ".layers.0." not in k else v
            for k, v in model.state_dict().items()
        }
    )
    return skip


def test_zero_skip_equals_the_stock_model_beyond_the_window():
    source = stock()
    skip = converted(source, 0)
    assert skip.config.sliding_window == WINDOW
    x = token_ids(length=LENGTH, vocab=320)
    with torch.no_grad():
        want = source(x).logits
        assert torch.equal(skip(x).logits, want)
        unwindowed = stock(sliding_window=None)
        unwindowed.load_state_dict(source.state_dict())
        assert not torch.allclose(unwindowed(x).logits, want, atol=1e-3)


def test_cache_paths_agree_beyond_the_window_and_bytes_match_the_formula():
    model = converted(stock(), 1)
    x, prompt = token_ids(length=LENGTH, vocab=320), token_ids(batch=1, length=3, vocab=320)
    assert_cache_paths_agree(model, x, prompt, prefill=2, atol=1e-4)  # prefill within the window
    assert_cache_paths_agree(model, x, prompt, prefill=9, atol=1e-4)  # and past it
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x, cache=cache, use_cache=True)
    assert all(type(layer) is DynamicSlidingWindowLayer for layer in cache.layers)
    assert [layer.values.shape[1:3] for layer in cache.layers] == [(KV, WINDOW - 1)] + [
        (KV - 1, WINDOW - 1)
    ] * 2
    kv = measure_kv(model, token_ids(batch=1, length=3, vocab=320))  # within the window
    assert kv.bytes_per_token == 4 * HEAD_DIM * (2 * KV + 2 * (2 * KV - 1))
    assert kv.bytes_per_token == kv.formula_bytes_per_token
    assert kv_layout(model.config) == KVLayout(3, KV, HEAD_DIM, 1, False)


def test_the_fitted_inits_forward_applies_the_window(tmp_path):
    src = make_checkpoint(tmp_path / "src", arch="mixtral", **FIELDS)
    source = json.loads((src / "config.json").read_text())
    out, _ = skipv1_config(source, make_plan(source, 1, "keep"), dtype=None)
    config = calibrate.source_config(out)
    state = load_file(src / "model.safetensors")

    def load(names):
        return {name: state[name] for name in names}

    x = token_ids(length=LENGTH, seed=5, vocab=320)
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        want = model(x, output_hidden_states=True).hidden_states[1:-1]  # the last one is normed
    for forward in (calibrate.source_hidden_states, reconstruct.source_hidden_states):
        got = forward(config, load, x)
        for i, expected in enumerate(want):
            torch.testing.assert_close(got[i], expected, atol=1e-5, rtol=1e-5, msg=f"layer {i}")


def test_convert_keeps_the_window(tmp_path, cli):
    src = make_checkpoint(tmp_path / "src", arch="mixtral", **FIELDS)
    dst = tmp_path / "dst"
    result = cli("convert", src, dst, "--init", "keep", "--skip-heads", "1", "--quiet")
    assert result.exit_code == 0, result.output
    assert "max_position_embeddings" not in result.stderr  # no clamp warning
    config = json.loads((dst / "config.json").read_text())
    assert config["sliding_window"] == WINDOW
    assert config["max_position_embeddings"] == 256  # not clamped to the window
    x = token_ids(length=12, seed=4, vocab=320)  # longer than the window
    with torch.no_grad():
        want = converted(AutoModelForCausalLM.from_pretrained(src).eval(), 1)(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert model.config.sliding_window == WINDOW
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)


def test_continuous_batching_beyond_the_window_gives_generate_s_tokens():
    """Prompts and generations longer than the window, in pages of 4 tokens, two requests per
    batch: the paged cache's windows (every layer slides)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    model = converted(stock(), 1)
    prompts, new = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17]], 7
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(
        num_blocks=32, page_size=4, max_batch_tokens=12, max_requests_per_batch=2
    )
    out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb)
    got = [
        r.generated_tokens
        for r in sorted(out.values(), key=lambda r: int(r.request_id.split("_")[-1]))
    ]
    expected = [
        model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p) :].tolist()
        for p in prompts
    ]
    assert got == expected
