"""The serving paths on every family besides Llama's (tests/factories.py SKIPV1_FAMILIES), as a
user reaches them with a tiny random SkipV1 model (s > 0, grouped KV heads where the family has
them): continuous batching (`generate_batch`) gives `generate`'s greedy tokens, the paged cache's
blocks hold the KV formula's bytes, a static cache (with chunked prefill) and a fullgraph-compiled
static decode step agree with the dynamic cache, beam search scores are the uncached model's, and
a left-padded batch gives each prompt's own tokens. Gemma (a window of 4 tokens, sliding layer 0
before global layers): continuous batching past the window too, its static-cache refusal in
tests/test_gemma.py. Tensor parallelism: tests/test_tensor_parallel.py. The Llama family's own
tests: test_continuous_batching.py and test_model_paths.py."""

import pytest
import torch
from factories import (
    SKIPV1_FAMILIES,
    assert_beam_scores_are_the_uncached_model_s,
    exported_greedy,
    random_family_skipv1,
)
from transformers import GenerationConfig, StaticCache
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import PagedAttentionCache
from transformers.generation.continuous_batching.distributed import DistributedHelper

from skipv1.modeling.layout import kv_layout
from skipv1.modeling.paged_cache_skipv1 import (
    SkipV1CacheAllocator,
    SkipV1SlidingCacheAllocator,
)

# Gemma's layer 0 is a sliding-window layer: no static cache with s > 0
WINDOWED = ("gemma2", "gemma3_text")
STATIC = tuple(f for f in SKIPV1_FAMILIES if f not in WINDOWED)
NEW_TOKENS = 6
PROMPTS = [list(range(3, 3 + n)) for n in (5, 2, 11, 7)]
GREEDY = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


@pytest.fixture(scope="module", params=SKIPV1_FAMILIES)
def any_family(request):
    return request.param, random_family_skipv1(request.param)


@pytest.fixture(scope="module", params=STATIC)
def static_family(request):
    return request.param, random_family_skipv1(request.param)


def greedy(model, prompt: list[int]) -> list[int]:
    return model.generate(torch.tensor([prompt]), **GREEDY)[0, len(prompt) :].tolist()


def batch_generate(model) -> list[list[int]]:
    """Pages of 4 tokens and at most 2 requests a batch: requests cross pages and wait."""
    config = GenerationConfig(**GREEDY, eos_token_id=-1)
    cb = ContinuousBatchingConfig(
        num_blocks=32, page_size=4, max_batch_tokens=16, max_requests_per_batch=2
    )
    out = model.generate_batch(PROMPTS, generation_config=config, continuous_batching_config=cb)
    by_index = sorted(out.values(), key=lambda r: int(r.request_id.split("_")[-1]))
    return [r.generated_tokens for r in by_index]


def test_generate_batch_gives_the_generate_tokens(any_family):
    """Gemma's windows of 4 tokens slide (prompts of up to 11 tokens, 6 more generated)."""
    _, model = any_family
    assert batch_generate(model) == [greedy(model, p) for p in PROMPTS]


def test_generate_batch_with_a_full_layer_0_before_sliding_layers():
    """Qwen2's pattern (`max_window_layers`), here on Gemma 3: the sliding layers' pages keep
    their own copy of layer 0's borrowed heads (sequences are packed, so layer 0's values cannot
    be sliced to a sliding layer's window)."""
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model = random_family_skipv1("gemma3_text", num_hidden_layers=4, layer_types=types)
    assert batch_generate(model) == [greedy(model, p) for p in PROMPTS]


def test_paged_blocks_hold_exactly_the_skipv1_kv_bytes(any_family):
    """A block of each attention type (Gemma: sliding and global layers) holds 16 tokens of its
    layers; together they hold the formula's bytes, Gemma's `+ s` (layer 0's borrowed heads of
    every token, kept with the global layers) included."""
    _, model = any_family
    cache = PagedAttentionCache(
        config=model.config,
        continuous_batching_config=ContinuousBatchingConfig(
            num_blocks=32, page_size=16, max_batch_tokens=64, max_memory_percent=0.9
        ),
        device="cpu",
        distributed_helper=DistributedHelper(device_mesh=None, cpu_group_timeout=60, tp_plan={}),
        dtype=torch.float32,
    )
    allocators = list(cache.cache_allocators.values())
    kinds = (SkipV1CacheAllocator, SkipV1SlidingCacheAllocator)
    assert all(isinstance(a, kinds) for a in allocators)
    layout = kv_layout(model.config)
    assert layout.skip_v_heads > 0
    assert sum(a.bytes_per_block for a in allocators) == 16 * layout.bytes_per_token(4)


