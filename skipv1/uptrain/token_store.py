"""The token store: a recipe's training text tokenized once, packed (packing.py: EOS after
every document, the concatenation cut into `seq_len` blocks) and written as one
memory-mapped token file, so that no rank tokenizes at start and resuming costs nothing.

A store is a directory `CACHE/<data>-<hash>/` holding `tokens.bin` (uint16 when the vocabulary
fits, else uint32) and `meta.json` (data spec and fingerprint, tokenizer fingerprint, seq_len,
token and block counts). The hash covers all of those, so another tokenizer, seq_len or changed
data files get another store; an explicit `data.store` built for something else is refused by
name. A store is built in a temporary directory and renamed into place: a complete directory
is the ready marker, and a build that dies leaves nothing that looks ready.

Non-streaming data is tokenized with datasets' parallel `map` (`num_proc`); streaming data (hub
corpora larger than the budget) in its seeded stream order, up to the blocks the budget needs.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..atomic_dir import DestinationAppeared, atomic_workspace, remove_stale_workspaces
from ..errors import SkipV1Error
from ..packing import document_ids, encode_documents, eos_token_id, take_tokens
from ..textdata import (
    DataSpec,
    DataStats,
    is_document,
    iter_documents,
    open_text_dataset,
    undecodable_file_named,
)
from .data import resolve_spec

STORE_VERSION = 1
META = "meta.json"
TOKENS = "tokens.bin"
WRITE_BATCH = 1000  # documents per write


def default_cache_dir() -> Path:
    env = os.environ.get("SKIPV1_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "skipv1" / "token-store"


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of what decides the token ids: the fast tokenizer's full JSON, or the vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab()))
    return hashlib.sha256(f"{text}|eos={eos_token_id(tokenizer)}".encode()).hexdigest()[:16]


def data_fingerprint(spec: DataSpec) -> list:
    """Local files by path, size and modification time; embedded text by Python version (it is
    CPython's docs); hub data by name, config and split."""
    if spec.kind == "files":
        return [[str(Path(f).resolve()), *_size_mtime(Path(f))] for f in spec.files]
    if spec.kind == "embedded":
        return ["embedded", spec.split, sys.version.split()[0]]
    return ["hub", spec.name, spec.config, spec.split, spec.text_field]


def _size_mtime(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def store_identity(spec: DataSpec, tokenizer, seq_len: int, stream: dict | None) -> dict:
    """What a store must match to be used: `stream` = seed, shuffle buffer and block limit
    for streaming data (None for data read whole)."""
    return {
        "version": STORE_VERSION,
        "data": spec.describe(),
        "data_fingerprint": data_fingerprint(spec),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": seq_len,
        "stream": stream,
    }


def store_dir(cache: Path, identity: dict) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() else "-" for c in identity["data"])[:40].strip("-")
    return Path(cache) / f"{stem}-{digest}"


def check_store(path: Path, identity: dict) -> dict:
    """The store's metadata, or an error naming what differs from `identity`."""
    meta_file = Path(path) / META
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        raise SkipV1Error(
            f"{path} is not a complete token store (no readable {META}): rebuild it with "
            "`skipv1 prepare-data`"
        ) from None
    for key, want in identity.items():
        if meta.get(key) != want:
            raise SkipV1Error(
                f"token store {path} was built with another {key} ({meta.get(key)!r}, this run "
                f"needs {want!r}): rebuild it with `skipv1 prepare-data` or drop `data.store`"
            )
    return meta


def open_blocks(path: Path, meta: dict) -> np.ndarray:
    """The store's blocks as a read-only [blocks, seq_len] memory map."""
    tokens = np.memmap(Path(path) / TOKENS, dtype=meta["dtype"], mode="r")
    blocks = meta["blocks"]
    return tokens[: blocks * meta["seq_len"]].reshape(blocks, meta["seq_len"])


def token_dtype(tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32)


# --- building -------------------------------------------------------------------------------


def build_store(
    spec: DataSpec,
    tokenizer,
    seq_len: int,
    dest: Path,
    identity: dict,
    num_proc: int = 1,
    max_blocks: int | None = None,
    shuffle: tuple[int, int] | None = None,
    log=print,
) -> dict:
    """Tokenizes and writes a store at `dest` (atomically); returns its metadata."""
    dest = Path(dest)
    log(f"building the token store {dest} (once; other ranks wait) ...")
    stats = DataStats()
    dtype = token_dtype(tokenizer)
    started = time.perf_counter()
    remove_stale_workspaces(dest)
    try:
        with atomic_workspace(dest, overwrite=False) as work:
            tmp = work / "out"
            with (tmp / TOKENS).open("wb") as out:
                if shuffle is None:
                    chunks = _parallel_token_chunks(spec, tokenizer, num_proc, stats)
                else:
                    chunks = _stream_token_chunks(spec, tokenizer, shuffle, stats)
                tokens = _write_tokens(chunks, out, dtype, max_blocks, seq_len)
            blocks = tokens // seq_len
            if blocks == 0:
                raise stats.no_block("train", spec, seq_len)
            stats.warn("train")
            meta = {
                **identity,
                "dtype": dtype.name,
                "tokens": tokens,
                "blocks": blocks,
                "documents": stats.documents,
                "skipped_records": stats.skipped_records,
                "skipped_files": stats.skipped_files,
                "seconds": round(time.perf_counter() - started, 2),
            }
            (tmp / META).write_text(json.dumps(meta, indent=1))
    except DestinationAppeared:
        if not (dest / META).is_file():
            raise
        # another builder got there first: its store holds the same data, use it
        meta = json.loads((dest / META).read_text())
    log(
        f"token store {dest}: {meta['blocks']:,} blocks of {seq_len} ({meta['tokens']:,} tokens, "
        f"{meta['documents']:,} documents) in {meta['seconds']:.1f} s"
    )
    return meta


def _write_tokens(chunks, out, dtype, max_blocks: int | None, seq_len: int) -> int:
    """Writes token chunks until `max_blocks` blocks are complete; returns the tokens kept."""
    written = 0
    for chunk in take_tokens(chunks, None if max_blocks is None else max_blocks * seq_len):
        out.write(np.asarray(chunk, dtype=dtype).tobytes())
        written += len(chunk)
    return written


def _parallel_token_chunks(spec: DataSpec, tokenizer, num_proc: int, stats: DataStats):
    """Token ids (EOS after each document) in file order, tokenized by datasets' `map`."""
    with undecodable_file_named(spec):
        ds, field_name = open_text_dataset(spec)
        ds = ds.map(
            _tokenize_batch,
            batched=True,
            num_proc=num_proc if num_proc > 1 and len(ds) >= num_proc else None,
            remove_columns=ds.column_names,
            fn_kwargs={"tokenizer": tokenizer, "field": field_name, "eos": eos_token_id(tokenizer)},
            load_from_cache_file=False,  # the store is the cache
            desc="tokenizing",
        )
    for batch in ds.iter(batch_size=WRITE_BATCH):
        for ids, ok in zip(batch["ids"], batch["ok"], strict=True):
            if ok:
                stats.documents += 1
                yield ids
            else:
                stats.skipped_records += 1
    ds.cleanup_cache_files()  # datasets' copy of the token ids (int64 lists): not kept twice


def _tokenize_batch(batch: dict, tokenizer, field: str, eos: int) -> dict:
    """The records' documents packed by `encode_documents`; a record without usable text gets
    no ids and ok=False (counted as skipped, as `iter_documents` does)."""
    texts = batch[field]
    ok = [is_document(t) for t in texts]
    encoded = iter(
        encode_documents([t for t, good in zip(texts, ok, strict=True) if good], tokenizer, eos)
    )
    return {"ids": [next(encoded) if good else [] for good in ok], "ok": ok}


def _stream_token_chunks(spec: DataSpec, tokenizer, shuffle: tuple[int, int], stats: DataStats):
    docs = iter_documents(spec, streaming=True, stats=stats, shuffle=shuffle)
    return document_ids(docs, tokenizer)


# --- for a run ------------------------------------------------------------------------------


def train_store(recipe, tokenizer, local_rank: int, num_proc: int = 1, log=print):
    """(path, metadata) of the recipe's train store: `data.store` if given (checked), else the
    cache's, built by each node's local rank 0 if missing while the other ranks wait."""
    d = recipe.data
    stats = DataStats()
    spec = resolve_spec(d.train, stats)
    stream = None
    if d.streaming:
        stream = {"seed": d.seed, "buffer": d.shuffle_buffer, "blocks": train_blocks(recipe)}
    identity = store_identity(spec, tokenizer, d.seq_len, stream)
    if d.store:
        return Path(d.store), check_store(Path(d.store), identity)
    path = store_dir(Path(d.cache_dir) if d.cache_dir else default_cache_dir(), identity)
    if not (path / META).is_file():
        if local_rank == 0:
            limit = None if stream is None else stream["blocks"]
            shuffle = None if stream is None else (d.seed, d.shuffle_buffer)
            build_store(spec, tokenizer, d.seq_len, path, identity, num_proc, limit, shuffle, log)
        else:
            _wait_for(path, d.store_timeout)
    return path, check_store(path, identity)


def train_blocks(recipe) -> int:
    """Blocks the whole budget reads (what a streamed store must hold)."""
    from .recipe import total_steps

    return total_steps(recipe) * recipe.blocks_per_step


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path / META).is_file():
        if time.monotonic() > deadline:
            raise SkipV1Error(
                f"the token store {path} was not ready after {timeout:.0f} s "
                "(data.store_timeout): build it first with `skipv1 prepare-data`"
            )
        time.sleep(1.0)


def recipe_tokenizer(recipe):
    """The tokenizer a run of `recipe` trains with, without converting anything: that of
    `model.path`, or of `model.source` (a directory, a Hub id or a builtin GGUF)."""
    from transformers import AutoTokenizer

    from ..convert.api import BUILTIN_SOURCES

    m = recipe.model
    source = m.path or m.source
    try:
        if source in BUILTIN_SOURCES:
            gguf = BUILTIN_SOURCES[source]()
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        return AutoTokenizer.from_pretrained(source, trust_remote_code=m.trust_remote_code)
    except (OSError, ValueError) as err:
        raise SkipV1Error(f"cannot load the tokenizer of {source}: {err}") from None
