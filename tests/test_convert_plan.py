"""The pure parts of `convert`: head groups, initialisations, the plan, shard layout, config."""

import pytest
import torch

from skipv1.convert.config import skipv1_config, sliding_window_active
from skipv1.convert.inits import value_head_groups
from skipv1.convert.inits.keep import init_keep
from skipv1.convert.inits.mean import init_mean
from skipv1.convert.plan import COPY, REWRITE_V, make_plan, shard_file_names, shard_layout
from skipv1.errors import SkipV1Error


def llama_config(**overrides) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 320,
        "max_position_embeddings": 256,
    }
    return config | overrides


@pytest.mark.parametrize(
    ("n_kv", "s", "groups"),
    [
        (32, 16, tuple((2 * j, 2 * j + 1) for j in range(16))),
        (3, 1, ((0, 1), (2,))),
        (5, 2, ((0, 1), (2, 3), (4,))),
        (8, 5, ((0, 1, 2), (3, 4, 5), (6, 7))),
        (4, 0, ((0,), (1,), (2,), (3,))),
        (4, 3, ((0, 1, 2, 3),)),
    ],
)
def test_value_head_groups_are_contiguous_even_and_larger_first(n_kv, s, groups):
    assert value_head_groups(n_kv, s) == groups


def test_mean_init_averages_each_group_of_heads_for_weight_and_bias():
    head_dim, hidden = 2, 3
    weight = torch.arange(3 * head_dim * hidden, dtype=torch.float32).reshape(3 * head_dim, hidden)
    heads = weight.reshape(3, head_dim, hidden)
    expected = torch.cat([(heads[0] + heads[1]) / 2, heads[2]])
    assert torch.equal(init_mean(weight, 3, 1), expected)
    bias = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    assert torch.equal(init_mean(bias, 3, 1), torch.tensor([2.0, 3.0, 10.0, 20.0]))


def test_mean_init_keeps_dtype_and_rounds_once_from_float32():
    weight = torch.randn(8, 5).to(torch.bfloat16)
    out = init_mean(weight, 4, 2)
    heads = weight.float().reshape(4, 2, 5)
    expected = torch.stack([heads[0:2].mean(0), heads[2:4].mean(0)]).reshape(4, 5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.to(torch.bfloat16))


def test_keep_init_keeps_the_first_heads():
    weight = torch.randn(12, 5)
    assert torch.equal(init_keep(weight, 4, 1), weight[:9])
    assert torch.equal(init_keep(torch.arange(12.0), 4, 3), torch.arange(3.0))


def test_reconstruct_plan_rewrites_attention_and_down_proj_of_later_layers_only():
    plan = make_plan(llama_config(), skip_heads=1)  # the default init
    assert plan.init == "reconstruct"
    rewritten = {t.name for t in plan.changed()}
    expected = {
        f"model.layers.{i}.{name}.weight"
        for i in (1, 2)
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.down_proj",
        )
    }
    assert rewritten == expected
    assert plan.tasks["model.layers.1.self_attn.v_proj.weight"].target_shape == (48, 64)


def test_plan_rewrites_only_v_proj_of_later_layers():
    plan = make_plan(llama_config(), skip_heads=1, init="mean")
    rewritten = {t.name: t.target_shape for t in plan.changed()}
    assert rewritten == {
        "model.layers.1.self_attn.v_proj.weight": (48, 64),
        "model.layers.2.self_attn.v_proj.weight": (48, 64),
    }
    assert plan.tasks["model.layers.0.self_attn.v_proj.weight"].action == COPY
    assert plan.tasks["model.layers.1.self_attn.k_proj.weight"].target_shape == (64, 64)
    assert "lm_head.weight" in plan.tasks and not plan.source.optional_tensors()


def test_plan_default_skips_half_the_kv_heads_and_zero_copies_everything():
    assert make_plan(llama_config(num_key_value_heads=2)).skip_heads == 1
    assert make_plan(llama_config()).skip_heads == 2
    assert not make_plan(llama_config(), skip_heads=0).changed()


def test_plan_for_qwen2_has_qkv_biases_and_no_o_bias():
    config = llama_config(architectures=["Qwen2ForCausalLM"], num_key_value_heads=2)
    tasks = make_plan(config).tasks
    assert tasks["model.layers.2.self_attn.v_proj.bias"].action == REWRITE_V
    assert tasks["model.layers.2.self_attn.v_proj.bias"].target_shape == (16,)
    assert "model.layers.0.self_attn.q_proj.bias" in tasks
    assert "model.layers.0.self_attn.o_proj.bias" not in tasks


def test_plan_for_tied_embeddings_makes_lm_head_optional():
    plan = make_plan(llama_config(tie_word_embeddings=True))
    assert plan.source.optional_tensors() == {"lm_head.weight"}


