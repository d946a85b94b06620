"""`evaluate_models(paths, settings)`: the whole of `skipv1 eval` as one Python call (the CLI and
the demo both use it). Every input is checked before the first model loads; then the models are
loaded one at a time, measured with identical settings and data, and freed."""

import contextlib
import gc
import logging
import platform
from collections.abc import Iterator
from pathlib import Path

import torch

from ..checkpoint_info import architecture
from ..console import console, step_progress
from ..errors import SkipV1Error
from ..packing import token_stream
from ..textdata import iter_documents, parse_data_spec
from .kv_memory import max_batch, measure_kv
from .lm_eval_runner import run_lm_eval, task_manager
from .loading import check_model, load_model, max_positions, resolve_device, resolve_dtype
from .perplexity import perplexity, windows
from .settings import EvalSettings
from .speed import measure_speed

DEFAULT_CTX = 1024
RATIO_KEYS = (
    "params",
    "perplexity",
    "kv_bytes_per_token",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "max_batch_at_budget",
)


class CachedTexts:
    """The data's texts, read once and replayed for every model (Hub data may be streamed)."""

    def __init__(self, spec: str) -> None:
        self._source = iter_documents(spec, streaming=parse_data_spec(spec).kind == "hub")
        self._seen: list[str] = []

    def __iter__(self) -> Iterator[str]:
        yield from self._seen
        for text in self._source:
            self._seen.append(text)
            yield text

    def check_not_empty(self, spec: str) -> None:
        with _silent_datasets():  # its bars and error logs would break the one-line error
            first = next(iter(self), None)
        if first is None:
            raise SkipV1Error(f"data {spec} holds no non-empty text: give a spec with text in it")


@contextlib.contextmanager
def _silent_datasets():
    import datasets

    bars, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def _transformers_bars(enabled: bool):
    """--quiet also silences transformers' "Loading weights" bars."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def resolve_settings(paths: list[str], settings: EvalSettings) -> tuple[list, EvalSettings]:
    """Locates every model and validates the settings against its config ([(source, config)]);
    fills in ctx and stride."""
    settings.validate()
    if not paths:
        raise SkipV1Error("give at least one checkpoint directory to evaluate")
    checked = [check_model(p) for p in paths]
    gguf = next((source.label for source, _ in checked if source.is_gguf), None)
    if gguf and settings.tasks:
        raise SkipV1Error(
            f"--tasks runs lm-eval on checkpoint directories, and {gguf} is a GGUF file: "
            "convert it (or load and save_pretrained it) and give that directory"
        )
    limits = {source.label: max_positions(config) for source, config in checked}
    smallest = min(limits.values())
    ctx = settings.ctx if settings.ctx is not None else min(DEFAULT_CTX, smallest)
    for path, limit in limits.items():
        if ctx > limit:
            raise SkipV1Error(
                f"--ctx {ctx} is larger than the {limit} positions of {path}: use --ctx <= {limit}"
            )
        if settings.prompt_len + settings.new_tokens > limit:
            raise SkipV1Error(
                f"--prompt-len + --new-tokens = {settings.prompt_len + settings.new_tokens} "
                f"exceeds the {limit} positions of {path}: shorten them"
            )
    stride = settings.stride if settings.stride is not None else ctx
    resolved = EvalSettings(**{**settings.as_dict(), "ctx": ctx, "stride": stride}).validate()
    return checked, resolved


def evaluate_models(paths: list["str | Path"], settings: EvalSettings | None = None) -> dict:
    """{"settings": {...}, "models": [{...}, ...]}: see docs/eval.md for every field."""
    paths = [str(p) for p in paths]
    checked, settings = resolve_settings(paths, settings or EvalSettings())
    configs = [config for _, config in checked]
    texts = None
    if not settings.skip_perplexity:
        texts = CachedTexts(settings.data)
        texts.check_not_empty(settings.data)
    manager = task_manager(settings.tasks, settings.tasks_dir) if settings.tasks else None
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    prompt = _prompt(configs, settings)

    models = []
    for source, config in checked:
        with _transformers_bars(not settings.quiet):
            entry = _evaluate_one(source, config, settings, texts, prompt, device, dtype)
        if manager is not None:
            if not settings.quiet:
                console.print(f"[bold]{source.label}[/]: lm-eval {', '.join(settings.tasks)}")
            entry["lm_eval"] = run_lm_eval(
                str(source.path),
                settings.tasks,
                manager,
                device=str(device),
                dtype=str(dtype).removeprefix("torch."),
                batch_size=settings.lm_eval_batch,
                limit=settings.lm_eval_limit,
            )
        models.append(entry)
    _add_ratios(models)
    _warn_if_token_counts_differ(models, settings)
    return {"settings": _settings_record(settings, device, dtype), "models": models}


def _prompt(configs: list[dict], settings: EvalSettings) -> torch.Tensor:
    """Seeded random token ids, valid for every model's vocabulary: the same prompt for all."""
    vocab = min(int(c["vocab_size"]) for c in configs)
    generator = torch.Generator().manual_seed(settings.seed)
    return torch.randint(0, vocab, (settings.batch, settings.prompt_len), generator=generator)


