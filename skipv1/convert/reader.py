"""Finding and reading a source checkpoint lazily.

A source is a local HF directory (safetensors or PyTorch .bin, single file or shards + index), a
.gguf file (dequantized through transformers into a staging directory first), or a Hub id.
`scan_weights` validates every shard from its header alone; `iter_tensors` then reads tensors
one source shard at a time, in file order, so at most one shard is open; a tensor that is to be
copied unchanged is not read at all but handed on as the byte range it occupies (`FileRange`).
"""

import contextlib
import json
import logging
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from ..errors import SkipV1Error
from ..units import BY_CODE, DType, dtype_named
from .arrays import Array

if TYPE_CHECKING:
    import torch

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_DTYPES = BY_CODE  # the float dtypes a source may hold, by safetensors' code
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class TensorRef:
    name: str
    file: str
    shape: tuple[int, ...]
    dtype: DType
    offset: int | None = None  # where its bytes start in a safetensors file; None in a .bin

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class FileRange:
    """The raw bytes of a tensor inside a source file, for copying without decoding."""

    path: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SourceWeights:
    """Tensors of a checkpoint directory, in read order (file by file, by offset within a file)."""

    root: Path
    format: str  # "safetensors" | "bin"
    files: tuple[str, ...]
    index_file: str | None
    refs: dict[str, TensorRef]


# --- where the source is -------------------------------------------------------------------


def is_hub_id(src: str) -> bool:
    return bool(HUB_ID.match(src)) and not Path(src).exists()


def download_from_hub(repo_id: str, config_only: bool = False) -> Path:
    """snapshot_download of the files a conversion needs (config_only: config.json alone, what
    `inspect` reads); offline -> a clear SkipV1Error."""
    from huggingface_hub import constants, list_repo_files, snapshot_download

    skip = ["*.pth", "*.pt", "*.h5", "*.msgpack", "*.onnx", "*.gguf", "original/*"]
    files = {"allow_patterns": ["config.json"]} if config_only else {"ignore_patterns": skip}
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # its retry warnings would break the one-line error
    try:
        if constants.HF_HUB_OFFLINE:
            return Path(snapshot_download(repo_id, local_files_only=True, **files))
        if not config_only and any(f.endswith(".safetensors") for f in list_repo_files(repo_id)):
            skip.append("*.bin")
        return Path(snapshot_download(repo_id, **files))
    except Exception as err:  # the hub client raises many kinds; all mean "not available"
        offline = constants.HF_HUB_OFFLINE or "offline" in str(err).lower()
        why = "the Hub is offline (HF_HUB_OFFLINE=1) and it is not cached" if offline else err
        raise SkipV1Error(
            f"{repo_id} is not a local path and could not be fetched from the Hub: {why}; "
            "download it on a machine with network access and give its directory"
        ) from None
    finally:
        hub_logger.setLevel(level)


# --- validating the weights from their headers ----------------------------------------------


def scan_weights(root: Path) -> SourceWeights:
    """Index, shards and headers of a checkpoint directory, validated without reading data."""
    if (root / SAFETENSORS_INDEX).exists() or (root / "model.safetensors").exists():
        return _scan(root, "safetensors", SAFETENSORS_INDEX, "model.safetensors", _safetensors_refs)
    if (root / BIN_INDEX).exists() or (root / "pytorch_model.bin").exists():
        return _scan(root, "bin", BIN_INDEX, "pytorch_model.bin", _bin_refs)
    if any(root.glob("*.safetensors")) or any(root.glob("*.bin")):
        raise SkipV1Error(
            f"{root} has weight shards but no {SAFETENSORS_INDEX} or {BIN_INDEX}: "
            "restore the index file (re-download the checkpoint)"
        )
    raise SkipV1Error(
        f"{root} holds no weights: expected model.safetensors, {SAFETENSORS_INDEX}, "
        f"pytorch_model.bin or {BIN_INDEX}"
    )


def _scan(root: Path, fmt: str, index_name: str, single: str, read_refs) -> SourceWeights:
    weight_map = _read_index(root / index_name) if (root / index_name).exists() else None
    files = sorted(set(weight_map.values())) if weight_map is not None else [single]
    refs: dict[str, TensorRef] = {}
    for file in files:
        path = root / file
        if not path.is_file():
            raise SkipV1Error(
                f"shard {file} is missing from {root}: {index_name} names it; "
                "re-download the checkpoint"
            )
        for ref in read_refs(path):
            # With an index, the index decides which shard holds a tensor.
            if weight_map is None or weight_map.get(ref.name) == file:
                refs.setdefault(ref.name, ref)
    if weight_map is not None:
        for name, file in weight_map.items():
            if name not in refs:
                raise SkipV1Error(
                    f"{index_name} names tensor {name} in {file}, but that shard does not hold "
                    "it: the index and the shards disagree; re-download the checkpoint"
                )
    index_file = index_name if weight_map is not None else None
    return SourceWeights(root, fmt, tuple(files), index_file, refs)


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError("empty weight_map")
    except (ValueError, KeyError, TypeError) as err:
        raise SkipV1Error(
            f"{path} is not a valid shard index ({err}): re-download the checkpoint"
        ) from None
    return {str(k): str(v) for k, v in weight_map.items()}


