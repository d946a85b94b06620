"""`skipv1 uptrain` and `skipv1 export`: parse options, then call the recipe and export code."""

import json
from pathlib import Path
from typing import Annotated

import typer

from ..console import cli_command, stdout
from ..errors import SkipV1Error
from .launch import is_worker, launch_local, report_error


@cli_command
def uptrain(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (see recipes/ and docs/uptrain.md).")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Recipe overrides as dotted key=value, e.g. optim.lr=3e-4."),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Where checkpoints, logs, the resolved recipe and the export go."),
    ] = None,
    nproc: Annotated[
        int,
        typer.Option(help="Spawn this many local ranks (torchrun); 1 runs in this process."),
    ] = 1,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Uptrain a converted (or to-be-converted) checkpoint with DeepSpeed, resumably."""
    from .recipe import gradient_accumulation, load_recipe

    extra = list(overrides or [])
    if run_dir is not None:
        extra.append(f"run_dir={run_dir}")
    if quiet:
        extra.append("log.progress=false")
    loaded = load_recipe(recipe, extra)  # validate before spawning anything
    if nproc < 1:
        raise SkipV1Error(f"--nproc is {nproc}: give 1 or more")
    if not is_worker():
        gradient_accumulation(loaded, nproc)  # the batch must split over the ranks: say so once
    if nproc > 1 and not is_worker():
        rc = launch_local(recipe, extra, nproc)
        if rc:
            raise typer.Exit(rc)
        return
    from .trainer import run

    try:
        run(loaded)
    except SkipV1Error as err:
        if report_error(str(err), every_rank=getattr(err, "every_rank", False)):
            raise typer.Exit(err.exit_code) from None
        raise


@cli_command
def export(
    run_dir: Annotated[Path, typer.Argument(help="The --run-dir of an uptrain run.")],
    dst: Annotated[Path, typer.Argument(help="Destination directory for the HF checkpoint.")],
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="A step_XXXXXXXX checkpoint directory (default: the latest complete)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace DST if it exists.")] = False,
    trust_checkpoint: Annotated[
        bool,
        typer.Option(
            help="Unpickle DeepSpeed state files that hold more than tensors and plain data "
            "(this can run code from the run directory: only for runs you trust)."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Export a run's checkpoint as a consolidated SkipV1 checkpoint (ZeRO shards merged)."""
    from .export import UPTRAIN_FILE, export_run

    out = export_run(run_dir, dst, checkpoint, overwrite, trust_checkpoint)
    info = json.loads((out / UPTRAIN_FILE).read_text())
    if as_json:
        stdout.print_json(json.dumps({"path": str(out), **info}))
    else:
        stdout.print(f"exported {out} ({info['tokens']:,} tokens trained, step {info['steps']})")


@cli_command
def prepare_data(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML whose train data to tokenize.")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Recipe overrides as dotted key=value, e.g. data.seq_len=2048."),
    ] = None,
    num_proc: Annotated[
        int | None, typer.Option(help="Tokenizer processes (default: data.num_proc).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Tokenize a recipe's train data once into its token store; uptrain then reads it."""
    from .recipe import load_recipe
    from .token_store import recipe_tokenizer, train_store

    loaded = load_recipe(recipe, list(overrides or []))
    procs = num_proc or loaded.data.resolved_num_proc()
    if procs < 1:
        raise SkipV1Error(f"--num-proc is {procs}: give 1 or more")
    path, meta = train_store(loaded, recipe_tokenizer(loaded), 0, procs, log=_stderr)
    if as_json:
        stdout.print_json(json.dumps({"path": str(path), **meta}))
    else:
        stdout.print(
            f"token store {path}: {meta['blocks']:,} blocks of {meta['seq_len']} "
            f"({meta['tokens']:,} tokens, {meta['dtype']})"
        )


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)
