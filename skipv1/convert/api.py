"""`convert_checkpoint`: validate everything up front, then stream the source into a SkipV1
checkpoint inside a temporary workspace and rename it into place."""

import contextlib
import json
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic_dir import (
    DISK_SLACK,
    atomic_workspace,
    check_room,
    remove_stale_workspaces,
    resolve_path,
)
from ..checkpoint_info import check_supported, is_skipv1, read_config
from ..console import byte_progress, console
from ..errors import SkipV1Error
from ..families import standard_fields
from ..smollm2 import smollm2_gguf_path
from ..units import BFLOAT16, BY_NAME, DType
from .ahead import converted_ahead
from .arrays import Array
from .companions import companion_files, copy_companions, copy_modeling_code
from .config import ConfigChange, skipv1_config
from .fused import has_bare_names
from .options import ConvertOptions
from .plan import (
    CALIBRATE,
    COPY,
    DROPPABLE_SUFFIXES,
    REWRITE_V,
    ConversionPlan,
    make_plan,
    shard_file_names,
    shard_layout,
    shard_layout_by_source_file,
)
from .provenance import sha256_of, write_model_card, write_provenance
from .reader import (
    FileRange,
    SourceWeights,
    download_from_hub,
    is_hub_id,
    iter_tensors,
    scan_weights,
)
from .writer import TensorSpec, write_shards

if TYPE_CHECKING:
    import torch

    from .calibrate import Calibration

# Sources named by a built-in name instead of a path (the model the demo and tiny-cpu use).
BUILTIN_SOURCES = {"builtin:smollm2": smollm2_gguf_path}


@dataclass(frozen=True)
class Source:
    label: str  # what the user gave
    path: Path  # a directory, or the .gguf file
    hub_id: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"


@dataclass
class Prepared:
    """Everything known before the first output byte is written."""

    root: Path
    config: dict
    plan: ConversionPlan
    weights: SourceWeights
    order: list[str]  # tensors to write, in read order
    dropped: list[str]
    target_dtype: dict[str, DType]
    layout: list[list[str]]
    out_config: dict
    changes: list[ConfigChange]
    companions: dict[str, list[str]]

    def bytes_out(self) -> int:
        return sum(
            math.prod(self.plan.tasks[n].target_shape) * self.target_dtype[n].itemsize
            for n in self.order
        )


def convert_checkpoint(
    src: "str | Path",
    dst: "str | Path",
    options: ConvertOptions | None = None,
    *,
    overwrite: bool = False,
    dry_run: bool = False,
    quiet: bool = False,
    **fields,
) -> dict:
    """Converts a checkpoint of a supported family (skipv1.families) to SkipV1 and returns the
    summary that `skipv1 convert --json` prints. `options`, or its fields as keywords
    (`init="keep"`), say how. Raises SkipV1Error, before writing anything, on bad input."""
    start = time.perf_counter()
    options = (options or ConvertOptions(**fields)).check()
    dst = Path(dst).expanduser().absolute()
    source = locate_source(src)
    check_destination(source.path, dst, overwrite)
    if source.is_gguf:  # the options against its metadata before minutes of dequantizing
        check_options(source_config(source), source.path, options)
    if not source.is_gguf:
        prepared = prepare(source.path, dst, options)
        if dry_run:
            return _warned(summarize(source, dst, prepared, options, dry_run=True))
        stale = remove_stale_workspaces(dst)
        with atomic_workspace(dst, overwrite) as work:
            summary = write_output(source, dst, prepared, options, work / "out", quiet)
    elif dry_run:
        with tempfile.TemporaryDirectory(prefix="skipv1-gguf-") as tmp:
            prepared = prepare(stage_gguf(source.path, Path(tmp) / "source"), dst, options)
            return _warned(summarize(source, dst, prepared, options, dry_run=True))
    else:
        stale = remove_stale_workspaces(dst)
        with atomic_workspace(dst, overwrite) as work:
            prepared = prepare(stage_gguf(source.path, work / "source"), dst, options)
            summary = write_output(source, dst, prepared, options, work / "out", quiet)
    summary["removed_stale_workspaces"] = [str(p) for p in stale]
    summary["seconds"] = round(time.perf_counter() - start, 3)
    return _warned(summary)


def _warned(summary: dict) -> dict:
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    return summary


# --- options and paths ------------------------------------------------------------------------


def source_kind(src: "str | Path") -> str | None:
    """How a source name is read, without reading it: "builtin", "gguf", "hub" or "dir" (None:
    none of them)."""
    text = str(src)
    if text in BUILTIN_SOURCES:
        return "builtin"
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if not path.exists() and is_hub_id(text):
        return "hub"
    return "dir" if (path / "config.json").is_file() else None


