"""Checkpoint tensors without torch: `Array`, a tensor's bytes as a numpy array (its dtype from
skipv1.units' table), with the casts `convert` needs done exactly as torch does them.

`convert --init keep/mean` of a safetensors source works on these, so that it never imports
torch (seconds of start-up on a conversion that otherwise runs at disk speed). numpy has no
bfloat16: a bfloat16 tensor is held as its uint16 bit patterns, widened to float32 by a shift
(exact) and narrowed by rounding to nearest, ties to even, as torch does; NaN becomes 0xFFFF, as
torch's CPU cast gives it. tests/test_arrays.py pins every cast against torch bit for bit."""

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..units import BFLOAT16, FLOAT16, FLOAT64, DType, dtype_named

CAST_BLOCK = 1 << 18  # elements per step of a cast: the temporaries stay in the CPU cache


@dataclass(frozen=True)
class Array:
    """A tensor as a numpy array of its bytes (`dtype.storage`), in the tensor's shape."""

    dtype: DType
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @classmethod
    def read(cls, path: Path, offset: int, dtype: DType, shape: tuple[int, ...]) -> "Array":
        """The tensor at byte `offset` of a safetensors file (little-endian, C order), as a
        read-only view of the file's pages in the page cache: mapped, not read (a read() into
        a fresh array costs a copy and page faults on every byte)."""
        count = math.prod(shape)
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        length = offset - base + count * np.dtype(dtype.storage).itemsize
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < base + length:  # mapped past the end: SIGBUS
                raise RuntimeError(f"{path} ended inside a tensor at byte {offset}: it changed")
            if count == 0:
                return cls(dtype, np.empty(shape, dtype.storage))
            try:
                pages = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=base)
            except OSError:  # a file system without mmap (some FUSE mounts): read it
                data = np.fromfile(f, dtype.storage, count, offset=offset)
                return cls(dtype, data.reshape(shape))
        data = np.frombuffer(pages, dtype.storage, count, offset - base)  # keeps `pages` open
        return cls(dtype, data.reshape(shape))

    def float32(self) -> np.ndarray:
        """The values as float32 (exact from bfloat16 and float16)."""
        if self.dtype is BFLOAT16:
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as in torch
            return self.data.astype(np.float32, copy=False)

    @classmethod
    def from_float32(cls, values: np.ndarray, dtype: DType) -> "Array":
        """float32 values rounded to `dtype` as torch's `.to(dtype)` rounds them."""
        values = np.ascontiguousarray(values, dtype=np.float32)
        if dtype is BFLOAT16:
            return cls(dtype, _round_to_bfloat16(values))
        if dtype is FLOAT16:
            return cls(dtype, _round_to_float16(values))
        return cls(dtype, values.astype(dtype.storage, copy=False))

    def to(self, dtype: DType) -> "Array":
        """This tensor cast to `dtype`, as torch casts it (through float32, as torch does), a
        block at a time: the temporaries stay small next to the tensor (an embedding)."""
        if dtype == self.dtype:
            return self
        source, out = self.data.reshape(-1), np.empty(self.data.size, dtype.storage)
        for start in range(0, source.size, CAST_BLOCK):
            values = Array(self.dtype, source[start : start + CAST_BLOCK]).float32()
            if dtype is FLOAT64:
                out[start : start + CAST_BLOCK] = values
            else:
                out[start : start + CAST_BLOCK] = Array.from_float32(values, dtype).data
        return Array(dtype, out.reshape(self.shape))

    def rows(self, stop: int) -> "Array":
        """The first `stop` rows (a view)."""
        return Array(self.dtype, self.data[:stop])

    @classmethod
    def from_torch(cls, tensor) -> "Array":
        dtype = dtype_named(tensor.dtype)
        t = tensor.detach().cpu().contiguous()
        if dtype is BFLOAT16:
            import torch

            t = t.view(torch.uint16)
        return cls(dtype, t.numpy())

    def to_torch(self):
        import torch

        data = self.data if self.data.flags.writeable else self.data.copy()  # a mapped file
        out = torch.from_numpy(np.ascontiguousarray(data))
        return out.view(torch.bfloat16) if self.dtype is BFLOAT16 else out


def _round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0xFFFF
    return rounded


def _round_to_float16(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond float16's range -> inf, as in torch
        out = values.astype(np.float16).view(np.uint16)
    nan = np.isnan(values)
    if nan.any():  # numpy keeps a signalling NaN signalling; torch sets the quiet bit, as IEEE
        bits = values.view(np.uint32)[nan]
        out[nan] = ((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)
    return out.view(np.float16)