def _safetensors_refs(path: Path) -> list[TensorRef]:
    try:
        with safe_open(path, framework="numpy") as f:  # headers only: no torch needed
            names = f.offset_keys()
            slices = {n: f.get_slice(n) for n in names}
            meta = {n: (tuple(s.get_shape()), s.get_dtype()) for n, s in slices.items()}
    except SafetensorError as err:
        raise _bad_safetensors(path, err) from None
    offsets = _data_offsets(path)  # safetensors has validated the header: it parses
    refs = []
    for name, (shape, dtype) in meta.items():
        if dtype not in SAFETENSORS_DTYPES:
            raise SkipV1Error(
                f"{path.name}: tensor {name} has dtype {dtype}; only float checkpoints are supported "
                "(dequantize a quantized checkpoint first)"
            )
        refs.append(TensorRef(name, path.name, shape, SAFETENSORS_DTYPES[dtype], offsets[name]))
    return refs


def _read_header(path: Path) -> tuple[int, dict]:
    """(where the data starts, the JSON header) of a safetensors file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def _data_offsets(path: Path) -> dict[str, int]:
    """File offset of each tensor's first byte (safetensors' API does not expose it)."""
    start, header = _read_header(path)
    return {k: start + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def _bad_safetensors(path: Path, err: Exception) -> SkipV1Error:
    declared = _declared_size(path)
    actual = path.stat().st_size
    if declared is not None and declared > actual:
        return SkipV1Error(
            f"shard {path.name} is truncated: its header describes {declared} bytes but the file "
            f"has {actual}; re-download it"
        )
    return SkipV1Error(
        f"shard {path.name} has a corrupt safetensors header ({err}): re-download it"
    )


def _declared_size(path: Path) -> int | None:
    """File size a safetensors header promises (8-byte length + JSON + data), None if unreadable.
    Only used to word the error: safetensors itself has already rejected the file."""
    try:
        start, header = _read_header(path)
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return start + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _load_bin(path: Path) -> dict:
    """A .bin shard memory-mapped, never executing pickled code (weights_only)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise SkipV1Error(
            f"shard {path.name} cannot be read safely as tensors ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); it is truncated, corrupt or holds "
            "pickled code: re-download it, or convert it to safetensors"
        ) from None
    if not isinstance(state, dict):
        raise SkipV1Error(f"shard {path.name} does not hold a state dict: re-download it")
    return state


def _bin_refs(path: Path) -> list[TensorRef]:
    import torch

    state = _load_bin(path)
    refs = []
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise SkipV1Error(
                f"{path.name}: entry {name} is not a float tensor; only float checkpoints convert"
            )
        try:
            dtype = dtype_named(tensor.dtype)
        except KeyError:
            raise SkipV1Error(
                f"{path.name}: tensor {name} has dtype {tensor.dtype}; only "
                f"{', '.join(d.name for d in BY_CODE.values())} checkpoints convert"
            ) from None
        refs.append(TensorRef(name, path.name, tuple(tensor.shape), dtype))
    return refs


# --- reading the data ------------------------------------------------------------------------


def iter_tensors(
    weights: SourceWeights, names: set[str], raw: set[str] = frozenset(), arrays: bool = False
) -> Iterator[tuple[str, "torch.Tensor | Array | FileRange"]]:
    """(name, torch tensor) for the wanted names in read order, one source shard open at a time;
    for names in `raw` (safetensors sources only), (name, FileRange) instead, without reading;
    with `arrays` (safetensors sources only), (name, Array), read without torch."""
    for file in weights.files:
        wanted = [r.name for r in weights.refs.values() if r.file == file and r.name in names]
        if not wanted:
            continue
        path = weights.root / file
        if weights.format == "safetensors":
            yield from _safetensors_tensors(path, [weights.refs[n] for n in wanted], raw, arrays)
        else:
            state = _load_bin(path)
            for name in wanted:
                yield name, state.pop(name).contiguous()
            del state


def _safetensors_tensors(path: Path, refs: list[TensorRef], raw: set[str], arrays: bool):
    decode = not arrays and any(r.name not in raw for r in refs)
    # Memory-mapped when anything is decoded: a tensor is a view of the page cache.
    with safe_open(path, framework="pt") if decode else contextlib.nullcontext() as f:
        for r in refs:
            if r.name in raw:
                yield r.name, FileRange(path, r.offset, r.nbytes)
            elif arrays:
                yield r.name, Array.read(path, r.offset, r.dtype, r.shape)
            else:
                yield r.name, f.get_tensor(r.name)