def _evaluate_one(source, config, settings, texts, prompt, device, dtype) -> dict:
    loaded = load_model(source, device, dtype)
    path = source.label
    model = loaded.model
    entry = {
        "path": path,
        "architecture": architecture(config),
        "skip_v_heads": int(config.get("skip_v_heads", 0) or 0),
        "params": sum(p.numel() for p in model.parameters()),
        "perplexity": None,
        "mean_nll": None,
        "eval_tokens": None,
    }
    if texts is not None:
        entry.update(_perplexity(loaded, texts, settings))
    kv = measure_kv(model, prompt[:1])
    if not kv.matches_formula:
        console.print(
            f"[bold red]warning:[/] {path}: measured KV bytes/token {kv.bytes_per_token} != "
            f"formula {kv.formula_bytes_per_token}"
        )
    entry.update(
        kv_bytes_per_token=_int_if_whole(kv.bytes_per_token),
        kv_bytes_per_token_formula=kv.formula_bytes_per_token,
        kv_matches_formula=kv.matches_formula,
        kv_cached_tokens=kv.cached_tokens,
        kv_dtype=kv.dtype,
        max_batch_at_budget=max_batch(kv.bytes_per_token, settings.context_len, settings.kv_budget),
        prefill_tokens_per_s=None,
        decode_tokens_per_s=None,
    )
    if not settings.skip_speed:
        if not settings.quiet:
            console.print(f"[bold]{path}[/]: timing prefill and decode")
        speed = measure_speed(model, prompt, settings.new_tokens, settings.repeats)
        entry.update(
            prefill_tokens_per_s=speed.prefill_tokens_per_s,
            decode_tokens_per_s=speed.decode_tokens_per_s,
            prefill_s=speed.prefill_s,
            decode_s=speed.decode_s,
        )
    del loaded, model
    _free(device)
    return entry


def _perplexity(loaded, texts: CachedTexts, settings: EvalSettings) -> dict:
    ids = torch.from_numpy(token_stream(texts, loaded.tokenizer, settings.max_tokens or None))
    total = len(windows(ids.numel(), settings.ctx, settings.stride))
    with step_progress(settings.quiet) as progress:
        task = progress.add_task(f"{Path(loaded.path).name}: perplexity", total=total)
        result = perplexity(
            loaded.model,
            ids,
            settings.ctx,
            settings.stride,
            batch_size=settings.ppl_batch,
            on_window=lambda n: progress.advance(task, n),
        )
    return {
        "perplexity": result.perplexity,
        "mean_nll": result.mean_nll,
        "eval_tokens": result.tokens,
    }


def _add_ratios(models: list[dict]) -> None:
    """`vs_first`: each number divided by the first model's (the reference)."""
    first = models[0]
    for entry in models:
        entry["vs_first"] = {
            key: entry[key] / first[key]
            for key in RATIO_KEYS
            if entry.get(key) is not None and first.get(key)
        }


def _warn_if_token_counts_differ(models: list[dict], settings: EvalSettings) -> None:
    counts = {m["eval_tokens"] for m in models if m["eval_tokens"] is not None}
    if len(counts) > 1 and not settings.quiet:
        console.print(
            "[yellow]note:[/] the models tokenize the data differently (scored tokens: "
            f"{sorted(counts)}); their perplexities are per token of different vocabularies"
        )


def _settings_record(settings: EvalSettings, device: torch.device, dtype: torch.dtype) -> dict:
    import transformers

    record = settings.as_dict()
    record.pop("quiet")
    record.update(
        data_description=None
        if settings.skip_perplexity
        else parse_data_spec(settings.data).describe(),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        requested_device=settings.device,
        requested_dtype=settings.dtype,
        torch=torch.__version__,
        transformers=transformers.__version__,
        cpu=platform.processor() or platform.machine(),
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        threads=torch.get_num_threads(),
    )
    return record


def _int_if_whole(value: float) -> "int | float":
    return int(value) if float(value).is_integer() else value


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
