"""`skipv1 convert`: the thin CLI over `convert_checkpoint`."""

import json
from typing import Annotated

import typer

from ..console import cli_command, stdout
from .api import convert_checkpoint
from .options import CONVERT_DEFAULTS as D
from .options import ConvertOptions


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
    ] = D.skip_heads,
    init: Annotated[
        str,
        typer.Option(
            help="Own value heads: reconstruct (the best: heads chosen and attention refitted "
            "layer by layer on calibration text), calibrated (heads chosen, borrowed heads' "
            "o_proj refitted), keep (first heads) or mean (the paper's mean of head groups)."
        ),
    ] = D.init,
    dtype: Annotated[
        str, typer.Option(help="Output dtype: auto (the source's), bfloat16, float16, float32.")
    ] = D.dtype,
    shard_size: Annotated[str, typer.Option(help="Largest output shard, e.g. 5GB.")] = D.shard_size,
    overwrite: Annotated[bool, typer.Option(help="Replace DST if it exists.")] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Validate and print the plan and KV saving; write nothing.")
    ] = False,
    trust_remote_code: Annotated[
        bool,
        typer.Option(help="Convert a source whose config names custom code (never executed)."),
    ] = D.trust_remote_code,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    calib_data: Annotated[
        str,
        typer.Option(
            help="reconstruct/calibrated inits: calibration text (a data spec: the text you "
            "will serve, if you know it), or `sampled` (the default): text sampled from the "
            "source itself."
        ),
    ] = D.calib_data,
    calib_tokens: Annotated[
        int, typer.Option(help="reconstruct/calibrated inits: calibration tokens.")
    ] = D.calib_tokens,
    calib_distill_steps: Annotated[
        int,
        typer.Option(
            help="reconstruct: steps (of 4 calibration sequences) of the final distillation of "
            "later layers' attention from the source; 0 skips it (it holds the model twice)."
        ),
    ] = D.calib_distill_steps,
    calib_seq_len: Annotated[
        int, typer.Option(help="reconstruct/calibrated inits: tokens per calibration sequence.")
    ] = D.calib_seq_len,
) -> None:
    """Convert a checkpoint of a supported family (skipv1.families) to SkipV1Former."""
    options = ConvertOptions(
        skip_heads=skip_heads,
        init=init,
        dtype=dtype,
        shard_size=shard_size,
        trust_remote_code=trust_remote_code,
        calib_data=calib_data,
        calib_tokens=calib_tokens,
        calib_seq_len=calib_seq_len,
        calib_distill_steps=calib_distill_steps,
    )
    summary = convert_checkpoint(
        src, dst, options, overwrite=overwrite, dry_run=dry_run, quiet=quiet or as_json
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
