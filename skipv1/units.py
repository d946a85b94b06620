"""The two small vocabularies every command shares: byte sizes and dtype names."""

import re

from .errors import SkipV1Error

# Weights and training precisions by name; "auto" (where a command takes it) means "the source's".
DTYPE_NAMES = ("bfloat16", "float16", "float32")


def torch_dtype(name: str):
    import torch

    if name not in DTYPE_NAMES:
        raise SkipV1Error(f"dtype {name!r} is unknown: choose one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, name)


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