def locate_source(src: "str | Path", config_only: bool = False) -> Source:
    """Where a source named by a directory, a .gguf file, a built-in name or a Hub id is
    (config_only: of a Hub id, fetch config.json alone)."""
    text, kind = str(src), source_kind(src)
    if kind == "builtin":
        return Source(text, BUILTIN_SOURCES[text]())
    path = Path(text).expanduser()
    if kind == "hub":
        return Source(text, download_from_hub(text, config_only), hub_id=text)
    if kind is None:
        read_config(path)  # the one-line errors for missing / not a directory / no config.json
    return Source(text, path.absolute())


def check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    src_r, dst_r = resolve_path(src, "SRC"), resolve_path(dst, "DST")
    if dst_r == src_r or src_r in dst_r.parents:
        raise SkipV1Error(f"DST {dst} is inside SRC {src}: choose a directory outside the source")
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            raise SkipV1Error(f"DST {dst} already exists: pass --overwrite or choose another DST")
        if dst_r in src_r.parents:
            raise SkipV1Error(
                f"DST {dst} contains SRC {src}: overwriting it would delete the source; "
                "choose another DST"
            )


def check_source_config(config: dict, root: Path, trust_remote_code: bool) -> None:
    check_supported(config)
    if is_skipv1(config):
        raise SkipV1Error(
            f"{root} is already a SkipV1 checkpoint (skip_v_heads={config.get('skip_v_heads')}): "
            "convert its source model instead, or use it as it is"
        )
    if config.get("auto_map") and not trust_remote_code:
        raise SkipV1Error(
            f"{root}/config.json asks for custom code (auto_map {config['auto_map']}); skipv1 "
            "never runs it, but its weights may not follow the standard layout: pass "
            "--trust-remote-code to convert it as a standard "
            f"{(config.get('architectures') or ['?'])[0]}"
        )
    heads, n_kv = config["num_attention_heads"], config.get("num_key_value_heads") or 0
    if n_kv and heads % n_kv:
        raise SkipV1Error(
            f"config.json has {heads} attention heads and {n_kv} KV heads, which do not group "
            "evenly: it is not a valid Llama-family config"
        )


def source_config(source: Source) -> dict:
    """The source's config.json fields; a GGUF's from its metadata (no weights read)."""
    if not source.is_gguf:
        return read_config(source.path)
    from transformers import AutoConfig

    with _gguf_reading(source.path):
        config = AutoConfig.from_pretrained(source.path.parent, gguf_file=source.path.name)
    return standard_fields(config.to_dict())


def stage_gguf(gguf: Path, staging: Path) -> Path:
    """A GGUF file dequantized through transformers into an ordinary HF directory."""
    from ..smollm2 import export_gguf_as_hf

    with _gguf_reading(gguf):
        return export_gguf_as_hf(gguf, staging)


@contextlib.contextmanager
def _gguf_reading(gguf: Path) -> Iterator[None]:
    """transformers' GGUF loader's errors (an unknown architecture, a damaged file) as one line."""
    try:
        yield
    except (ValueError, ImportError, OSError, KeyError) as err:
        raise SkipV1Error(
            f"{gguf} could not be read by transformers' GGUF loader ({err}): "
            "give an HF checkpoint directory instead"
        ) from None


# --- validation -------------------------------------------------------------------------------


def prepare(root: Path, dst: Path, options: ConvertOptions) -> Prepared:
    """Reads config and shard headers, checks them against each other and the options, and
    plans the output; raises SkipV1Error on anything wrong. Reads no tensor data."""
    config = read_config(root)
    plan = check_options(config, root, options)
    weights = scan_weights(root)
    if has_bare_names(plan.source.family, weights.refs):
        plan = make_plan(config, options.skip_heads, options.init, bare_names=True)
    order, dropped = check_tensors(plan, weights)
    forced = BY_NAME[options.dtype] if options.dtype != "auto" else None
    target_dtype = {n: forced or weights.refs[n].dtype for n in order}
    sizes = [(n, _nbytes(plan.tasks[n].target_shape, target_dtype[n])) for n in order]
    if weights.format == "safetensors":  # tensors are byte-copied: keep them page-aligned
        file_of = {n: weights.refs[n].file for n in order}
        layout = shard_layout_by_source_file(sizes, file_of, options.max_shard_bytes)
    else:
        layout = shard_layout(sizes, options.max_shard_bytes)
    out_config, changes = skipv1_config(config, plan, options.dtype if forced else None)
    companions = companion_files(root)
    if plan.init_method.calibrated and plan.skip_heads and not companions["tokenizer"]:
        raise SkipV1Error(
            f"--init {plan.init} needs the source's tokenizer for its calibration text and "
            f"{root} has no tokenizer files: add them, or pass --init keep (no calibration, "
            "much worse quality)"
        )
    prepared = Prepared(
        root,
        config,
        plan,
        weights,
        order,
        dropped,
        target_dtype,
        layout,
        out_config,
        changes,
        companions,
    )
    check_free_disk(dst, prepared)
    return prepared


