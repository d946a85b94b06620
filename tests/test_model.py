"""The SkipV1 model family: equivalences, real KV saving, gradients, save/load, validation."""

import json

import pytest
import torch
from factories import (
    SHAPES,
    assert_loads_without_skipv1,
    llama_config_of,
    random_skipv1,
    small_skipv1_config,
    token_ids,
)
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import skipv1  # noqa: F401  (registers the Auto classes)
from skipv1 import SkipV1LlamaForCausalLM
from skipv1.modeling.layout import KVLayout


def test_v_proj_shapes_follow_the_checkpoint_contract():
    model = random_skipv1(small_skipv1_config(heads=8, kv=4, s=3, head_dim=8))
    rows = [layer.self_attn.v_proj.weight.shape[0] for layer in model.model.layers]
    assert rows == [4 * 8, 1 * 8, 1 * 8]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_zero_skip_equals_stock_llama(attn):
    llama_cfg = llama_config_of(small_skipv1_config(s=0))
    llama_cfg._attn_implementation = attn
    torch.manual_seed(0)
    llama = LlamaForCausalLM(llama_cfg).eval()
    skip = random_skipv1(small_skipv1_config(s=0), attn=attn)
    skip.load_state_dict(llama.state_dict())
    x = token_ids()
    with torch.no_grad():
        assert torch.equal(skip(x).logits, llama(x).logits)


def test_qwen2_style_bias_maps_onto_skipv1_with_zero_skip():
    src_cfg = Qwen2Config(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_hidden_layers=3,
        intermediate_size=96,
        vocab_size=97,
        max_position_embeddings=128,
        sliding_window=None,
    )
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(src_cfg).eval()
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    skip = random_skipv1(small_skipv1_config(s=0, attention_bias=True, o_proj_bias=False))
    assert skip.model.layers[1].self_attn.o_proj.bias is None
    skip.load_state_dict(qwen.state_dict())
    x = token_ids()
    with torch.no_grad():
        torch.testing.assert_close(skip(x).logits, qwen(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("shape", SHAPES)
def test_uncached_cached_and_stepwise_logits_agree(attn, shape):
    heads, kv = SHAPES[shape]
    model = random_skipv1(
        small_skipv1_config(heads=heads, kv=kv, s=kv // 2 or 1, attention_bias=True), attn=attn
    )
    x = token_ids(length=12)
    with torch.no_grad():
        full = model(x).logits
        cache = DynamicCache(config=model.config)
        prefill = model(x[:, :5], cache=cache, use_cache=True).logits
        steps = [model(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(5, 12)]
    stepwise = torch.cat([prefill, *steps], dim=1)
    torch.testing.assert_close(stepwise, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_generate_cache_bytes_match_the_formula(shape):
    heads, kv = SHAPES[shape]
    s = kv // 2
    config = small_skipv1_config(heads=heads, kv=kv, s=s, layers=4)
    model = random_skipv1(config)
    prompt = token_ids(batch=1, length=20)
    out = model.generate(
        prompt, max_new_tokens=1, do_sample=False, return_dict_in_generate=True, pad_token_id=0
    )
    cache = out.cache
    tokens = cache.get_seq_length()
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    formula = KVLayout(4, kv, 8, s).bytes_per_token(dtype_bytes=4)
    assert tokens == 20
    assert measured == tokens * formula
    for layer in cache.layers[1:]:
        assert layer.values.shape[1] == kv - s and layer.keys.shape[1] == kv


def test_static_cache_generates_the_same_tokens_as_dynamic():
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    prompt = token_ids(batch=2, length=7)
    kwargs = dict(
        max_new_tokens=8, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt)
    )
    dynamic = model.generate(prompt, **kwargs)
    out = model.generate(
        prompt, cache_implementation="static", return_dict_in_generate=True, **kwargs
    )
    assert torch.equal(out.sequences, dynamic)
    values = [layer.values.shape[1] for layer in out.cache.layers]
    assert values == [3, 2, 2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward_and_generate(dtype):
    model = random_skipv1(small_skipv1_config()).to(dtype)
    out = model.generate(
        token_ids(batch=1, length=6),
        max_new_tokens=4,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, 10)
    assert out.cache.layers[1].values.dtype == dtype


@pytest.mark.parametrize("checkpointing", [False, True])
def test_later_layer_loss_trains_layer0_rows_of_the_shared_heads(checkpointing):
    kv, s, d = 4, 2, 8
    model = random_skipv1(small_skipv1_config(kv=kv, s=s, layers=3, head_dim=d))
    model.train()
    if checkpointing:
        model.activation_checkpointing_enable()
    # Freeze layer 0's attention output so its shared-head rows get gradient only via later layers.
    model.model.layers[0].self_attn.o_proj.weight.data.zero_()
    loss = model(token_ids(), labels=token_ids()).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.v_proj.weight.grad
    own_rows, shared_rows = grad[: (kv - s) * d], grad[(kv - s) * d :]
    assert shared_rows.abs().sum() > 0
    assert own_rows.abs().sum() == 0  # only heads n_kv-s.. are read by later layers


def test_rope_scaling_types_run_and_match_llama_at_zero_skip():
    for rope in (
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        },
    ):
        skip = random_skipv1(small_skipv1_config(s=0, rope_parameters=rope))
        llama_cfg = llama_config_of(skip.config)
        llama = LlamaForCausalLM(llama_cfg).eval()
        llama.load_state_dict(skip.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(skip(token_ids()).logits, llama(token_ids()).logits)


def test_save_load_round_trip_and_untied_embeddings(tmp_path):
    model = random_skipv1(small_skipv1_config(tie_word_embeddings=False))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "skipv1_llama" and config["skip_v_heads"] == 2
    assert (
        config["auto_map"]["AutoModelForCausalLM"] == "modeling_skipv1_llama.SkipV1LlamaForCausalLM"
    )
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is SkipV1LlamaForCausalLM
    with torch.no_grad():
        assert torch.equal(loaded(token_ids()).logits, model(token_ids()).logits)


def test_tied_embeddings_stay_tied(tmp_path):
    model = random_skipv1(small_skipv1_config(tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.slow  # a child process
def test_remote_code_loads_without_skipv1_importable(tmp_path):
    model = random_skipv1(small_skipv1_config())
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = model(token_ids()).logits
    assert_loads_without_skipv1(tmp_path, token_ids(), expected, "SkipV1LlamaForCausalLM", tmp_path)


@pytest.mark.parametrize("s", [-1, 4, 5])
def test_config_rejects_skip_out_of_range(s):
    with pytest.raises(
        Exception, match=rf"skip_v_heads={s} is out of range.*num_key_value_heads=4"
    ):
        small_skipv1_config(kv=4, s=s)


def test_weights_disagreeing_with_skip_name_the_numbers(tmp_path):
    random_skipv1(small_skipv1_config(kv=4, s=2)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["skip_v_heads"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has 16 rows but skip_v_heads=1 .* needs .* = 24"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
