"""The `skipv1` command line: thin commands that parse options and call the subpackages."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .checkpoint_info import describe_config
from .console import cli_command, stdout
from .convert.inits import DEFAULT_INIT
from .families import SOURCE_NAMES

app = typer.Typer(
    name="skipv1",
    help=f"Convert pretrained decoder checkpoints ({SOURCE_NAMES}) to SkipV1Former, uptrain "
    "them, and evaluate them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
@cli_command
def inspect(
    path: Annotated[
        str,
        typer.Argument(
            help="Checkpoint: a directory (source or converted), a source's .gguf file, a Hub id "
            "(config.json alone is fetched) or builtin:smollm2."
        ),
    ],
    skip_heads: Annotated[
        int | None,
        typer.Option(
            help="For a source checkpoint: the s to plan for (default: half the KV heads)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Describe a checkpoint from its config.json alone: shape, parameters, KV bytes/token."""
    from .convert.api import locate_source, source_config

    info = describe_config(source_config(locate_source(path, config_only=True)), path, skip_heads)
    if as_json:
        stdout.print_json(json.dumps(info))
        return
    table = Table(title=f"{info['path']}  ({info['architecture']})", show_header=False)
    rows = [
        (
            "layers / heads / KV heads / head dim",
            f"{info['num_layers']} / {info['num_heads']} / {info['num_kv_heads']} / {info['head_dim']}",
        ),
        (
            "skipped value heads s",
            f"{info['skip_v_heads']}" + ("" if info["is_skipv1"] else " (planned)"),
        ),
        ("parameters", f"{info['parameters']:,}"),
        ("KV bytes/token, source layout (bf16)", f"{info['kv_bytes_per_token_source_bf16']:,}"),
        ("KV bytes/token, SkipV1 layout (bf16)", f"{info['kv_bytes_per_token_skipv1_bf16']:,}"),
        ("KV saving", f"{info['kv_saving']:.1%}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    stdout.print(table)


@app.command()
@cli_command
def demo(
    out: Annotated[
        Path, typer.Option(help="Output directory; finished steps in it are reused.")
    ] = Path("demo-out"),
    tokens: Annotated[
        int, typer.Option(help="Uptraining budget in tokens (fits ~15 min on 2 cores).")
    ] = 16384,
    skip_heads: Annotated[
        int, typer.Option(help="Value heads (of 3 KV heads) taken from layer 0.")
    ] = 1,
    nproc: Annotated[
        int | None, typer.Option(help="DeepSpeed ranks (default: 2 when 2+ cores).")
    ] = None,
    seq_len: Annotated[
        int, typer.Option(help="Tokens per training sequence and eval window.")
    ] = 256,
    lr: Annotated[float, typer.Option(help="Peak learning rate of the uptraining.")] = 3e-4,
    eval_tokens: Annotated[int, typer.Option(help="Held-out tokens scored for perplexity.")] = 4096,
    calib_tokens: Annotated[
        int,
        typer.Option(
            help="Calibration tokens of the main conversion (convert's default is 32,768; the "
            "demo uses fewer to fit its time budget)."
        ),
    ] = 8192,
    calib_distill_steps: Annotated[
        int,
        typer.Option(
            help="Attention distillation steps of the main conversion (convert's default is 30)."
        ),
    ] = 10,
    init: Annotated[
        str,
        typer.Option(help="Conversion init: reconstruct (the default), calibrated, keep, mean."),
    ] = DEFAULT_INIT,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Run the whole pipeline on SmolLM2-135M-Instruct offline: convert, eval, uptrain, eval, report."""
    import os

    from .demo import DemoSettings, run_demo

    ranks = nproc if nproc is not None else (2 if (os.cpu_count() or 1) >= 2 else 1)
    run_demo(
        DemoSettings(
            out=out,
            tokens=tokens,
            skip_heads=skip_heads,
            nproc=ranks,
            seq_len=seq_len,
            lr=lr,
            eval_tokens=eval_tokens,
            calib_tokens=calib_tokens,
            calib_distill_steps=calib_distill_steps,
            init=init,
            quiet=quiet,
        )
    )


def _register_subcommands() -> None:
    from .convert.command import convert
    from .evaluate.command import eval_command
    from .uptrain.command import export, prepare_data, uptrain

    app.command(help=f"Convert a {SOURCE_NAMES} checkpoint to SkipV1Former.")(convert)
    app.command(name="prepare-data")(prepare_data)
    app.command()(uptrain)
    app.command()(export)
    app.command(name="eval")(eval_command)


_register_subcommands()
