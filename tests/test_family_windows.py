"""Active sliding windows of Mixtral, Qwen3-MoE, Phi-3 (every layer slides, as Mistral's; Phi-3's
q/k/v fused) and Qwen3 (the layers from max_window_layers on, or as layer_types say), kept as the
Llama family keeps Mistral's and Qwen2's: from tiny random models made by transformers with a
window of 4, on sequences longer than it. s = 0 is the stock model (which full attention is not);
s > 0: uncached == DynamicCache == token by token == greedy generate, prefill within and past the
window; the cache layers (a sliding layer 0 before a global layer keeps its borrowed head for
every position) and the bytes per token == the formula; continuous batching == generate; the
calibrated inits' forward applies the window (Phi-3's, through the Llama view:
test_fused_calibrated.py); `skipv1 convert` keeps the window fields and its output loads with and
without skipv1. The default init on a windowed Mixtral: test_families_olmo2_moe.py (`WINDOWED`)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from skipv1.convert import calibrate
from skipv1.convert.config import skipv1_config
from skipv1.convert.plan import make_plan
from skipv1.evaluate.kv_memory import measure_kv
from skipv1.families import family_of
from skipv1.modeling import FAMILY_CLASSES
from skipv1.modeling.layout import kv_layout
from tests.factories import (
    ARCHS,
    NOT_FIELDS,
    assert_all_load_without_skipv1,
    assert_cache_paths_agree,
    assert_passes_follow_the_stock_layers,
    assert_windowed_batches_give_generate_s_tokens,
    assert_windowed_static_cache_agrees,
    exported_greedy,
    make_checkpoint,
    tiny_config,
    token_ids,
)

WINDOW, KV, HEAD_DIM, LENGTH = 4, 2, 16, 14
S, F = "sliding_attention", "full_attention"
# case -> (source arch, its window fields, the attention type of each layer)
CASES = {
    "mixtral": ("mixtral", {}, [S, S, S]),
    "qwen3_moe": ("qwen3_moe", {"use_sliding_window": True}, [S, S, S]),
    "phi3": ("phi3", {}, [S, S, S]),  # Phi-3-mini-4k: a window of 2047 in a context of 4096
    "qwen3": ("qwen3", {"use_sliding_window": True, "max_window_layers": 1}, [F, S, S]),
    # a sliding layer 0 that the global layer 1 borrows from: layer 0 keeps a store
    "qwen3-types": ("qwen3", {"use_sliding_window": True, "layer_types": [S, F, S]}, [S, F, S]),
}
UNWINDOWED = {"sliding_window": None, "use_sliding_window": False, "layer_types": [F] * 3}


def source_fields(case: str) -> dict:
    return {"num_key_value_heads": KV, "sliding_window": WINDOW, **CASES[case][1]}


def stock(case: str, **fields):
    arch = CASES[case][0]
    fields = {**source_fields(case), **fields}
    if arch != "qwen3":  # one window for every layer: no layer_types
        fields.pop("layer_types", None)
    if "use_sliding_window" not in CASES[case][1]:  # and always on
        fields.pop("use_sliding_window", None)
    torch.manual_seed(0)
    return ARCHS[arch][1](tiny_config(arch, **fields)).eval()


def converted(model, s: int):
    """The SkipV1 model `skipv1 convert --init keep` makes of `model` (its config as convert
    writes it)."""
    source = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    out, _ = skipv1_config(source, make_plan(source, s, "keep"), dtype=None)
    config_class, causal_lm = FAMILY_CLASSES[family_of(source).model_type]
    skip = causal_lm(config_class(**{k: v for k, v in out.items() if k not in NOT_FIELDS})).eval()
    # a later layer's value rows end its v_proj, or Phi-3's fused [q | k | v] qkv_proj
    value = (".v_proj.", ".qkv_proj.")
    skip.load_state_dict(
        {
            k: v[: len(v) - s * HEAD_DIM]
            if any(n in k for n in value) and ".layers.0." not in k
            else v
            for k, v in model.state_dict().items()
        }
    )
    return skip


@pytest.mark.parametrize("case", CASES)
def test_zero_skip_equals_the_stock_model_beyond_the_window(case):
    source = stock(case)
    skip = converted(source, 0)
    assert [a.attention_kwargs()["sliding_window"] for a in _attentions(skip)] == [
        WINDOW if t == S else None for t in CASES[case][2]
    ]
    x = token_ids(length=LENGTH, vocab=320)
    with torch.no_grad():
        want = source(x).logits
        assert torch.equal(skip(x).logits, want)
        unwindowed = stock(case, **UNWINDOWED)
        unwindowed.load_state_dict(source.state_dict())
        assert not torch.allclose(unwindowed(x).logits, want, atol=1e-3)


def _attentions(model):
    return [layer.self_attn for layer in model.model.layers]


@pytest.mark.parametrize("case", CASES)
def test_cache_paths_agree_beyond_the_window_and_bytes_match_the_formula(case):
    model = converted(stock(case), 1)
    x, prompt = token_ids(length=LENGTH, vocab=320), token_ids(batch=1, length=3, vocab=320)
    assert_cache_paths_agree(model, x, prompt, prefill=2, atol=1e-4)  # prefill within the window
    assert_cache_paths_agree(model, x, prompt, prefill=9, atol=1e-4)  # and past it
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x, cache=cache, use_cache=True)
    types = CASES[case][2]
    for i, (layer, kind) in enumerate(zip(cache.layers, types, strict=True)):
        assert isinstance(layer, {S: DynamicSlidingWindowLayer, F: DynamicLayer}[kind])
        heads = KV if i == 0 else KV - 1
        assert layer.values.shape[1:3] == (heads, WINDOW - 1 if kind == S else LENGTH)
    store = getattr(cache.layers[0], "borrowed_values", None)
    windowed = types[0] == S and F in types  # the store: layer 0's borrowed head, every position
    if windowed:
        assert store.shape == (2, 1, LENGTH, HEAD_DIM)  # batch 2, s = 1
    else:
        assert store is None
    kv = measure_kv(model, token_ids(batch=1, length=3, vocab=320))  # within the window
    assert kv.bytes_per_token == 4 * HEAD_DIM * (2 * KV + 2 * (2 * KV - 1) + windowed)
    assert kv.bytes_per_token == kv.formula_bytes_per_token
    assert kv_layout(model.config).windowed_first_layer == windowed


@pytest.mark.parametrize("case", CASES)
def test_continuous_batching_beyond_the_window_gives_generate_s_tokens(case):
    """Prompts and generations longer than the window, in pages of 4 tokens, two requests per
    batch: the paged cache's windows and borrowed heads per layer type."""
    assert_windowed_batches_give_generate_s_tokens(converted(stock(case), 1))


