"""Streaming output: safetensors shards written as they fill, index last (into the atomic
workspace of skipv1.atomic_dir)."""

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from .plan import shard_file_names


def _unshare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share storage (tied weights saved twice in a .bin)."""
    seen, out = set(), {}
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


def write_shards(
    out: Path,
    layout: list[list[str]],
    tensors: Iterable[tuple[str, torch.Tensor]],
    on_tensor=None,
    source_of=None,
) -> dict:
    """Streams (name, tensor) pairs, arriving in layout order, into safetensors shards; each shard
    is written as soon as its last tensor arrives and then freed. Writes the index last (when
    there is more than one shard) and returns {"files": [...], "total_size": bytes}.

    `source_of(name)` names the source shard a tensor is a memory-mapped view of: when it
    changes, the tensors still waiting for their output shard are copied into memory, so that
    only one source shard stays mapped."""
    files = shard_file_names(len(layout))
    shard_of = {name: i for i, names in enumerate(layout) for name in names}
    pending: dict[str, torch.Tensor] = {}
    current, total, weight_map, mapped = 0, 0, {}, None
    for name, tensor in tensors:
        if shard_of.get(name) != current:
            raise RuntimeError(f"tensor {name} arrived out of the planned shard order")
        if source_of is not None and source_of(name) != mapped:
            pending = {k: v.clone() for k, v in pending.items()}
            mapped = source_of(name)
        pending[name] = tensor
        total += tensor.numel() * tensor.element_size()
        weight_map[name] = files[current]
        if on_tensor is not None:
            on_tensor(name, tensor)
        if len(pending) == len(layout[current]):
            save_file(_unshare(pending), out / files[current], metadata={"format": "pt"})
            pending.clear()
            current += 1
    if current != len(layout):
        raise RuntimeError(f"only {current} of {len(layout)} shards were completed")
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"files": files, "total_size": total}


def write_shards_as_they_fill(
    out: Path, tensors: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int
) -> dict:
    """Like write_shards for a stream whose sizes are not planned ahead (an export gathering
    weights layer by layer): a shard is written when it reaches `max_shard_bytes`, under a
    temporary name, and the shards are named `model-0000i-of-0000N` once N is known."""
    parts: list[tuple[Path, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal size
        path = out / f".part-{len(parts):05d}.safetensors"
        save_file(_unshare(pending), path, metadata={"format": "pt"})
        parts.append((path, list(pending)))
        pending.clear()
        size = 0

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > max_shard_bytes:
            flush()
        pending[name] = tensor.contiguous()
        size += nbytes
        total += nbytes
    if pending or not parts:
        flush()
    files = shard_file_names(len(parts))
    weight_map = {}
    for (path, names), file in zip(parts, files, strict=True):
        path.rename(out / file)
        weight_map.update(dict.fromkeys(names, file))
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"files": files, "total_size": total}
