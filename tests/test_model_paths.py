"""The calling conventions and generation paths transformers users reach, on SkipV1 models:
signature, `past_key_values=`, the config's gradient-checkpointing flag, beam search, assisted
decoding and left padding (each against the uncached forward or stock behaviour)."""

import inspect

import pytest
import torch
from factories import (
    SHAPES,
    assert_beam_scores_are_the_uncached_model_s,
    exported_greedy,
    random_skipv1,
    small_skipv1_config,
    token_ids,
)
from transformers import DynamicCache, StaticCache

from skipv1 import SkipV1LlamaForCausalLM
from skipv1.modeling.layout import KVLayout
from skipv1.modeling.modeling_skipv1_llama import SkipV1LlamaModel


def test_base_model_forward_has_an_explicit_signature_and_takes_positional_ids():
    params = list(inspect.signature(SkipV1LlamaModel.forward).parameters)
    assert params[:3] == ["self", "input_ids", "attention_mask"]
    assert "inputs_embeds" in params and "cache" in params
    model = random_skipv1(small_skipv1_config())
    x = token_ids()
    with torch.no_grad():
        by_position = model.model(x).last_hidden_state
        by_name = model.model(input_ids=x).last_hidden_state
        embeds = model.model(inputs_embeds=model.model.embed_tokens(x)).last_hidden_state
    assert torch.equal(by_position, by_name)
    torch.testing.assert_close(embeds, by_name, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["past_key_values", "cache"])
def test_base_model_uses_a_cache_passed_under_either_name(name):
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    x = token_ids(length=10)
    with torch.no_grad():
        full = model.model(x).last_hidden_state
        cache = DynamicCache(config=model.config)
        model.model(x[:, :6], use_cache=True, **{name: cache})
        assert cache.get_seq_length() == 6
        tail = model.model(x[:, 6:], use_cache=True, **{name: cache}).last_hidden_state
    assert cache.get_seq_length() == 10
    torch.testing.assert_close(tail, full[:, 6:], rtol=0, atol=1e-5)


def test_config_gradient_checkpointing_flag_reaches_the_skipv1_layers():
    config = small_skipv1_config()
    config.gradient_checkpointing = True
    model = SkipV1LlamaForCausalLM(config)
    assert model.is_activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    model.train()
    x = token_ids()
    model(input_ids=x, labels=x).loss.backward()
    assert model.model.layers[0].self_attn.v_proj.weight.grad is not None


@pytest.mark.parametrize("shape", SHAPES)
def test_beam_search_scores_are_the_uncached_model_s(shape):
    heads, kv = SHAPES[shape]
    model = random_skipv1(small_skipv1_config(heads=heads, kv=kv, s=kv // 2 or 1))
    assert_beam_scores_are_the_uncached_model_s(model, token_ids(batch=1, length=6))


@pytest.mark.slow
def test_assisted_decoding_gives_the_greedy_tokens():
    model = random_skipv1(small_skipv1_config(heads=8, kv=4, s=2, layers=4))
    assistant = random_skipv1(small_skipv1_config(heads=8, kv=4, s=2, layers=2), seed=3)
    prompt = token_ids(batch=1, length=8)
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    greedy = model.generate(prompt, **kwargs)
    assisted = model.generate(prompt, assistant_model=assistant, **kwargs)
    assert torch.equal(assisted, greedy)


@pytest.mark.slow
def test_left_padded_batch_matches_each_prompt_alone():
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    short, long = token_ids(batch=1, length=5, seed=2), token_ids(batch=1, length=9, seed=3)
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(batch)
    mask[0, :4] = 0
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    together = model.generate(batch, attention_mask=mask, **kwargs)
    alone = [model.generate(p, **kwargs)[0, p.shape[1] :] for p in (short, long)]
    assert torch.equal(together[0, 9:], alone[0])
    assert torch.equal(together[1, 9:], alone[1])


@pytest.mark.slow
def test_chunked_prefill_with_a_static_cache_gives_the_dynamic_cache_tokens():
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    prompt = token_ids(batch=2, length=11)
    kwargs = dict(
        max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt)
    )
    dynamic = model.generate(prompt, **kwargs)
    out = model.generate(
        prompt,
        cache_implementation="static",
        prefill_chunk_size=4,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert torch.equal(out.sequences, dynamic)
    assert [layer.values.shape[1] for layer in out.cache.layers] == [3, 2, 2]


@pytest.mark.slow
def test_fullgraph_compiled_static_cache_decode_matches_eager():
    assert SkipV1LlamaForCausalLM._can_compile_fullgraph
    model = random_skipv1(small_skipv1_config(heads=8, kv=4, s=2))
    x = token_ids(batch=1, length=9)
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        full = model(x).logits
        model(x[:, :8], cache=cache, use_cache=True)  # eager prefill prepares the cache
        step = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        out = step(x[:, 8:], cache=cache, use_cache=True, position_ids=torch.tensor([[8]]))
    torch.testing.assert_close(out.logits[:, -1], full[:, -1], rtol=0, atol=1e-5)


def test_eager_attention_weights_cover_every_query_head():
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1), attn="eager")
    with torch.no_grad():
        out = model(token_ids(length=7), output_attentions=True)
    for weights in out.attentions:
        assert weights.shape == (2, 9, 7, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 9, 7))


