"""The Gemma 2 and Gemma 3 text families: SkipV1 on transformers' Gemma classes (sliding-window
and global layers, soft-capping, q/k norms, scaled embeddings, query_pre_attn_scalar), from tiny
random models made by transformers, on sequences longer than the sliding window: s = 0 is the
stock model; uncached == DynamicCache == StaticCache (chunked prefill too) == token by token ==
greedy generate; layer 0's cache keeps its borrowed heads for the full context and the measured
cache bytes equal the formula; continuous batching == generate; `skipv1 convert` output loads
with and without skipv1."""

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
)

from skipv1 import (
    SkipV1Gemma2Config,
    SkipV1Gemma2ForCausalLM,
    SkipV1Gemma3TextConfig,
    SkipV1Gemma3TextForCausalLM,
)
from skipv1.checkpoint_info import describe
from skipv1.convert.plan import make_plan
from skipv1.evaluate.kv_memory import measure_kv
from skipv1.modeling.layout import KVLayout, kv_layout
from tests.factories import (
    assert_all_load_without_skipv1,
    assert_passes_follow_the_stock_layers,
    assert_windowed_static_cache_agrees,
    exported_greedy,
    make_checkpoint,
)

VOCAB, WINDOW, LENGTH = 97, 5, 14  # every test sequence runs past the window
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=4,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    sliding_window=WINDOW,
    query_pre_attn_scalar=12,  # != head_dim: the scaling must be Gemma's
)
# family -> (stock config, stock model, SkipV1 config, SkipV1 model, family-specific fields)
FAMILIES = {
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        SkipV1Gemma2Config,
        SkipV1Gemma2ForCausalLM,
        # small caps, so that the soft-capping changes the scores and logits
        dict(attn_logit_softcapping=1.5, final_logit_softcapping=4.0),
    ),
    "gemma3_text": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        SkipV1Gemma3TextConfig,
        SkipV1Gemma3TextForCausalLM,
        # layers: sliding, global, sliding, global (a global layer every 2nd, not every 6th)
        dict(sliding_window_pattern=2, rope_local_base_freq=100.0),
    ),
}
ATTENTION = [("gemma2", "eager"), ("gemma3_text", "eager"), ("gemma3_text", "sdpa")]


def _nontrivial_norms(model):
    """Gemma's RMSNorms scale by (1 + w) and start at w = 0: move them away from it, so that a
    forward that skipped a norm (the q/k norms above all) would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
    return model


def stock(family: str, attn: str = "eager"):
    config_cls, model_cls, _, _, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**SHAPE, **extra)
    config._attn_implementation = attn
    return _nontrivial_norms(model_cls(config).eval())


def skipv1_model(family: str, s: int, attn: str = "eager"):
    _, _, config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**SHAPE, **extra, skip_v_heads=s)
    config._attn_implementation = attn
    return _nontrivial_norms(model_cls(config).eval())


def ids(batch=2, length=LENGTH, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family,attn", ATTENTION)
def test_zero_skip_equals_stock_gemma(family, attn):
    source = stock(family, attn)
    skip = skipv1_model(family, 0, attn)
    assert skip.config.layer_types == source.config.layer_types
    assert skip.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    skip.load_state_dict(source.state_dict())
    with torch.no_grad():
        assert torch.equal(skip(ids()).logits, source(ids()).logits)


@pytest.mark.parametrize("family,attn", ATTENTION)
def test_uncached_cached_and_token_by_token_agree_beyond_the_window(family, attn):
    model = skipv1_model(family, 1, attn)
    x = ids()
    with torch.no_grad():
        full = model(x).logits
        for prefill in (3, 9):  # prefill within the window, and past it
            cache = DynamicCache(config=model.config)
            logits = [model(x[:, :prefill], cache=cache, use_cache=True).logits]
            for t in range(prefill, LENGTH):
                logits.append(model(x[:, t : t + 1], cache=cache, use_cache=True).logits)
            torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=0)
            # layer 0 holds its window, and its borrowed head for every position
            assert cache.layers[0].keys.shape[2] == WINDOW - 1
            assert cache.layers[0].borrowed_values.shape == (2, 1, LENGTH, 16)

    prompt = ids(batch=1, length=4)
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    tokens = prompt
    with torch.no_grad():  # greedy, token by token, with no cache at all
        for _ in range(8):
            nxt = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    assert torch.equal(generated, tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_bytes_match_the_formula(family):
    model = skipv1_model(family, 1)
    kv = measure_kv(model, ids(batch=1, length=20))
    assert kv.cached_tokens == 21 and kv.matches_formula
    # layer 0: 2 key + 2 value heads in the window, plus 1 borrowed value head per token; later
    # layers: 2 key heads and their 1 own value head
    expected = 4 * 16 * (4 + 3 * 3 + 1)
    assert kv.bytes_per_token == expected == KVLayout(4, 2, 16, 1, True).bytes_per_token(4)
    assert kv_layout(model.config).windowed_first_layer


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_beyond_the_window_agrees_with_the_uncached_forward(family):
    """Layer 0 slides and global layers borrow from it: its static layer keeps the borrowed
    heads of every position. (Continuous batching: tests/test_family_serving.py.)"""
    assert_windowed_static_cache_agrees(skipv1_model(family, 1), VOCAB)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_executorch_recipe_exports_gemma_with_the_saving(family):
    """optimum-executorch's recipe (transformers' hybrid-cache program): generate()'s tokens
    beyond the window; later layers' value buffers hold their own heads."""
    from skipv1.executorch import SkipV1ExportableModuleForDecoderOnlyLM

    model = skipv1_model(family, 1)
    prompt = ids(1, LENGTH)[0].tolist()
    want = model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    recipe = SkipV1ExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=32)
    exported = recipe.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0]))
    torch._dynamo.reset()
    assert exported_greedy(exported, prompt, 4) == want[0, len(prompt) :].tolist()
    values = [b.shape[1] for n, b in exported.named_buffers() if n.startswith("value_cache_")]
    assert values == [model.config.own_value_heads(i) for i in range(len(values))]
    assert values[1:] == [1] * (SHAPE["num_hidden_layers"] - 1)  # 2 KV heads, s = 1


