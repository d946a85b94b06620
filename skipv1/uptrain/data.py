"""Training data: datasets -> tokenize and pack into `seq_len` blocks (packing.py: EOS after
every document) -> a deterministic, resumable order of global batches.

The train blocks come from a token store (token_store.py), tokenized once. The order is a pure
function of (seed, step): global batch `step` is blocks `step * B .. (step + 1) * B - 1` of an
endless sequence of seeded per-epoch permutations (the first pass of streamed data keeps the
seeded stream's order). The only resume state is therefore the step, resuming costs nothing,
and it does not depend on the number of ranks, so a run can resume on a different world size
with the same batches. Each rank reads only its contiguous slice of every global batch.

Bad data never hangs: zero-byte files and records whose text is missing, empty or not a string
are skipped and counted (a warning says how many); undecodable files, a missing text column and
data smaller than one global batch are errors naming the file or key.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import SkipV1Error
from ..packing import pack_blocks
from ..textdata import DataSpec, DataStats, iter_documents, parse_data_spec


def resolve_spec(spec, stats: DataStats) -> DataSpec:
    """Parses a data spec and drops zero-byte local files (counted), erroring if none is left."""
    spec = parse_data_spec(spec)
    if spec.kind != "files":
        return spec
    kept = tuple(f for f in spec.files if Path(f).stat().st_size > 0)
    stats.skipped_files = [f for f in spec.files if f not in kept]
    if not kept:
        raise SkipV1Error(f"every data file in {spec.describe()} is empty: give non-empty files")
    return DataSpec("files", kept, spec.name, spec.config, spec.split, spec.text_field)


def load_blocks(spec, tokenizer, seq_len: int, what: str, limit: int | None = None) -> np.ndarray:
    """All blocks of a (non-streaming) source as an [n, seq_len] array, or the first `limit`."""
    stats = DataStats()
    spec = resolve_spec(spec, stats)
    docs = iter_documents(spec, streaming=limit is not None, stats=stats)
    blocks = pack_blocks(docs, tokenizer, seq_len, max_blocks=limit)
    stats.warn(what)
    if not len(blocks):
        raise stats.no_block(what, spec, seq_len)
    return blocks


class InMemoryBatches:
    """Global batches from tokenized blocks (in memory or memory-mapped), reshuffled every
    epoch."""

    def __init__(self, blocks: np.ndarray, blocks_per_step: int, seed: int):
        if len(blocks) < blocks_per_step:
            raise SkipV1Error(
                f"the train data gives {len(blocks)} blocks of data.seq_len tokens, fewer than "
                f"one global batch ({blocks_per_step} = batch.global_batch_tokens / "
                "data.seq_len): add data or lower batch.global_batch_tokens"
            )
        self.blocks, self.per_step, self.seed = blocks, blocks_per_step, seed
        self._perms: dict[int, np.ndarray] = {}

    def epochs_for(self, steps: int) -> float:
        return steps * self.per_step / len(self.blocks)

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: self._order(epoch)}
        return self._perms[epoch]

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.blocks))

    def rank_rows(self, step: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """This rank's contiguous slice of global batch `step`; only its blocks are read."""
        n, per_rank = len(self.blocks), self.per_step // world_size
        first = step * self.per_step + rank * per_rank
        rows = [self.blocks[self._perm(p // n)[p % n]] for p in range(first, first + per_rank)]
        return np.stack(rows).astype(np.int64)

    def global_batch(self, step: int) -> np.ndarray:
        return self.rank_rows(step)

    def batches(self, start_step: int, rank: int = 0, world_size: int = 1) -> Iterator[np.ndarray]:
        step = start_step
        while True:
            yield self.rank_rows(step, rank, world_size)
            step += 1


class StreamedBatches(InMemoryBatches):
    """Batches of a streamed corpus stored in stream order: the first pass reads the stored
    blocks in that order (the seeded stream's), later passes (a budget longer than the data)
    in seeded permutations."""

    def _order(self, epoch: int) -> np.ndarray:
        return np.arange(len(self.blocks)) if epoch == 0 else super()._order(epoch)


def rank_micro_batches(global_batch: np.ndarray, rank: int, world_size: int, micro: int):
    """This rank's contiguous slice of a global batch, cut into micro-batches."""
    per_rank = len(global_batch) // world_size
    mine = global_batch[rank * per_rank : (rank + 1) * per_rank]
    return [mine[i : i + micro] for i in range(0, per_rank, micro)]


def make_train_batches(recipe, tokenizer, local_rank: int = 0, log=print):
    """The recipe's train batches, read from its token store (built first if missing)."""
    from .token_store import open_blocks, train_store

    d = recipe.data
    path, meta = train_store(recipe, tokenizer, local_rank, d.resolved_num_proc(), log)
    batches = StreamedBatches if d.streaming else InMemoryBatches
    return batches(open_blocks(path, meta), recipe.blocks_per_step, d.seed)
