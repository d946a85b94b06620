"""Training data: datasets -> tokenize with the model's tokenizer -> pack into `seq_len` blocks
with EOS between documents -> a deterministic, resumable order of global batches.

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

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SkipV1Error
from ..textdata import DataSpec, open_dataset, parse_data_spec

TOKENIZE_CHUNK = 256  # documents per tokenizer call


@dataclass
class DataStats:
    documents: int = 0
    tokens: int = 0
    skipped_records: int = 0  # missing / empty / non-string text
    skipped_files: list[str] = field(default_factory=list)  # zero-byte files

    def warn(self, what: str) -> None:
        if self.skipped_files:
            warnings.warn(
                f"{what}: skipped {len(self.skipped_files)} empty file(s), e.g. "
                f"{self.skipped_files[0]}",
                stacklevel=2,
            )
        if self.skipped_records:
            warnings.warn(
                f"{what}: skipped {self.skipped_records} record(s) with a missing, empty or "
                "non-string text field",
                stacklevel=2,
            )


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


def iter_documents(spec: DataSpec, stats: DataStats, streaming: bool, shuffle=None):
    """Texts of a data source in a fixed order; `shuffle` = (seed, buffer) for streaming."""
    field_name = "text" if spec.kind == "embedded" else spec.text_field
    try:
        ds = open_dataset(spec, streaming=streaming)
        columns = getattr(ds, "column_names", None)
        if columns is not None and field_name not in columns:
            raise SkipV1Error(
                f"data {spec.describe()} has no text field {field_name!r}: set `text_field` to "
                f"one of {sorted(columns)}"
            )
        if shuffle is not None and shuffle[1] > 0:
            ds = ds.shuffle(seed=shuffle[0], buffer_size=shuffle[1])
        for record in ds:
            text = record.get(field_name)
            if not isinstance(text, str) or not text.strip():
                stats.skipped_records += 1
                continue
            stats.documents += 1
            yield text
    except SkipV1Error as err:
        raise _explain_decode_error(spec, err) from err.__cause__
    except UnicodeDecodeError as err:
        raise _explain_decode_error(spec, err) from err


def _explain_decode_error(spec: DataSpec, err: Exception) -> Exception:
    """datasets hides which file held undecodable bytes; find it (only after a failure)."""
    cause, chain = err, []
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(c, UnicodeDecodeError) for c in chain) or spec.kind != "files":
        return err
    for name in spec.files:
        try:
            Path(name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as bad:
            return SkipV1Error(
                f"data file {name} is not valid UTF-8 (byte {bad.object[bad.start]:#04x} at "
                f"offset {bad.start}): re-encode it as UTF-8 or remove it from the data"
            )
    return err


def iter_token_ids(texts: Iterator[str], tokenizer, eos_id: int) -> Iterator[list[int]]:
    """Token ids of each document followed by EOS, tokenized in chunks."""
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == TOKENIZE_CHUNK:
            yield from _encode(chunk, tokenizer, eos_id)
            chunk = []
    if chunk:
        yield from _encode(chunk, tokenizer, eos_id)


def _encode(texts: list[str], tokenizer, eos_id: int) -> Iterator[list[int]]:
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        yield [*ids, eos_id]


def pack_blocks(token_lists: Iterator[list[int]], seq_len: int) -> Iterator[np.ndarray]:
    """Concatenates documents and cuts the stream into blocks of exactly `seq_len` tokens."""
    buffer: list[int] = []
    for ids in token_lists:
        buffer.extend(ids)
        while len(buffer) >= seq_len:
            yield np.asarray(buffer[:seq_len], dtype=np.int64)
            del buffer[:seq_len]


def eos_token_id(tokenizer) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SkipV1Error("the model's tokenizer has no EOS token: it is needed between documents")
    return int(eos)


def load_blocks(spec, tokenizer, seq_len: int, what: str, limit: int | None = None) -> np.ndarray:
    """All blocks of a (non-streaming) source as an [n, seq_len] array, or the first `limit`."""
    stats = DataStats()
    spec = resolve_spec(spec, stats)
    docs = iter_documents(spec, stats, streaming=limit is not None)
    blocks = []
    for block in pack_blocks(iter_token_ids(docs, tokenizer, eos_token_id(tokenizer)), seq_len):
        blocks.append(block)
        if limit is not None and len(blocks) >= limit:
            break
    stats.warn(what)
    if not blocks:
        raise SkipV1Error(
            f"{what} data {spec.describe()} holds no block of data.seq_len={seq_len} tokens "
            f"({stats.documents} usable documents): add data or lower data.seq_len"
        )
    return np.stack(blocks)


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