# --- convert ----------------------------------------------------------------------------------


def gemma_source(tmp_path, family, tokenizer_dir=None) -> Path:
    extra = {k: v for k, v in FAMILIES[family][4].items() if k != "rope_local_base_freq"}
    path = make_checkpoint(
        tmp_path / f"src-{family}",
        arch=family,
        tokenizer_dir=tokenizer_dir,
        num_key_value_heads=2,
        num_hidden_layers=4,
        sliding_window=8,
        query_pre_attn_scalar=4,
        **extra,
    )
    model = _nontrivial_norms(AutoModelForCausalLM.from_pretrained(path))
    with torch.no_grad():  # attention scores of order 1, so that capping and masks matter
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10.0)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_and_inspect_follow_the_gemma_layout(tmp_path, family):
    src = gemma_source(tmp_path, family)
    config = json.loads((src / "config.json").read_text())
    plan = make_plan(config, 1, "keep")
    norms = ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    norms += ["self_attn.q_norm", "self_attn.k_norm"] if family == "gemma3_text" else []
    for norm in norms:
        assert plan.tasks[f"model.layers.3.{norm}.weight"].action == "copy"
    assert "lm_head.weight" in plan.source.optional_tensors()  # Gemma ties its embeddings
    assert plan.tasks["model.layers.1.self_attn.v_proj.weight"].target_shape == (16, 64)
    assert plan.kv_after.bytes_per_token(2) == 2 * 16 * (4 + 3 * 3 + 1)
    # a config.json without layer_types (older Hub files) gets transformers' default pattern
    pattern = {k: v for k, v in config.items() if k != "layer_types"}
    assert kv_layout(pattern).windowed_first_layer
    assert make_plan(pattern, 1, "keep").kv_after == plan.kv_after

    info = describe(src, skip_v_heads=1)
    source = AutoModelForCausalLM.from_pretrained(src)
    assert info["parameters"] == sum(p.numel() for p in source.parameters())
    config_cls, model_cls = FAMILIES[family][2:4]
    skip = model_cls(config_cls(**source.config.to_dict(), skip_v_heads=1))
    assert info["parameters_skipv1"] == sum(p.numel() for p in skip.parameters())
    assert info["kv_bytes_per_token_skipv1_bf16"] == plan.kv_after.bytes_per_token(2)


def test_convert_keep_loads_with_auto_classes_and_remote_code(tmp_path, cli):
    children = []  # one child process loads both families without skipv1
    for family in FAMILIES:
        children.append(_convert_keep_and_check(tmp_path, family, cli))
    assert_all_load_without_skipv1(children, tmp_path)


