"""`skipv1 convert`: the thin CLI over `convert_checkpoint`."""

import json
from typing import Annotated

import typer

from ..console import cli_command, stdout
from .api import convert_checkpoint
from .init_registry import DEFAULT_CALIB_DISTILL_STEPS, DEFAULT_INIT


@cli_command
def convert(
    src: Annotated[
        str, typer.Argument(help="Source: HF checkpoint directory, .gguf file or Hub id.")
    ],
    dst: Annotated[str, typer.Argument(help="Output directory (written atomically).")],
    skip_heads: Annotated[
        int | None,
        typer.Option(
            help="Value heads (in KV heads) later layers take from layer 0 [default: n_kv // 2]."
        ),
    ] = None,
    init: Annotated[
        str,
        typer.Option(
            help="Own value heads: reconstruct (the best: heads chosen and attention refitted "
            "layer by layer on calibration text), calibrated (heads chosen, borrowed heads' "
            "o_proj refitted), keep (first heads) or mean (the paper's mean of head groups)."
        ),
    ] = DEFAULT_INIT,
    dtype: Annotated[
        str, typer.Option(help="Output dtype: auto (the source's), bfloat16, float16, float32.")
    ] = "auto",
    shard_size: Annotated[str, typer.Option(help="Largest output shard, e.g. 5GB.")] = "5GB",
    overwrite: Annotated[bool, typer.Option(help="Replace DST if it exists.")] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Validate and print the plan and KV saving; write nothing.")
    ] = False,
    trust_remote_code: Annotated[
        bool,
        typer.Option(help="Convert a source whose config names custom code (never executed)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    calib_data: Annotated[
        str, typer.Option(help="reconstruct/calibrated inits: calibration text (a data spec).")
    ] = "embedded:train",
    calib_tokens: Annotated[
        int, typer.Option(help="reconstruct/calibrated inits: calibration tokens.")
    ] = 32768,
    calib_distill_steps: Annotated[
        int,
        typer.Option(
            help="reconstruct: steps (of 4 calibration sequences) of the final distillation of "
            "later layers' attention from the source; 0 skips it (it holds the model twice)."
        ),
    ] = DEFAULT_CALIB_DISTILL_STEPS,
    calib_seq_len: Annotated[
        int, typer.Option(help="reconstruct/calibrated inits: tokens per calibration sequence.")
    ] = 256,
) -> None:
    """Convert a Llama/Mistral/Qwen2 checkpoint to SkipV1Former."""
    summary = convert_checkpoint(
        src,
        dst,
        skip_heads=skip_heads,
        init=init,
        dtype=dtype,
        shard_size=shard_size,
        overwrite=overwrite,
        dry_run=dry_run,
        trust_remote_code=trust_remote_code,
        quiet=quiet or as_json,
        calib_data=calib_data,
        calib_tokens=calib_tokens,
        calib_seq_len=calib_seq_len,
        calib_distill_steps=calib_distill_steps,
    )
    if as_json:
        stdout.print_json(json.dumps(summary))
    else:
        print_summary(summary)


def print_summary(summary: dict) -> None:
    kv, tensors = summary["kv_bytes_per_token"], summary["tensors"]
    verb = "would write" if summary["dry_run"] else "wrote"
    groups = " ".join("(" + ",".join(map(str, g)) + ")" for g in summary["value_head_groups"])
    groups = groups or "chosen per layer on calibration data"
    lines = [
        f"{summary['architecture']} {summary['source']} -> {summary['destination']}"
        + (" (dry run: nothing written)" if summary["dry_run"] else ""),
        f"  skip {summary['skip_heads']} of {summary['num_kv_heads']} value heads in layers "
        f"1..{summary['num_layers'] - 1}; init {summary['init']}: own heads from {groups}",
        f"  tensors: {tensors['copied']} copied, {tensors['rewritten']} rewritten, "
        f"{len(tensors['dropped'])} dropped",
        f"  parameters: {summary['parameters']['source']:,} -> {summary['parameters']['skipv1']:,}",
        f"  KV bytes/token ({kv['dtype']}): {kv['source']:,} -> {kv['skipv1']:,} "
        f"(-{kv['saving']:.1%})",
        f"  {verb} {summary['bytes_out'] / 1e9:.3f} GB in {len(summary['output_files'])} shard(s)",
    ]
    for line in lines:
        stdout.print(line, highlight=False)
