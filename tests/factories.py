"""Small real models and checkpoints for the tests: random Llama / Mistral / Qwen2 / Qwen3 models
saved by transformers, random SkipV1 models, a tiny byte-level BPE tokenizer, a tiny corpus, and
the path of the `skipv1` console script for tests that run it in a child process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
    "gpt_neox": (GPTNeoXConfig, GPTNeoXForCausalLM),
    "gpt2": (GPT2Config, GPT2LMHeadModel),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM),
}
# Tiny mixtures of experts: 4 experts, 2 per token (tests/test_families_olmo2_moe.py).
MOE_FIELDS = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
}
EOS = "<|endoftext|>"
# The console script of this environment, for tests that need a real child process (exit codes,
# signals, ranks); tests that only read the CLI's output use the `cli` fixture (conftest.py).
SKIPV1 = str(Path(sys.executable).parent / "skipv1")
# Fields a saved config carries that are not arguments of another config class.
NOT_FIELDS = ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype")


def build_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE tokenizer trained on CPython's embedded docs (deterministic, < 1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from skipv1.textdata import embedded_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(embedded_documents("train")[:40], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS
    )
    fast.save_pretrained(path)
    return Path(path)


def tiny_config(arch: str = "llama", **overrides):
    config_cls, _ = ARCHS[arch]
    fields = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=320,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    if arch in ("mistral", "qwen2"):
        fields["sliding_window"] = None
    if arch in ("qwen3", "gemma2", "gemma3_text"):
        fields["head_dim"] = 16  # Qwen3Config's default is 128, Gemma's 256
    if arch in ("gpt_neox", "gpt2"):
        del fields["num_key_value_heads"]  # multi-head only
    if arch == "gpt2":
        fields["n_inner"] = fields.pop("intermediate_size")
    fields.update(MOE_FIELDS.get(arch, {}))
    fields.update(overrides)
    return config_cls(**fields)


def skipv1_config_of(config, skip_v_heads: int):
    """The SkipV1 config with every field of `config` (a config object or its dict)."""
    from skipv1 import SkipV1LlamaConfig

    fields = config if isinstance(config, dict) else config.to_dict()
    fields = {k: v for k, v in fields.items() if k not in NOT_FIELDS}
    return SkipV1LlamaConfig(**fields, skip_v_heads=skip_v_heads)


def llama_config_of(skip_config) -> LlamaConfig:
    """The stock Llama config with every field of a SkipV1 config but the SkipV1 ones."""
    drop = ("skip_v_heads", "o_proj_bias", "model_type")
    return LlamaConfig(**{k: v for k, v in skip_config.to_dict().items() if k not in drop})


# (attention heads, KV heads) of the model tests' shapes: multi-head, grouped, an odd head count
SHAPES = {"mha": (8, 8), "gqa": (8, 4), "odd": (9, 3)}


def small_skipv1_config(heads=8, kv=4, s=2, layers=3, head_dim=8, **extra):
    """A SkipV1 config of the model tests' shape (vocab 97); `extra` are further fields."""
    from skipv1 import SkipV1LlamaConfig

    return SkipV1LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        num_hidden_layers=layers,
        intermediate_size=96,
        vocab_size=97,
        max_position_embeddings=128,
        skip_v_heads=s,
        **extra,
    )