def check_options(config: dict, root: Path, options: ConvertOptions) -> ConversionPlan:
    """The source's config against the options (family, --skip-heads, --init); its plan."""
    check_source_config(config, root, options.trust_remote_code)
    return make_plan(config, options.skip_heads, options.init)


def _nbytes(shape: tuple[int, ...], dtype: DType) -> int:
    return math.prod(shape) * dtype.itemsize


def check_tensors(plan: ConversionPlan, weights: SourceWeights) -> tuple[list[str], list[str]]:
    """(tensors to write in read order, tensors dropped); every shape must match the config."""
    order, dropped = [], []
    for name, ref in weights.refs.items():
        task = plan.tasks.get(name)
        if task is None:
            if name.endswith(DROPPABLE_SUFFIXES):
                dropped.append(name)
                continue
            raise SkipV1Error(
                f"{ref.file} holds tensor {name}, which a {plan.source.architecture} with this "
                "config.json does not have: the weights and the config disagree"
            )
        if ref.shape != task.source_shape:
            raise SkipV1Error(
                f"tensor {name} in {ref.file} has shape {list(ref.shape)} but config.json "
                f"implies {list(task.source_shape)}: the weights and the config disagree"
            )
        order.append(name)
    missing = set(plan.tasks) - set(weights.refs) - plan.source.optional_tensors()
    if missing:
        first = sorted(missing, key=list(plan.tasks).index)[0]
        raise SkipV1Error(
            f"the weights lack {len(missing)} tensor(s) the config implies, e.g. {first}: "
            "the checkpoint is incomplete; re-download it"
        )
    return order, dropped


def check_free_disk(dst: Path, prepared: Prepared) -> None:
    companions = sum(
        _size_of(prepared.root / n) for names in prepared.companions.values() for n in names
    )
    check_room(dst, prepared.bytes_out() + companions + DISK_SLACK)


def _size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


# --- writing ----------------------------------------------------------------------------------


def byte_copied(prepared: Prepared) -> set[str]:
    """Tensors the plan leaves as they are, dtype included, in a safetensors source: their bytes
    go from file to file, never decoded."""
    if prepared.weights.format != "safetensors":
        return set()
    refs, tasks = prepared.weights.refs, prepared.plan.tasks
    return {
        n
        for n in prepared.order
        if tasks[n].action == COPY and prepared.target_dtype[n] == refs[n].dtype
    }


def converted_tensors(
    prepared: Prepared, raw: set[str], calibration: "Calibration | None" = None
) -> Iterator[tuple[str, "torch.Tensor | Array | FileRange"]]:
    """Each output tensor in read order; those in `raw` (byte_copied) as source byte ranges."""
    plan = prepared.plan
    # Without torch where nothing needs it: a safetensors source and an init that works on numpy
    # arrays (keep, mean) are read, rewritten and cast as arrays (arrays.py: torch's exact casts).
    # A fused q/k/v tensor is cut and rejoined with torch (convert/fused.py).
    arrays = (
        prepared.weights.format == "safetensors"
        and calibration is None
        and plan.init_method.takes_arrays
        and plan.source.qkv_layout is None
    )

    def convert(name: str, tensor):
        if calibration is not None and plan.tasks[name].action in (REWRITE_V, CALIBRATE):
            tensor = calibration.transform(name, tensor)
        elif plan.tasks[name].action == REWRITE_V:
            tensor = plan.rewrite_values(name, tensor)
        target = prepared.target_dtype[name]
        return tensor.to(target) if isinstance(tensor, Array) else tensor.to(target.torch)

    tensors = iter_tensors(prepared.weights, set(prepared.order), raw, arrays)
    if arrays:  # numpy work overlaps the copies (torch's own threads already use the CPUs)
        yield from converted_ahead(tensors, lambda name: name not in raw, convert)
        return
    for name, tensor in tensors:
        yield name, tensor if name in raw else convert(name, tensor)


