"""Continuous batching on SkipV1 checkpoints: `generate_batch`, the paged cache's sizes, the
trust_remote_code copy of the modeling code, and `transformers serve` on loopback."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers
from factories import (
    SHAPES,
    build_tokenizer,
    make_checkpoint,
    random_skipv1,
    skipv1_config_of,
    small_skipv1_config,
    tiny_config,
)
from packaging.version import Version
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import PagedAttentionCache
from transformers.generation.continuous_batching.cache_allocators import (
    FullAttentionCacheAllocator,
    SlidingAttentionCacheAllocator,
)
from transformers.generation.continuous_batching.distributed import DistributedHelper

from skipv1.modeling.layout import kv_layout
from skipv1.modeling.paged_cache_skipv1 import SkipV1CacheAllocator, SkipV1SlidingCacheAllocator
from skipv1.paged_budget import num_blocks_for_bytes

REPO = Path(__file__).resolve().parents[1]
NEW_TOKENS = 12
PROMPTS = [list(range(3, 3 + n)) for n in (5, 2, 11, 7, 17, 3)]


def greedy(model, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def batch_generate(model) -> list[list[int]]:
    """Small pages (4 tokens) and at most 3 requests per batch, so that requests cross page
    boundaries, wait for room and join running batches."""
    config = GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    cb = ContinuousBatchingConfig(
        num_blocks=48, page_size=4, max_batch_tokens=16, max_requests_per_batch=3
    )
    out = model.generate_batch(PROMPTS, generation_config=config, continuous_batching_config=cb)
    by_index = sorted(out.values(), key=lambda r: int(r.request_id.split("_")[-1]))
    return [r.generated_tokens for r in by_index]


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_generate_batch_gives_the_generate_tokens(shape, attn):
    heads, kv = SHAPES[shape]
    model = random_skipv1(small_skipv1_config(heads=heads, kv=kv, s=kv // 2 or 1), attn=attn)
    assert batch_generate(model) == [greedy(model, p) for p in PROMPTS]


def test_generate_with_cache_implementation_paged_gives_the_dynamic_cache_tokens():
    model = random_skipv1(small_skipv1_config(heads=9, kv=3, s=1))
    prompt = torch.tensor([PROMPTS[2]])
    ref = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    paged = model.generate(
        prompt,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="paged",
        # a few blocks: the default sizes the cache from free memory (35 s to allocate here)
        continuous_batching_config=ContinuousBatchingConfig(num_blocks=16, page_size=16),
    )
    # transformers returns one more nesting level on this path, for stock models too
    assert torch.as_tensor(paged).flatten().tolist() == ref[0].tolist()


def paged_cache(config, num_blocks: int, page_size: int = 16) -> PagedAttentionCache:
    return PagedAttentionCache(
        config=config,
        continuous_batching_config=ContinuousBatchingConfig(
            num_blocks=num_blocks, page_size=page_size, max_batch_tokens=64, max_memory_percent=0.9
        ),
        device="cpu",
        distributed_helper=DistributedHelper(device_mesh=None, cpu_group_timeout=60, tp_plan={}),
        dtype=torch.float32,
    )


@pytest.mark.parametrize("heads,kv,s", [(8, 8, 4), (9, 3, 1), (8, 4, 2)])
def test_paged_blocks_hold_exactly_the_skipv1_kv_bytes(heads, kv, s):
    config = small_skipv1_config(heads=heads, kv=kv, s=s, layers=4)
    # the memory of 64 of the source's blocks, as num_blocks of the installed transformers
    source_bytes = kv_layout(config).with_skip(0).bytes_per_token(4)
    budget = 64 * 16 * source_bytes
    cache = paged_cache(config, num_blocks_for_bytes(config, budget, 16, torch.float32))
    (allocator,) = cache.cache_allocators.values()
    assert isinstance(allocator, SkipV1CacheAllocator)
    assert allocator.bytes_per_block == 16 * kv_layout(config).bytes_per_token(4)
    # ... holds proportionally more tokens than the source's 64 blocks
    ratio = source_bytes / kv_layout(config).bytes_per_token(4)
    assert allocator.num_blocks == pytest.approx(64 * ratio, abs=2 + 64 * ratio * 0.02)


def test_a_later_layers_paged_read_holds_its_own_and_layer_0s_borrowed_value_heads():
    """One gather gives the later layer all n_kv value heads (so it attends with one call): its
    own heads as written, then layer 0's last s heads at the same token slots."""
    config = small_skipv1_config(heads=9, kv=3, s=1, layers=3)
    (allocator,) = paged_cache(config, num_blocks=8, page_size=4).cache_allocators.values()
    g = torch.Generator().manual_seed(0)
    write = torch.tensor([5, 6, 12, 13, 14])  # slots in blocks 1 and 3, across a page end
    read = torch.tensor([12, 5, 14, 6])  # some of them, in another order
    keys, values = {}, {}
    for layer in range(3):  # the layers of one forward, in order, as the model calls them
        keys[layer] = torch.randn(5, 3, 8, generator=g)
        values[layer] = torch.randn(5, 3 if layer == 0 else 2, 8, generator=g)
        got_k, got_v = allocator.update(keys[layer], values[layer], layer, read, write)
        at = [write.tolist().index(i) for i in read.tolist()]
        assert torch.equal(got_k, keys[layer][at])
        expected = values[layer][at]
        if layer:
            expected = torch.cat([expected, values[0][at][:, 2:]], dim=1)
        assert torch.equal(got_v, expected)