def random_skipv1(config, seed: int = 0, attn: str = "sdpa"):
    """A SkipV1 model in eval mode with seeded random weights and non-zero biases (so that bias
    handling is exercised)."""
    from skipv1 import SkipV1LlamaForCausalLM

    torch.manual_seed(seed)
    config._attn_implementation = attn
    model = SkipV1LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def token_ids(batch: int = 2, length: int = 16, seed: int = 1, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def make_skipv1_checkpoint(
    path: Path,
    skip_v_heads: int = 2,
    config=None,
    tokenizer_dir: Path | None = None,
    seed: int = 0,
):
    """Saves a random SkipV1 model with the fields of `config` (default: tiny_config()) and
    returns the model; `tokenizer_dir`'s files are copied next to it."""
    from skipv1 import SkipV1LlamaForCausalLM

    skip_config = skipv1_config_of(tiny_config() if config is None else config, skip_v_heads)
    torch.manual_seed(seed)
    model = SkipV1LlamaForCausalLM(skip_config)
    model.save_pretrained(path)
    if tokenizer_dir is not None:
        for file in Path(tokenizer_dir).iterdir():
            shutil.copy(file, Path(path) / file.name)
    return model


def make_checkpoint(
    path: Path,
    arch: str = "llama",
    shards: int = 1,
    fmt: str = "safetensors",
    tokenizer_dir: Path | None = None,
    seed: int = 0,
    **overrides,
) -> Path:
    """Saves a random model; `shards` > 1 splits it; fmt='bin' writes PyTorch .bin shards."""
    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    model = ARCHS[arch][1](config).eval()
    path = Path(path)
    if fmt == "safetensors":
        total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        model.save_pretrained(
            path, max_shard_size=max(total // shards + 1, 1024) if shards > 1 else "50GB"
        )
    else:
        _save_bin(model, path, shards)
    if tokenizer_dir is not None:
        for file in Path(tokenizer_dir).iterdir():
            (path / file.name).write_bytes(file.read_bytes())
    return path


def _save_bin(model, path: Path, shards: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # Real .bin checkpoints name their class, as model.save_pretrained would.
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(path)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        file = (
            f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin" if shards > 1 else "pytorch_model.bin"
        )
        torch.save({k: state[k] for k in part}, path / file)
        weight_map.update({k: file for k in part})
    if shards > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))


def write_corpus(root: Path, train: int = 60, validation: int = 8) -> Path:
    """train.jsonl / eval.jsonl from the embedded documents, under root/corpus."""
    from skipv1.textdata import embedded_documents

    corpus = Path(root) / "corpus"
    corpus.mkdir()
    for name, docs in (
        ("train", embedded_documents("train")[:train]),
        ("eval", embedded_documents("validation")[:validation]),
    ):
        (corpus / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return corpus


def assert_loads_without_skipv1(
    model_dir: Path, ids, expected, class_name: str, work: Path
) -> None:
    """In a child process where `import skipv1` fails, `trust_remote_code=True` loads the model
    saved in `model_dir` from its own modeling files and gives `expected` logits for `ids`."""
    assert_all_load_without_skipv1([(model_dir, ids, expected, class_name)], work)


def assert_all_load_without_skipv1(cases, work: Path) -> None:
    """`assert_loads_without_skipv1` for several (model_dir, ids, expected, class_name) in one
    child process (its start-up, importing torch and transformers, is most of the time)."""
    keys = ("dir", "ids", "expected", "class")
    torch.save(
        [dict(zip(keys, (str(c[0]), *c[1:]), strict=True)) for c in cases], work / "expected.pt"
    )
    script = f"""
import sys
sys.modules["skipv1"] = None  # any `import skipv1` now fails
import torch
from transformers import AutoModelForCausalLM
for case in torch.load({str(work / "expected.pt")!r}):
    m = AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True).eval()
    assert type(m).__module__.startswith("transformers_modules"), type(m).__module__
    assert type(m).__name__ == case["class"], type(m).__name__
    with torch.no_grad():
        torch.testing.assert_close(m(case["ids"]).logits, case["expected"])
    print("OK", case["class"])
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("OK") == len(cases), run.stdout


def assert_cache_paths_agree(model, x, prompt, prefill: int = 5, atol: float = 1e-5) -> None:
    """The uncached forward of `x` == a DynamicCache prefill of `prefill` tokens then one token
    at a time; greedy `generate` from `prompt` == greedy decoding with no cache at all."""
    from transformers import DynamicCache

    with torch.no_grad():
        full = model(x).logits
        cache = DynamicCache(config=model.config)
        first = model(x[:, :prefill], cache=cache, use_cache=True).logits
        steps = [
            model(x[:, t : t + 1], cache=cache, use_cache=True).logits
            for t in range(prefill, x.shape[1])
        ]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=atol, rtol=0)
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    tokens = prompt
    with torch.no_grad():
        for _ in range(6):
            nxt = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    assert torch.equal(generated, tokens)


CACHES = ("dynamic", "static")


def assert_windowed_static_cache_agrees(model, vocab: int, length: int = 14) -> None:
    """A StaticCache on a windowed model: a prefill within the window and one past it, then one
    token at a time, == the uncached forward; greedy generate with the static cache, and with
    chunked prefill, and beam search == with the dynamic cache; later layers' value buffers hold their own heads,
    and a sliding layer 0 that full layers borrow from keeps its borrowed heads for every
    position."""
    from transformers import StaticCache

    config = model.config
    x = token_ids(length=length, vocab=vocab)
    with torch.no_grad():
        full = model(x).logits
        for prefill in (2, 9):
            cache = StaticCache(config=config, max_cache_len=length + 2)
            first = model(x[:, :prefill], cache=cache, use_cache=True).logits
            steps = [
                model(x[:, t : t + 1], cache=cache, use_cache=True).logits
                for t in range(prefill, length)
            ]
            got = torch.cat([first, *steps], dim=1)
            torch.testing.assert_close(got, full, atol=1e-4, rtol=0)
    heads = [layer.values.shape[1] for layer in cache.layers]
    assert heads == [config.own_value_heads(i) for i in range(config.num_hidden_layers)]
    store = getattr(cache.layers[0], "borrowed_values", None)
    if config.keeps_borrowed_values():
        assert store.shape == (2, config.skip_v_heads, length + 2, config.head_dim)
    else:
        assert store is None
    prompt = x[:, :9]
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    kwargs["attention_mask"] = torch.ones_like(prompt)
    dynamic = model.generate(prompt, cache_implementation="dynamic", **kwargs)
    for chunks in ({}, {"prefill_chunk_size": 2}):
        static = model.generate(prompt, cache_implementation="static", **chunks, **kwargs)
        assert torch.equal(static, dynamic)
    beams = [model.generate(prompt, num_beams=3, cache_implementation=c, **kwargs) for c in CACHES]
    assert torch.equal(*beams)  # the static layers (and layer 0's store) follow the beams


def generated_cache_bytes(model, prompt) -> tuple[int, object]:
    """(bytes of keys and values, the cache) after `generate` of one token from `prompt`."""
    out = model.generate(
        prompt, max_new_tokens=1, do_sample=False, return_dict_in_generate=True, pad_token_id=0
    )
    cache = out.cache
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers), cache


# The families other than Llama's, as `random_family_skipv1` builds them (tests/test_family_serving.py)
SKIPV1_FAMILIES = (
    "qwen3",
    "phi3",
    "olmo2",
    "mixtral",
    "qwen3_moe",
    "gpt_neox",
    "gpt2",
    "gemma2",
    "gemma3_text",
)


def random_family_skipv1(arch: str, skip_v_heads: int | None = None, seed: int = 0, **overrides):
    """A random SkipV1 model (eval mode) of `arch`'s family with the fields of `tiny_config(arch)`:
    grouped KV heads (4 query heads over 2) where the family has them, s = 1 of 2 KV heads
    (s = 2 of 4 heads for the multi-head-only GPT-2 and GPT-NeoX); Gemma: a window of 4 tokens
    and sliding layer 0 before a global layer 1, eager attention for Gemma 2 (transformers has no
    SDPA for its soft-capping); SDPA otherwise."""
    from skipv1.families import family_of
    from skipv1.modeling import FAMILY_CLASSES

    mha_only = arch in ("gpt_neox", "gpt2")
    fields = {} if mha_only else {"num_key_value_heads": 2}
    if arch.startswith("gemma"):
        fields["sliding_window"] = 4
    if arch == "gemma3_text":
        fields["sliding_window_pattern"] = 2  # sliding, global, sliding (default: 5 sliding, 1)
    fields |= overrides
    config = tiny_config(arch, **fields).to_dict()
    config_class, causal_lm = FAMILY_CLASSES[family_of(config).model_type]
    s = skip_v_heads if skip_v_heads is not None else (2 if mha_only else 1)
    skip = config_class(**{k: v for k, v in config.items() if k not in NOT_FIELDS}, skip_v_heads=s)
    skip._attn_implementation = "eager" if arch == "gemma2" else "sdpa"
    torch.manual_seed(seed)
    return causal_lm(skip).eval()


def assert_beam_scores_are_the_uncached_model_s(model, prompt) -> None:
    """Beam search (3 beams, 5 new tokens, no length penalty): the best beam's score equals
    the sum of its tokens' log-probabilities under one uncached forward of the whole sequence,
    so the cache reordering between beams (borrowed heads included) changed nothing."""
    import torch

    out = model.generate(
        prompt,
        num_beams=3,
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
        length_penalty=0.0,
    )
    best, start = out.sequences[:1], prompt.shape[1]
    with torch.no_grad():
        logprobs = model(best).logits.log_softmax(-1)
    total = sum(logprobs[0, start - 1 + i, t] for i, t in enumerate(best[0, start:].tolist()))
    torch.testing.assert_close(out.sequences_scores[0], total, rtol=0, atol=1e-4)


def assert_passes_follow_the_stock_layers(src, config, load, x, tol: float = 1e-5) -> tuple:
    """The calibrated inits' hand-written forwards (calibrate's and reconstruct's
    source_hidden_states) give the stock model's hidden states after every layer but the last
    (whose output the final norm changes) for the tokens `x`; returns the stock ones."""
    from transformers import AutoModelForCausalLM

    from skipv1.convert import calibrate, reconstruct

    model = AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        want = model(x, output_hidden_states=True).hidden_states[1:-1]
    for forward in (calibrate.source_hidden_states, reconstruct.source_hidden_states):
        got = forward(config, load, x)
        for i, expected in enumerate(want):
            torch.testing.assert_close(got[i], expected, atol=tol, rtol=tol, msg=f"layer {i}")
    return want


def assert_windowed_batches_give_generate_s_tokens(model) -> None:
    """Continuous batching of prompts and generations longer than a window of 4 tokens, in
    pages of 4 tokens, two requests per batch, gives each prompt's greedy generate() tokens."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

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


def exported_greedy(exported, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens of a `torch.export` program of transformers' static-cache wrapper, one token
    per call at its position (transformers' own helper skips a position after the prompt)."""
    tokens = list(prompt)
    for position in range(len(prompt) + new_tokens - 1):
        logits = exported.module()(
            input_ids=torch.tensor([[tokens[position]]]), cache_position=torch.tensor([position])
        )
        if position >= len(prompt) - 1:
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def put_in_hub_cache(cache: Path, repo_id: str, checkpoint: Path) -> Path:
    """Lays `checkpoint`'s files out as huggingface_hub's cache holds a downloaded model repo
    (refs/main naming a snapshot), so that Hub ids resolve offline through the real hub client
    (HF_HUB_OFFLINE=1 with HF_HUB_CACHE=cache). Returns the snapshot directory."""
    commit = "0" * 40
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
