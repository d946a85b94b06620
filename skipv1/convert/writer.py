"""Streaming output: safetensors shards written as they fill, index last (into the atomic
workspace of skipv1.atomic_dir).

A planned shard's header is written first, from the plan's dtypes and shapes; each tensor then
goes straight to its offset as it arrives, so nothing waits in memory. A tensor the plan leaves
unchanged arrives as the byte range it has in its source file and is copied by the kernel
(copy_file_range, else sendfile) without ever being decoded, at its source's offset modulo 64 KiB
where the header's padding can place it (`shard_header`). A rewritten tensor
arrives as a torch tensor or, from the torch-free path, as an arrays.Array."""

import errno
import json
import math
import os
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..units import DType, dtype_named
from .arrays import Array
from .plan import shard_file_names
from .reader import FileRange

if TYPE_CHECKING:
    import torch

# safetensors.save_file orders a file's data by dtype, in this order reversed, then by name;
# following it keeps the shards byte-identical to what save_file wrote before.
DTYPE_ORDER = ("F16", "BF16", "F32", "F64")
METADATA = {"format": "pt"}
# Errors that mean "this kernel or file system cannot copy this way", not a failed copy.
NO_KERNEL_COPY = {
    errno.ENOSYS,
    errno.EXDEV,
    errno.EINVAL,
    errno.EOPNOTSUPP,
    errno.ENOTSUP,
    errno.ENOTSOCK,
    errno.EPERM,
}
BUFFER_BYTES = 16 * 2**20
# A kernel copy runs at cp's speed when source and destination offsets differ by a multiple of
# 64 KiB, and up to 1.5x slower when they differ by a few 4 KiB pages (the page cache's folios;
# measured with copy_file_range on ext4 for docs/results/convert.md): shard_header pads to it.
ALIGNMENT = 64 * 2**10
# Below this many copied bytes in a shard the padding would cost more than it saves.
MIN_ALIGNED_BYTES = 64 * ALIGNMENT


@dataclass(frozen=True)
class TensorSpec:
    """What the plan says an output tensor is."""

    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


def shard_header(
    specs: dict[str, TensorSpec],
    order: list[str] | None = None,
    copied_from: dict[str, int] | None = None,
) -> tuple[bytes, dict[str, int]]:
    """(the header bytes of a shard holding these tensors, each tensor's file offset).

    Without `order` the data follows safetensors.save_file's order (by dtype, then name) and
    the shard is byte-identical to what save_file writes. `copied_from` maps the tensors copied
    as byte ranges to their offsets in their source file: the header is then padded with spaces
    (the format allows it) so that most of their bytes sit at their source's offset modulo
    ALIGNMENT, where the kernel copies fastest."""
    if order is None:
        rank = {name: i for i, name in enumerate(DTYPE_ORDER)}
        order = sorted(specs, key=lambda n: (-rank[specs[n].dtype.code], n))
    header, offsets, at = {"__metadata__": METADATA}, {}, 0
    for name in order:
        spec = specs[name]
        header[name] = {
            "dtype": spec.dtype.code,
            "shape": list(spec.shape),
            "data_offsets": [at, at + spec.nbytes],
        }
        offsets[name] = at
        at += spec.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    length = _header_length(len(text), offsets, specs, copied_from or {})
    text += b" " * (length - len(text))
    start = 8 + len(text)
    return struct.pack("<Q", len(text)) + text, {n: start + o for n, o in offsets.items()}


def _header_length(
    text_bytes: int, offsets: dict[str, int], specs: dict[str, TensorSpec], copied_from: dict
) -> int:
    """The header's padded length: a multiple of 8 (as safetensors pads it, so that every
    tensor stays 8-byte aligned) that puts the most copied bytes at their source's offset
    modulo ALIGNMENT."""
    shortest = text_bytes + (-text_bytes % 8)
    votes = Counter()
    for name, source_at in copied_from.items():
        votes[(source_at - 8 - offsets[name]) % ALIGNMENT] += specs[name].nbytes
    if sum(votes.values()) < MIN_ALIGNED_BYTES:
        return shortest
    wanted = votes.most_common(1)[0][0]
    if wanted % 8:  # unreachable without breaking the 8-byte alignment
        return shortest
    return shortest + (wanted - shortest) % ALIGNMENT


def write_shards(
    out: Path,
    layout: list[list[str]],
    specs: dict[str, TensorSpec],
    tensors: Iterable[tuple[str, "torch.Tensor | Array | FileRange"]],
    on_tensor=None,
    copied_from: dict[str, int] | None = None,
) -> dict:
    """Streams (name, tensor, Array or FileRange) pairs, arriving in layout order, into safetensors
    shards whose headers come from `specs`. With `copied_from` (the source file offset of each
    tensor arriving as a FileRange) a shard's data follows the layout's order and its copies keep
    their page offsets (shard_header). Writes the index last (when there is more than one shard)
    and returns {"files": [...], "total_size": bytes}."""
    files = shard_file_names(len(layout))
    shard_of = {name: i for i, names in enumerate(layout) for name in names}
    current, left, fd, offsets, weight_map = 0, set(), None, {}, {}
    try:
        for name, data in tensors:
            if fd is None and shard_of.get(name) == current:  # the next shard's first tensor
                fd, offsets = _open_shard(out / files[current], layout[current], specs, copied_from)
                copies = _Copies(fd)
                left = set(layout[current])
            if name not in left:
                raise RuntimeError(f"tensor {name} arrived out of the planned shard order")
            _write_tensor(copies, offsets[name], specs[name], name, data)
            left.remove(name)
            weight_map[name] = files[current]
            if on_tensor is not None:
                on_tensor(name, specs[name].nbytes)
            if not left:
                copies.flush()
                os.close(fd)
                fd, current = None, current + 1
    finally:
        if fd is not None:
            os.close(fd)
    if current != len(layout):
        raise RuntimeError(f"only {current} of {len(layout)} shards were completed")
    total = sum(specs[n].nbytes for n in weight_map)
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"files": files, "total_size": total}