@pytest.mark.parametrize("case", CASES)
def test_static_cache_beyond_the_window_agrees_with_the_uncached_forward(case):
    assert_windowed_static_cache_agrees(converted(stock(case), 1), 320)


@pytest.mark.parametrize("case", ["mixtral", "qwen3-types"])
def test_the_fitted_inits_forward_applies_the_window(case, tmp_path):
    arch = CASES[case][0]
    src = make_checkpoint(tmp_path / "src", arch=arch, **source_fields(case))
    source = json.loads((src / "config.json").read_text())
    out, _ = skipv1_config(source, make_plan(source, 1, "keep"), dtype=None)
    config = calibrate.source_config(out)
    state = load_file(src / "model.safetensors")

    def load(names):
        return {name: state[name] for name in names}

    x = token_ids(length=LENGTH, seed=5, vocab=320)
    assert_passes_follow_the_stock_layers(src, config, load, x)


def test_convert_keeps_the_window_and_loads_with_and_without_skipv1(tmp_path, cli):
    children = []
    for case, (arch, fields, _) in CASES.items():
        src = make_checkpoint(tmp_path / f"src-{case}", arch=arch, **source_fields(case))
        dst = tmp_path / f"dst-{case}"
        result = cli("convert", src, dst, "--init", "keep", "--skip-heads", "1", "--quiet")
        assert result.exit_code == 0, result.output
        assert "max_position_embeddings" not in result.stderr  # no clamp warning
        config = json.loads((dst / "config.json").read_text())
        assert config["sliding_window"] == WINDOW
        assert config["max_position_embeddings"] == 256  # not clamped to the window
        for key, value in fields.items():
            assert config[key] == value
        x = token_ids(length=12, seed=4, vocab=320)  # longer than the window
        with torch.no_grad():
            want = converted(AutoModelForCausalLM.from_pretrained(src).eval(), 1)(x).logits
            model = AutoModelForCausalLM.from_pretrained(dst).eval()
            torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
        children.append((dst, x, want, config["architectures"][0]))
    assert_all_load_without_skipv1(children, tmp_path)


@pytest.mark.parametrize("case", ["qwen3-types", "qwen3", "mixtral"])
def test_the_executorch_recipe_exports_a_windowed_model_with_the_saving(case):
    """optimum-executorch's recipe gives a windowed config with layer_types (Qwen3's) transformers'
    hybrid-cache program, Mixtral's kind (one window, no layer_types) the static one: both give
    generate()'s tokens beyond the window, later layers' value buffers of their own heads."""
    from skipv1.executorch import SkipV1ExportableModuleForDecoderOnlyLM

    model = converted(stock(case), 1)
    model.generation_config.cache_implementation = "static"  # the static program's requirement
    prompt = token_ids(batch=1, length=7, vocab=320)[0].tolist()
    want = model.generate(
        torch.tensor([prompt]), max_new_tokens=6, do_sample=False, cache_implementation="dynamic"
    )
    recipe = SkipV1ExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=16)
    exported = recipe.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0]))
    torch._dynamo.reset()
    assert exported_greedy(exported, prompt, 6) == want[0, len(prompt) :].tolist()
    values = [b.shape[1] for n, b in exported.named_buffers() if n.startswith("value_cache_")]
    assert values == [KV, KV - 1, KV - 1]