def _convert_keep_and_check(tmp_path, family, cli) -> tuple:
    src = gemma_source(tmp_path, family)
    dst = tmp_path / f"dst-{family}"
    dry = cli("convert", str(src), str(dst), "--init", "keep", "--skip-heads", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not dst.exists()
    result = cli("convert", str(src), str(dst), "--init", "keep", "--skip-heads", "1", "--quiet")
    assert result.exit_code == 0, result.output

    config = json.loads((dst / "config.json").read_text())
    prefix = FAMILIES[family][3].__name__.removesuffix("ForCausalLM")
    assert config["model_type"] == f"skipv1_{family}"
    assert config["architectures"] == [f"{prefix}ForCausalLM"]
    auto = config["auto_map"]["AutoModelForCausalLM"]
    assert auto == f"modeling_skipv1_{family}.{prefix}ForCausalLM"
    assert config["sliding_window"] == 8 and config["layer_types"][0] == "sliding_attention"
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["skip_heads"] == 1 and record["init"] == "keep"
    assert "SkipV1" in (dst / "README.md").read_text()

    # --init keep == the source's weights with later layers' v_proj cut to their first head
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    state = {
        k: v[:16] if ".v_proj." in k and not k.startswith("model.layers.0.") else v
        for k, v in source.state_dict().items()
    }
    config_cls, model_cls = FAMILIES[family][2:4]
    expected = model_cls(config_cls(**source.config.to_dict(), skip_v_heads=1)).eval()
    expected.load_state_dict(state)
    x = ids(length=20, seed=4)  # longer than the window of 8
    with torch.no_grad():
        want = expected(x).logits
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is model_cls
        torch.testing.assert_close(model(x).logits, want, rtol=0, atol=0)
    return dst, x, want, model_cls.__name__


CALIB = ["--calib-data", "embedded:train", "--calib-tokens", "1024", "--calib-seq-len", "64"]


def test_every_init_converts_gemma_and_the_fitted_ones_are_closest(tmp_path, tokenizer_dir, cli):
    """On a Gemma 3 (the fitted inits' forward is checked against the model's in
    test_the_fitted_inits_forward_is_the_models, for both families): reconstruct < calibrated <
    mean in logit error."""
    family = "gemma3_text"
    src = gemma_source(tmp_path, family, tokenizer_dir)
    tokens = ids(batch=4, length=48, seed=3)  # 6 windows long
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    errors = {}
    for init in ("mean", "calibrated", "reconstruct"):
        dst = tmp_path / init
        args = ["convert", str(src), str(dst), "--init", init, "--skip-heads", "1", "--quiet"]
        # reconstruct without its last (end-to-end) stage: the layer-by-layer refits alone must
        # follow Gemma's forward
        extra = CALIB + (["--calib-distill-steps", "0"] if init == "reconstruct" else [])
        result = cli(*args, *(extra if init != "mean" else []))
        assert result.exit_code == 0, result.output
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        with torch.no_grad():
            errors[init] = (model(tokens).logits - source(tokens).logits).pow(2).mean().item()
    assert errors["reconstruct"] < errors["calibrated"] < errors["mean"], errors


def test_the_default_init_converts_a_gemma(tmp_path, tokenizer_dir, cli):
    src = gemma_source(tmp_path, "gemma3_text", tokenizer_dir)
    dst = tmp_path / "dst"
    result = cli("convert", str(src), str(dst), "--quiet", *CALIB, "--calib-distill-steps", "2")
    assert result.exit_code == 0, result.output
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["init"] == "reconstruct" and record["skip_heads"] == 1
    assert record["calibration"]["distill"]["steps"] == 2
    model = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert type(model) is SkipV1Gemma3TextForCausalLM
    with torch.no_grad():
        assert torch.isfinite(model(ids(length=20)).logits).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fitted_inits_forward_is_the_models(tmp_path, family):
    """calibrated and reconstruct run the source's layers through a forward written out by hand
    (to reach attention probabilities and values): it must be Gemma's, every layer's output equal
    to the model's (scaled embeddings, local/global RoPE, windows, soft-capping, q/k norms, the
    norms around attention and MLP)."""
    from safetensors.torch import load_file

    from skipv1.convert import calibrate

    src = gemma_source(tmp_path, family)
    source_config = json.loads((src / "config.json").read_text())
    config = calibrate.source_config({**source_config, "model_type": f"skipv1_{family}"})
    state = load_file(src / "model.safetensors")

    def load(names):
        return {name: state[name] for name in names}

    x = ids(length=24, seed=5)  # three windows
    assert_passes_follow_the_stock_layers(src, config, load, x, tol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_reorders_the_borrowed_value_store(family):
    """Beam search repeats and reorders the cache's batch: the store must follow, giving the
    beams of a cache that keeps every position in every layer (no window, no store)."""
    model = skipv1_model(family, 1)
    prompt = ids(batch=2, length=6)
    kwargs = dict(max_new_tokens=10, num_beams=3, do_sample=False, pad_token_id=0)
    out = model.generate(prompt, **kwargs, return_dict_in_generate=True)
    assert out.cache.layers[0].borrowed_values.shape[2] == 15  # past the window of 5
    assert torch.equal(out.sequences, model.generate(prompt, **kwargs, cache=DynamicCache()))


@pytest.mark.parametrize(
    "types",
    [
        ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],  # Qwen2's
        ["sliding_attention"] * 4,  # Mistral's
    ],
)
def test_other_layer_patterns_borrow_at_the_right_positions(types):
    """A sliding layer borrowing from a global layer 0 reads its last positions; with every
    layer sliding, layer 0's window is all they need (no store, no `+ s`)."""
    _, _, config_cls, model_cls, extra = FAMILIES["gemma3_text"]
    torch.manual_seed(0)
    model = model_cls(config_cls(**SHAPE, **extra, layer_types=types, skip_v_heads=1)).eval()
    x = ids()
    with torch.no_grad():
        full = model(x).logits
        cache = DynamicCache(config=model.config)
        logits = [model(x[:, :3], cache=cache, use_cache=True).logits]
        for t in range(3, LENGTH):
            logits.append(model(x[:, t : t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=0)
    assert not hasattr(cache.layers[0], "borrowed_values")
    assert not kv_layout(model.config).windowed_first_layer
    assert measure_kv(model, ids(batch=1, length=20)).matches_formula
