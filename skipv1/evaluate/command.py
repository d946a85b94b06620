"""`skipv1 eval MODEL [MODEL ...]`: parses options, calls `evaluate_models`, reports."""

import json
from pathlib import Path
from typing import Annotated

import typer

from ..cli_fields import with_settings_options
from ..console import cli_command, stdout
from ..errors import SkipV1Error
from .report import lm_eval_table, results_table, write_json, write_plot
from .settings import EvalSettings

OUT = "Output"


@cli_command
@with_settings_options(EvalSettings)
def eval_command(
    models: Annotated[
        list[str],
        typer.Argument(
            help="Checkpoints, source or SkipV1: directories, or as convert takes a source (a "
            ".gguf file, builtin:smollm2, a Hub id); the first is the reference."
        ),
    ],
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Write every number and the settings to FILE ('-': stdout).",
            rich_help_panel=OUT,
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG chart to FILE.png.", rich_help_panel=OUT)
    ] = None,
    *,
    settings: EvalSettings,
) -> None:
    """Perplexity, measured KV-cache bytes/token and speed of checkpoints, side by side."""
    if plot is not None and plot.suffix.lower() != ".png":
        raise SkipV1Error(f"--plot {plot} must name a .png file")
    from .api import evaluate_models  # torch and transformers: only when eval runs

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