@pytest.mark.parametrize("s", [-1, 4, 7])
def test_plan_rejects_skip_heads_out_of_range(s):
    with pytest.raises(SkipV1Error, match=r"--skip-heads .* out of range.*0 <= N <= 3"):
        make_plan(llama_config(), skip_heads=s)


def test_shard_layout_fills_greedily_and_isolates_oversized_tensors():
    sizes = [("a", 4), ("b", 4), ("c", 3), ("d", 20), ("e", 1)]
    assert shard_layout(sizes, 10) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert shard_layout(sizes, 100) == [["a", "b", "c", "d", "e"]]
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(2) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_config_carries_source_fields_and_adds_skipv1_fields():
    source = llama_config(rope_theta=5e5, torch_dtype="bfloat16")
    out, changes = skipv1_config(source, make_plan(source, skip_heads=1), dtype="float16")
    assert out["model_type"] == "skipv1_llama"
    assert out["architectures"] == ["SkipV1LlamaForCausalLM"]
    assert out["skip_v_heads"] == 1 and out["rope_theta"] == 5e5
    assert out["auto_map"]["AutoModelForCausalLM"] == "modeling_skipv1_llama.SkipV1LlamaForCausalLM"
    assert out["dtype"] == "float16" and "torch_dtype" not in out
    assert {c.field for c in changes} >= {"model_type", "skip_v_heads", "dtype", "torch_dtype"}


def test_config_for_qwen2_sets_biases_and_drops_sliding_window_fields():
    source = llama_config(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        sliding_window=4096,
        use_sliding_window=False,
        max_window_layers=28,
        layer_types=["full_attention"] * 3,
    )
    out, changes = skipv1_config(source, make_plan(source), dtype=None)
    assert out["attention_bias"] is True and out["o_proj_bias"] is False
    assert out["sliding_window"] is None and out["max_position_embeddings"] == 256
    for key in ("use_sliding_window", "max_window_layers", "layer_types"):
        assert key not in out
    assert {c.field for c in changes if c.dropped} == {
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
    }


@pytest.mark.parametrize(
    ("overrides", "active"),
    [
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 128}, True),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 256}, False),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": None}, False),
        ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 128}, False),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 128,
                "use_sliding_window": True,
                "max_window_layers": 1,
            },
            True,
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 128,
                "use_sliding_window": True,
                "layer_types": ["full_attention"] * 3,
            },
            False,
        ),
        (  # no max_window_layers: transformers' default 28, beyond these layers: none slides
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 128,
                "use_sliding_window": True,
            },
            False,
        ),
    ],
)
def test_sliding_window_is_active_only_when_some_layer_uses_a_short_window(overrides, active):
    assert sliding_window_active(llama_config(**overrides)) is active


@pytest.mark.parametrize(
    ("overrides", "types"),
    [
        ({"architectures": ["MistralForCausalLM"]}, ["sliding_attention"] * 3),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "max_window_layers": 1,
            },
            ["full_attention"] + ["sliding_attention"] * 2,
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            },
            ["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ],
)
def test_active_sliding_window_of_mistral_and_qwen2_is_kept_per_layer(overrides, types):
    source = llama_config(sliding_window=128, **overrides)
    out, changes = skipv1_config(source, make_plan(source), dtype=None)
    assert out["max_position_embeddings"] == 256 and out["sliding_window"] == 128
    assert out["layer_types"] == types
    for key in ("use_sliding_window", "max_window_layers"):
        assert out.get(key) == source.get(key)  # the source's own fields stay
    assert "max_position_embeddings" not in {c.field for c in changes}


@pytest.mark.parametrize(
    "fields",
    [
        {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 128,
        },
        # Phi-3-mini-4k-instruct's window of 2047 in a context of 4096 (every layer slides)
        {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "sliding_window": 2047,
            "max_position_embeddings": 4096,
        },
    ],
    ids=["mixtral", "phi3"],
)
def test_active_sliding_window_of_mixtral_and_phi3_is_kept(fields):
    source = llama_config(**fields)
    window, context = source["sliding_window"], source["max_position_embeddings"]
    assert sliding_window_active(source)
    out, changes = skipv1_config(source, make_plan(source), dtype=None)
    assert out["max_position_embeddings"] == context and out["sliding_window"] == window
    assert not {"max_position_embeddings", "sliding_window"} & {c.field for c in changes}


def test_a_stray_sliding_window_of_a_llama_source_is_dropped():
    source = llama_config(sliding_window=128)  # transformers' Llama has no windows
    assert not sliding_window_active(source)
    out, _ = skipv1_config(source, make_plan(source), dtype=None)
    assert out["sliding_window"] is None and "layer_types" not in out