def _open_shard(
    path: Path, names: list[str], specs: dict[str, TensorSpec], copied_from: dict | None
) -> tuple[int, dict[str, int]]:
    mine = {n: specs[n] for n in names}
    if copied_from is None:
        header, offsets = shard_header(mine)
    else:
        copies = {n: copied_from[n] for n in names if n in copied_from}
        header, offsets = shard_header(mine, names, copies)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    _pwrite_all(fd, memoryview(header), 0)
    return fd, offsets


def _write_tensor(copies: "_Copies", at: int, spec: TensorSpec, name: str, data) -> None:
    if isinstance(data, FileRange):
        if data.nbytes != spec.nbytes:
            raise RuntimeError(f"{name}: {data.nbytes} source bytes, the plan says {spec.nbytes}")
        copies.add(data, at)
        return
    fd = copies.fd
    dtype = data.dtype if isinstance(data, Array) else dtype_named(data.dtype)
    if dtype != spec.dtype or tuple(data.shape) != spec.shape:
        raise RuntimeError(
            f"{name} came out {dtype} {list(data.shape)}; the plan says "
            f"{spec.dtype} {list(spec.shape)}"
        )
    # The tensor's own memory, viewed as bytes: no copy unless it is not contiguous.
    array = data.data if isinstance(data, Array) else Array.from_torch(data).data
    _pwrite_all(fd, memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)), at)


class _Copies:
    """A shard's byte-range copies, merged while each continues the last one in the same source
    file and in the shard: a run of unchanged tensors is one kernel copy, not one per tensor
    (what cp does for a whole file). `flush` copies the run held back."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.run: tuple[FileRange, int] | None = None  # (source bytes, shard offset)

    def add(self, src: FileRange, at: int) -> None:
        if self.run is not None and _continues(*self.run, src, at):
            held, start = self.run
            self.run = (FileRange(held.path, held.offset, held.nbytes + src.nbytes), start)
            return
        self.flush()
        self.run = (src, at)

    def flush(self) -> None:
        if self.run is not None:
            copy_range(self.run[0], self.fd, self.run[1])
            self.run = None


def _continues(held: FileRange, start: int, src: FileRange, at: int) -> bool:
    """Whether `src` at shard offset `at` comes right after `held` at `start` on both sides."""
    return (
        held.path == src.path
        and src.offset == held.offset + held.nbytes
        and at == start + held.nbytes
    )


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], at + done)


# --- copying a byte range between files --------------------------------------------------------


def copy_range(src: FileRange, fd: int, at: int) -> None:
    """The bytes of `src` to offset `at` of `fd`: inside the kernel where it can (no trip through
    user space, and a reflink on file systems that share extents), else through a buffer."""
    with open(src.path, "rb", buffering=0) as f:
        done = 0
        for step in (_copy_file_range, _sendfile, _buffered):
            done = step(f.fileno(), fd, src.offset, at, src.nbytes, done)
            if done == src.nbytes:
                return
    raise RuntimeError(f"{src.path} ended before byte {src.offset + src.nbytes}: it changed")


def _copy_file_range(src: int, dst: int, src_at: int, dst_at: int, count: int, done: int) -> int:
    if not hasattr(os, "copy_file_range"):
        return done
    step = lambda at: os.copy_file_range(src, dst, count - at, src_at + at, dst_at + at)  # noqa: E731
    return _repeat(step, count, done, NO_KERNEL_COPY)


def _sendfile(src: int, dst: int, src_at: int, dst_at: int, count: int, done: int) -> int:
    if not hasattr(os, "sendfile"):
        return done
    os.lseek(dst, dst_at + done, os.SEEK_SET)  # sendfile writes at the file position
    step = lambda at: os.sendfile(dst, src, src_at + at, count - at)  # noqa: E731
    return _repeat(step, count, done, NO_KERNEL_COPY)


def _buffered(src: int, dst: int, src_at: int, dst_at: int, count: int, done: int) -> int:
    def step(at: int) -> int:
        block = os.pread(src, min(BUFFER_BYTES, count - at), src_at + at)
        _pwrite_all(dst, memoryview(block), dst_at + at)
        return len(block)

    return _repeat(step, count, done, frozenset())


def _repeat(step, count: int, done: int, unsupported) -> int:
    """Bytes done after calling `step(done)` (it returns the bytes it moved) until `count` are
    done or the source ends (a step moves 0); an OSError whose errno is in `unsupported` means
    "not this way" and stops the loop, where the next way takes over."""
    try:
        while done < count:
            moved = step(done)
            if moved == 0:
                break
            done += moved
    except OSError as err:
        if err.errno not in unsupported:
            raise
    return done


def _unshare(tensors: "dict[str, torch.Tensor]") -> "dict[str, torch.Tensor]":
    """safetensors refuses tensors that share storage (tied weights saved twice in a .bin)."""
    seen, out = set(), {}
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


def write_shards_as_they_fill(
    out: Path, tensors: "Iterable[tuple[str, torch.Tensor]]", max_shard_bytes: int
) -> dict:
    """Like write_shards for a stream whose sizes are not planned ahead (an export gathering
    weights layer by layer): a shard is written when it reaches `max_shard_bytes`, under a
    temporary name, and the shards are named `model-0000i-of-0000N` once N is known."""
    from safetensors.torch import save_file

    parts: list[tuple[Path, list[str]]] = []
    pending: dict = {}
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