def test_static_cache_and_chunked_prefill_give_the_dynamic_cache_tokens(static_family):
    _, model = static_family
    prompt = torch.tensor([PROMPTS[2], PROMPTS[2][::-1]])
    kwargs = dict(GREEDY, attention_mask=torch.ones_like(prompt))
    dynamic = model.generate(prompt, **kwargs)
    static = model.generate(prompt, cache_implementation="static", **kwargs)
    chunked = model.generate(
        prompt,
        cache_implementation="static",
        prefill_chunk_size=4,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert torch.equal(static, dynamic) and torch.equal(chunked.sequences, dynamic)
    config = model.config
    heads = [layer.values.shape[1] for layer in chunked.cache.layers]
    assert heads == [config.own_value_heads(i) for i in range(config.num_hidden_layers)]
    assert heads[1] < heads[0]  # later layers store only their own value heads


@pytest.mark.slow
def test_fullgraph_compiled_static_cache_decode_matches_eager(static_family):
    _, model = static_family
    assert type(model)._can_compile_fullgraph
    x = torch.tensor([PROMPTS[2][:9]])
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        full = model(x).logits
        model(x[:, :8], cache=cache, use_cache=True)  # eager prefill prepares the cache
        step = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        out = step(x[:, 8:], cache=cache, use_cache=True, position_ids=torch.tensor([[8]]))
    torch._dynamo.reset()  # each family compiles its own graph
    torch.testing.assert_close(out.logits[:, -1], full[:, -1], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_exported_static_cache_program_gives_the_generate_tokens_and_keeps_the_saving(
    static_family,
):
    from skipv1.executorch import convert_and_export_with_cache

    arch, _ = static_family
    model = random_family_skipv1(arch)  # its own: the generation config is the export's
    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 24},
        pad_token_id=0,
    )
    prompt = PROMPTS[2]
    exported = convert_and_export_with_cache(model)
    torch._dynamo.reset()
    assert exported_greedy(exported, prompt, NEW_TOKENS) == greedy(model, prompt)
    config = model.config
    buffers = dict(exported.named_buffers())
    heads = [buffers[f"value_cache_{i}"].shape[1] for i in range(config.num_hidden_layers)]
    assert heads == [config.own_value_heads(i) for i in range(config.num_hidden_layers)]


def test_beam_search_scores_are_the_uncached_model_s(any_family):
    _, model = any_family
    assert_beam_scores_are_the_uncached_model_s(model, torch.tensor([PROMPTS[2]]))


def test_left_padded_batch_matches_each_prompt_alone(any_family):
    _, model = any_family
    short, long = torch.tensor([PROMPTS[0]]), torch.tensor([PROMPTS[2]])
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    together = model.generate(batch, attention_mask=mask, **GREEDY)[:, long.shape[1] :]
    assert together.tolist() == [greedy(model, PROMPTS[0]), greedy(model, PROMPTS[2])]


def test_transformers_serve_finds_every_family_s_class_by_its_architecture(any_family):
    """`transformers serve` resolves `architectures[0]` as an attribute of `transformers`."""
    import transformers

    _, model = any_family
    (architecture,) = model.config.architectures or [type(model).__name__]
    assert getattr(transformers, architecture) is type(model)


@pytest.mark.slow
def test_transformers_serve_answers_a_gemma_chat_completion_with_continuous_batching(
    tmp_path, tokenizer_dir
):
    """End to end on loopback with the modeling code that travels with the weights: Gemma 3's
    sliding layer 0 and its borrowed-value store in the paged cache (Llama's: in
    test_continuous_batching.py)."""
    from test_continuous_batching import serve_one_chat_completion

    model = random_family_skipv1("gemma3_text")
    model.save_pretrained(tmp_path / "model")
    for file in tokenizer_dir.iterdir():
        (tmp_path / "model" / file.name).write_bytes(file.read_bytes())
    (tmp_path / "model" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    serve_one_chat_completion(tmp_path / "model", tmp_path)
