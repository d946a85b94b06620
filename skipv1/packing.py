"""Tokenize and pack: the one rule by which uptrain, its token store, eval and calibration turn
documents into token ids.

Each document is tokenized without special tokens and followed by the tokenizer's EOS id, so
EOS stands between documents and after the last; the concatenation is cut at a token budget
and into blocks of `seq_len` (a partial last block is dropped). A tokenizer without an EOS
token is an error, never a silent stream of run-together documents.
"""

from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np

from .errors import SkipV1Error

TOKENIZE_CHUNK = 256  # documents per tokenizer call


def eos_token_id(tokenizer) -> int:
    """The id that ends every document."""
    eos = tokenizer.eos_token_id
    if eos is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise SkipV1Error(
            f"the tokenizer {name} has no EOS token: it is needed between documents; set "
            "`eos_token` in its tokenizer_config.json"
        )
    return int(eos)


def encode_documents(texts: list[str], tokenizer, eos: int) -> list[list[int]]:
    """Each text's ids followed by `eos`, in one tokenizer call (a datasets.map worker calls it
    directly)."""
    if not texts:  # a fast tokenizer fails on an empty batch (a batch of only skipped records)
        return []
    return [[*ids, eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def document_ids(texts: Iterable[str], tokenizer) -> Iterator[list[int]]:
    """Each document's ids followed by EOS, tokenized TOKENIZE_CHUNK documents at a time."""
    eos = eos_token_id(tokenizer)
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == TOKENIZE_CHUNK:
            yield from encode_documents(chunk, tokenizer, eos)
            chunk = []
    if chunk:
        yield from encode_documents(chunk, tokenizer, eos)


def take_tokens(token_lists: Iterable[list[int]], max_tokens: int | None) -> Iterator[list[int]]:
    """The documents' ids until `max_tokens` in all (the last one cut); None: all of them."""
    taken = 0
    for ids in token_lists:
        if max_tokens is not None:
            ids = ids[: max_tokens - taken]
        yield ids
        taken += len(ids)
        if max_tokens is not None and taken >= max_tokens:
            return


def token_stream(texts: Iterable[str], tokenizer, max_tokens: int | None = None) -> np.ndarray:
    """The packed stream as int64 ids, at most `max_tokens` (None: every document)."""
    ids = chain.from_iterable(take_tokens(document_ids(texts, tokenizer), max_tokens))
    return np.fromiter(ids, dtype=np.int64)


def cut_blocks(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """A stream as [n, seq_len] blocks, dropping the partial last one."""
    blocks = len(stream) // seq_len
    return stream[: blocks * seq_len].reshape(blocks, seq_len)


def pack_blocks(
    texts: Iterable[str], tokenizer, seq_len: int, max_blocks: int | None = None
) -> np.ndarray:
    """The documents packed into [n, seq_len] int64 blocks, at most `max_blocks`."""
    max_tokens = None if max_blocks is None else max_blocks * seq_len
    return cut_blocks(token_stream(texts, tokenizer, max_tokens), seq_len)
