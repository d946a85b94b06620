"""The `skipv1` command line: thin commands that parse options and call the subpackages."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .checkpoint_info import describe
from .console import cli_command, stdout

app = typer.Typer(
    name="skipv1",
    help="Convert Llama-family checkpoints to SkipV1Former, uptrain them, and evaluate them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
@cli_command
def inspect(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory (source or converted).")],
    skip_heads: Annotated[
        int | None,
        typer.Option(
            help="For a source checkpoint: the s to plan for (default: half the KV heads)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Describe a checkpoint from its config.json alone: shape, parameters, KV bytes/token."""
    info = describe(path, skip_heads)
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


def _register_subcommands() -> None:
    from .convert.command import convert
    from .evaluate.command import eval_command
    from .uptrain.command import export, uptrain

    app.command()(convert)
    app.command()(uptrain)
    app.command()(export)
    app.command(name="eval")(eval_command)


_register_subcommands()