def write_output(
    source: Source, dst: Path, prepared: Prepared, options: ConvertOptions, out: Path, quiet: bool
) -> dict:
    calibration = None
    if prepared.plan.init_method.calibrated and prepared.plan.skip_heads:
        from .calibrate import calibrate_source

        calibration = calibrate_source(prepared, options, quiet)
    specs = {
        n: TensorSpec(prepared.target_dtype[n], prepared.plan.tasks[n].target_shape)
        for n in prepared.order
    }
    refs, raw = prepared.weights.refs, byte_copied(prepared)
    with byte_progress(quiet) as progress:
        task = progress.add_task("converting", total=prepared.bytes_out())
        written = write_shards(
            out,
            prepared.layout,
            specs,
            converted_tensors(prepared, raw, calibration),
            on_tensor=lambda name, nbytes: progress.advance(task, nbytes),
            copied_from={n: refs[n].offset for n in raw},
        )
    (out / "config.json").write_text(json.dumps(prepared.out_config, indent=2) + "\n")
    copy_companions(prepared.root, out, prepared.companions)
    copy_modeling_code(out, prepared.plan.source.family)
    summary = summarize(source, dst, prepared, options, dry_run=False)
    summary["total_size"] = written["total_size"]
    if calibration is not None:
        from .calibrate import calibration_record

        summary["calibration"] = calibration_record(calibration, options)
    hashes = {
        "source_config_sha256": sha256_of(prepared.root / "config.json"),
        "source_index_sha256": sha256_of(
            prepared.root / prepared.weights.index_file if prepared.weights.index_file else None
        ),
    }
    write_provenance(out, summary, hashes)
    write_model_card(out, summary)
    return summary


# --- the summary ------------------------------------------------------------------------------


def summarize(
    source: Source, dst: Path, prepared: Prepared, options: ConvertOptions, dry_run: bool
) -> dict:
    plan, source_model = prepared.plan, prepared.plan.source
    v0 = source_model.value_tensor(0)
    kv_dtype = prepared.target_dtype.get(v0, BFLOAT16)
    before = source_model.kv.bytes_per_token(kv_dtype.itemsize)
    after = plan.kv_after.bytes_per_token(kv_dtype.itemsize)
    params_before = sum(math.prod(plan.tasks[n].source_shape) for n in prepared.order)
    params_after = sum(math.prod(plan.tasks[n].target_shape) for n in prepared.order)
    changed = [t for t in plan.changed() if t.name in prepared.weights.refs]
    warnings = [
        f"config field {c.field} changed from {c.before} to {c.after}: {c.why}"
        for c in prepared.changes
        if c.field == "max_position_embeddings"
    ]
    if not prepared.companions["tokenizer"]:
        warnings.append("the source has no tokenizer files: the output has none either")
    if prepared.dropped:
        warnings.append(
            f"dropped {len(prepared.dropped)} recomputed buffer(s) (rotary inv_freq, causal masks)"
        )
    return {
        "source": source.label,
        "source_dir": str(prepared.root) if not source.is_gguf else str(source.path),
        "source_format": "gguf" if source.is_gguf else prepared.weights.format,
        "hub_id": source.hub_id,
        "destination": str(dst),
        "dry_run": dry_run,
        "architecture": source_model.architecture,
        "num_layers": source_model.num_layers,
        "num_kv_heads": source_model.num_kv_heads,
        "head_dim": source_model.head_dim,
        "skip_heads": plan.skip_heads,
        "init": plan.init,
        "value_head_groups": [list(g) for g in plan.groups],
        "options": options.record(),
        "max_shard_bytes": options.max_shard_bytes,
        "output_files": shard_file_names(len(prepared.layout)),
        "bytes_out": prepared.bytes_out(),
        "tensors": {
            "total": len(prepared.order),
            "copied": len(prepared.order) - len(changed),
            "rewritten": len(changed),
            "dropped": prepared.dropped,
        },
        "tensors_changed": [
            {"name": t.name, "from": list(t.source_shape), "to": list(t.target_shape)}
            for t in changed
        ],
        "parameters": {"source": params_before, "skipv1": params_after},
        "kv_bytes_per_token": {
            "dtype": kv_dtype.name,
            "source": before,
            "skipv1": after,
            "saving": 1 - after / before,
        },
        "config_changes": [c.as_dict() for c in prepared.changes],
        "warnings": warnings,
        "tokenizer_files": prepared.companions["tokenizer"],
        "other_files": prepared.companions["other"],
    }
