"""The two small vocabularies every command shares: byte sizes and dtypes.

The dtype table is the one place a float dtype is named: its config.json / torch spelling, its
safetensors code, its size and the numpy type its bytes are held as. numpy and torch types are
resolved only when asked for, so that importing this (every command does) imports neither."""

import re
from dataclasses import dataclass

from .errors import SkipV1Error


@dataclass(frozen=True)
class DType:
    name: str  # torch's and config.json's spelling: "bfloat16"
    code: str  # safetensors': "BF16"
    itemsize: int
    storage: str  # the numpy dtype its bytes are held as (numpy has no bfloat16: its bits)

    def __str__(self) -> str:
        return self.name

    @property
    def torch(self):
        import torch

        return getattr(torch, self.name)


FLOAT64 = DType("float64", "F64", 8, "<f8")
FLOAT32 = DType("float32", "F32", 4, "<f4")
FLOAT16 = DType("float16", "F16", 2, "<f2")
BFLOAT16 = DType("bfloat16", "BF16", 2, "<u2")
DTYPES = (FLOAT64, FLOAT32, FLOAT16, BFLOAT16)  # every float dtype a checkpoint may hold
BY_CODE = {d.code: d for d in DTYPES}
BY_NAME = {d.name: d for d in DTYPES}
# Weights and training precisions by name; "auto" (where a command takes it) means "the source's".
DTYPE_NAMES = tuple(d.name for d in (BFLOAT16, FLOAT16, FLOAT32))


def dtype_named(name) -> DType:
    """The DType of a torch dtype (or its name): `torch.bfloat16` -> BFLOAT16; KeyError if none."""
    return BY_NAME[str(name).removeprefix("torch.")]


def torch_dtype(name: str):
    """A weights/training precision by name (DTYPE_NAMES) as a torch dtype."""
    if name not in DTYPE_NAMES:
        raise SkipV1Error(f"dtype {name!r} is unknown: choose one of {', '.join(DTYPE_NAMES)}")
    return BY_NAME[name].torch


def parse_bytes(text: "str | int", flag: str) -> int:
    """`17179869184`, `16GiB`, `16G`, `500MB`, `5GB` -> bytes (KiB/MiB/GiB are powers of 2,
    kB/MB/GB of 10); `flag` names the option in the error."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(i?)[bB]?\s*", str(text))
        if not match:
            size = 0
        else:
            number, unit, binary = match.groups()
            power = "kmgt".index(unit.lower()) + 1 if unit else 0
            size = int(float(number) * (1024 if binary else 1000) ** power)
    if size <= 0:
        raise SkipV1Error(f"{flag} {text} is not a size: write e.g. 5GB, 500MB, 16GiB or 1024")
    return size