def _export_ready_skipv1():
    from transformers import GenerationConfig

    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 32},
    )
    return model


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["transformers", "skipv1", "skipv1 recipe"])
def test_executorch_export_with_a_static_cache_gives_the_generate_tokens(exporter):
    """transformers' convert_and_export_with_cache, skipv1's, and the recipe optimum-executorch
    exports (`SkipV1ExportableModuleForDecoderOnlyLM.export`)."""
    from transformers.integrations import executorch as stock

    from skipv1 import executorch as ours

    model = _export_ready_skipv1()
    prompt = [3, 9, 4, 7, 1]
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0].tolist()
    if exporter == "skipv1 recipe":
        recipe = ours.SkipV1ExportableModuleForDecoderOnlyLM(model)
        exported = recipe.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0]))
    else:
        exported = (stock if exporter == "transformers" else ours).convert_and_export_with_cache(
            model
        )
    assert prompt + exported_greedy(exported, prompt, 6) == ref
    if exporter != "transformers":  # the program's own buffers hold the SkipV1 bytes per token
        cache = [b for n, b in exported.named_buffers() if n.startswith(("key_", "value_"))]
        per_token = sum(b.numel() * b.element_size() for b in cache) // 32
        layout = KVLayout(num_layers=3, num_kv_heads=3, head_dim=8, skip_v_heads=1)
        assert per_token == layout.bytes_per_token(dtype_bytes=4)


@pytest.mark.parametrize("recipe", ["WithStaticCache", "ForDecoderOnlyLM"])
def test_skipv1_exported_program_stores_only_each_later_layer_s_own_value_heads(recipe):
    from skipv1 import executorch

    model = _export_ready_skipv1()
    wrapper = getattr(executorch, f"SkipV1ExportableModule{recipe}")(model)
    if recipe == "ForDecoderOnlyLM":  # optimum-executorch's recipe: the static one inside
        wrapper = wrapper.model
    buffers = dict(wrapper.named_buffers())
    heads = [buffers[f"value_cache_{i}"].shape[1] for i in range(model.config.num_hidden_layers)]
    assert heads == [3, 2, 2]  # layer 0 all n_kv = 3, later layers n_kv - s = 2
    assert all(buffers[f"key_cache_{i}"].shape[1] == 3 for i in range(3))
    # the registered buffers are the cache the model writes into
    assert buffers["value_cache_1"] is wrapper.static_cache.layers[1].values


def test_skipv1_export_wrapper_refuses_a_stock_model_with_a_pointer_to_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM

    from skipv1.executorch import (
        SkipV1ExportableModuleForDecoderOnlyLM,
        SkipV1ExportableModuleWithStaticCache,
    )

    stock = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    with pytest.raises(ValueError, match="TorchExportableModuleWithStaticCache"):
        SkipV1ExportableModuleWithStaticCache(stock)
    with pytest.raises(ValueError, match="TorchExportableModuleForDecoderOnlyLM"):
        SkipV1ExportableModuleForDecoderOnlyLM(stock)


@pytest.mark.parametrize("heads, kv, s", [(4, 4, 2), (9, 3, 1)], ids=["mha", "gqa"])
def test_sdpa_decode_of_a_padded_batch_matches_the_uncached_forward(heads, kv, s):
    """Token steps under a padding mask (the decode attention's masked path) == the uncached
    forward with the same mask, at every real position."""
    model = random_skipv1(small_skipv1_config(heads=heads, kv=kv, s=s))
    x = token_ids(batch=2, length=10)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    with torch.no_grad():
        full = model(x, attention_mask=mask).logits
        cache = DynamicCache(config=model.config)
        steps = [model(x[:, :6], attention_mask=mask[:, :6], cache=cache, use_cache=True).logits]
        for t in range(6, 10):
            step = model(
                x[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache, use_cache=True
            )
            steps.append(step.logits)
    cached = torch.cat(steps, dim=1)
    torch.testing.assert_close(cached[1], full[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(cached[0, 3:], full[0, 3:], atol=1e-5, rtol=0)
