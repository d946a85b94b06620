"""`skipv1 eval MODEL [MODEL ...]`: parses options, calls `evaluate_models`, reports."""

import json
from pathlib import Path
from typing import Annotated

import typer

from ..console import cli_command, stdout
from ..errors import SkipV1Error
from .api import evaluate_models
from .lm_eval_runner import parse_tasks
from .report import lm_eval_table, results_table, write_json, write_plot
from .settings import EvalSettings, parse_bytes

PPL = "Perplexity"
KV = "KV cache and speed"
OUT = "Output"
LM = "lm-evaluation-harness"


@cli_command
def eval_command(
    models: Annotated[
        list[Path],
        typer.Argument(
            help="Checkpoint directories, source or SkipV1; the first is the reference."
        ),
    ],
    data: Annotated[
        str,
        typer.Option(
            help="Data spec: local .txt/.jsonl/.parquet files or glob; embedded, embedded:train or "
            "embedded:validation; or a Hub dataset NAME, NAME:CONFIG, NAME:CONFIG@SPLIT.",
            rich_help_panel=PPL,
        ),
    ] = "embedded:validation",
    ctx: Annotated[
        int | None,
        typer.Option(
            help="Tokens per window (default: min(1024, max positions)).", rich_help_panel=PPL
        ),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(
            help="Window step; < ctx slides the window, each token scored once (default: ctx).",
            rich_help_panel=PPL,
        ),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option(help="Tokens of the data to score; 0 for all.", rich_help_panel=PPL)
    ] = 65536,
    ppl_batch: Annotated[
        int, typer.Option(help="Windows per forward pass.", rich_help_panel=PPL)
    ] = 4,
    no_perplexity: Annotated[
        bool, typer.Option("--no-perplexity", help="Skip perplexity.", rich_help_panel=PPL)
    ] = False,
    prompt_len: Annotated[
        int, typer.Option(help="Prompt tokens for the KV measure and speed.", rich_help_panel=KV)
    ] = 128,
    new_tokens: Annotated[
        int, typer.Option(help="Tokens generated per speed run (>= 2).", rich_help_panel=KV)
    ] = 32,
    batch: Annotated[int, typer.Option(help="Sequences per speed run.", rich_help_panel=KV)] = 1,
    repeats: Annotated[
        int, typer.Option(help="Timed speed runs; the median is reported.", rich_help_panel=KV)
    ] = 3,
    kv_budget: Annotated[
        str,
        typer.Option(
            help="KV-cache memory for the max-batch column: bytes, or 16GiB, 500MB...",
            rich_help_panel=KV,
        ),
    ] = "16GiB",
    context_len: Annotated[
        int, typer.Option(help="Tokens per sequence for the max-batch column.", rich_help_panel=KV)
    ] = 4096,
    no_speed: Annotated[
        bool, typer.Option("--no-speed", help="Skip the speed runs.", rich_help_panel=KV)
    ] = False,
    dtype: Annotated[
        str,
        typer.Option(help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16."),
    ] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the speed/KV prompt.")] = 0,
    tasks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated lm-eval tasks, run on every model (needs the lm-eval extra).",
            rich_help_panel=LM,
        ),
    ] = None,
    tasks_dir: Annotated[
        Path | None,
        typer.Option(help="Directory of extra lm-eval task YAMLs.", rich_help_panel=LM),
    ] = None,
    lm_eval_limit: Annotated[
        int | None, typer.Option(help="Examples per lm-eval task.", rich_help_panel=LM)
    ] = None,
    lm_eval_batch: Annotated[int, typer.Option(help="lm-eval batch size.", rich_help_panel=LM)] = 1,
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Write every number and the settings to FILE ('-': stdout).",
            rich_help_panel=OUT,
        ),
    ] = None,  # fmt: skip
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG chart to FILE.png.", rich_help_panel=OUT)
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
) -> None:
    """Perplexity, measured KV-cache bytes/token and speed of checkpoints, side by side."""
    if plot is not None and plot.suffix.lower() != ".png":
        raise SkipV1Error(f"--plot {plot} must name a .png file")
    settings = EvalSettings(
        data=data,
        ctx=ctx,
        stride=stride,
        max_tokens=max_tokens,
        ppl_batch=ppl_batch,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        batch=batch,
        repeats=repeats,
        kv_budget=parse_bytes(kv_budget),
        context_len=context_len,
        dtype=dtype,
        device=device,
        seed=seed,
        skip_perplexity=no_perplexity,
        skip_speed=no_speed,
        tasks=parse_tasks(tasks),
        tasks_dir=str(tasks_dir) if tasks_dir else None,
        lm_eval_limit=lm_eval_limit,
        lm_eval_batch=lm_eval_batch,
        quiet=quiet,
    )
    result = evaluate_models([str(m) for m in models], settings)
    if json_file is not None and str(json_file) == "-":
        stdout.print_json(json.dumps(result))
    else:
        stdout.print(results_table(result))
        extra = lm_eval_table(result)
        if extra is not None:
            stdout.print(extra)
        if json_file is not None:
            write_json(result, json_file)
    if plot is not None:
        write_plot(result, plot)