def test_stock_models_keep_the_stock_allocators():
    config = tiny_config(num_key_value_heads=2)
    (allocator,) = paged_cache(config, num_blocks=8).cache_allocators.values()
    assert type(allocator) is FullAttentionCacheAllocator
    windowed = tiny_config("mistral", num_key_value_heads=2, sliding_window=32)
    (allocator,) = paged_cache(windowed, num_blocks=8).cache_allocators.values()
    assert type(allocator) is SlidingAttentionCacheAllocator


def test_a_mistral_with_its_window_batches_continuously():
    """A converted Mistral keeps `sliding_window` (its context clamped to it): transformers pages
    every layer as a sliding one, which the SkipV1 sliding allocator sizes per layer."""
    config = skipv1_config_of(
        tiny_config("mistral", num_key_value_heads=2, sliding_window=32), skip_v_heads=1
    )
    model = random_skipv1(config)
    (allocator,) = paged_cache(config, num_blocks=8).cache_allocators.values()
    assert type(allocator) is SkipV1SlidingCacheAllocator
    assert batch_generate(model) == [greedy(model, p) for p in PROMPTS]  # 29 tokens at most


@pytest.fixture(scope="module")
def converted_chat_model(tmp_path_factory, cli) -> Path:
    """A converted checkpoint with a tokenizer and a chat template, made by `skipv1 convert`."""
    root = tmp_path_factory.mktemp("cb")
    src = make_checkpoint(
        root / "src", tokenizer_dir=build_tokenizer(root / "tok"), num_key_value_heads=2
    )
    (src / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    dst = root / "skip"
    result = cli.process("convert", src, dst, "--init", "mean", "--quiet", as_module=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return dst


REMOTE_CODE_CHECK = """
import json, sys, torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
assert "skipv1" not in sys.modules, "the check must not import the skipv1 package"
prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
ref = [model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p):].tolist()
       for p in prompts]
config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=0)
out = model.generate_batch(prompts, generation_config=config,
    continuous_batching_config=ContinuousBatchingConfig(num_blocks=32, page_size=4))
got = [r.generated_tokens for r in sorted(out.values(), key=lambda r: int(r.request_id.split("_")[-1]))]
print(json.dumps({"ref": ref, "got": got}))
"""


@pytest.mark.slow
def test_generate_batch_works_through_trust_remote_code(converted_chat_model, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    run = subprocess.run(
        [sys.executable, "-c", REMOTE_CODE_CHECK, str(converted_chat_model)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # the repository root would put the skipv1 package on sys.path
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["got"] == result["ref"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.status == 200
        return json.loads(response.read())


def wait_until_healthy(base: str, server: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("server did not become healthy in time")


@pytest.mark.slow
def test_transformers_serve_answers_a_chat_completion_with_continuous_batching(
    converted_chat_model, tmp_path
):
    serve_one_chat_completion(converted_chat_model, tmp_path)


# how the server says that a request ran with continuous batching: 5.24 logs "[Request
# received] Model: ..., CB: True" for every request; 5.25 logs "Request ...: model ..., N prompt
# tokens, continuous batching, ..." only with --enable-log-requests (an option 5.24 lacks)
REQUEST_LINES_ON_REQUEST = Version(transformers.__version__).release >= (5, 25)


def serve_one_chat_completion(model_dir: Path, tmp_path: Path) -> None:
    """`transformers serve MODEL_DIR --continuous-batching` (remote code) on loopback answers one
    chat completion of 6 tokens; the server is stopped in any case."""
    port = free_port()
    serve = Path(sys.executable).parent / "transformers"
    cmd = [str(serve), "serve", str(model_dir), "--trust-remote-code"]
    cmd += ["--continuous-batching", "--cb-num-blocks", "64", "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--enable-log-requests"] if REQUEST_LINES_ON_REQUEST else []
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, server, time.monotonic() + 180)
        body = {
            "model": str(model_dir),
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 6,
        }
        answer = post_json(f"{base}/v1/chat/completions", body, timeout=120)
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] == 6
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    served = (tmp_path / "serve.log").read_text()
    assert (", continuous batching," if REQUEST_LINES_ON_REQUEST else "CB: True") in served
