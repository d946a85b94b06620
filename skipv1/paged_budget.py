"""Sizing a continuous-batching (paged) cache by its memory, on either transformers version we run on.

`ContinuousBatchingConfig(num_blocks=N)` means different memory on the two versions:
- 5.24 turns N into bytes with the source's block: `page_size` tokens of every layer at n_kv key
  and n_kv value heads. A SkipV1 model then gets the source's memory for N blocks, which holds
  more of its smaller blocks (1.19x the tokens for SmolLM2 at s = 1).
- 5.25 turns N into bytes with the model's own block (the sum of its allocators'
  `bytes_per_block`, the KV formula for SkipV1): N blocks hold the same tokens as the source's N,
  in less memory.
A side-by-side comparison at a fixed KV memory therefore asks for a number of bytes, and this
module turns it into the `num_blocks` the installed transformers reads.
"""

import torch
import transformers
from packaging.version import Version

from .modeling.layout import kv_layout

# the first release that counts `num_blocks` in the model's own block bytes
OWN_BLOCKS_SINCE = Version("5.25.0")


def counts_own_blocks() -> bool:
    return Version(transformers.__version__).release >= OWN_BLOCKS_SINCE.release


def source_block_bytes(config, page_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of the model's source: `page_size` tokens of every layer at n_kv key
    and n_kv value heads (a side-by-side budget is a number of these)."""
    return kv_layout(config).with_skip(0).bytes_per_token(dtype.itemsize) * page_size


def block_bytes(config, page_size: int, dtype: torch.dtype) -> int:
    """Bytes that the installed transformers counts per `num_blocks` unit for this model."""
    if not counts_own_blocks():
        return source_block_bytes(config, page_size, dtype)
    return kv_layout(config).bytes_per_token(dtype.itemsize) * page_size


def num_blocks_for_bytes(config, kv_bytes: int, page_size: int, dtype: torch.dtype) -> int:
    """The `num_blocks` that gives this model a paged cache of at most `kv_bytes` (whole blocks)."""
    return int(kv_bytes // block_bytes(config, page_size, dtype))
