"""The one tokenize-and-pack rule (skipv1/packing.py): documents tokenized without special tokens,
EOS after each, the stream cut at a budget and into seq_len blocks; a tokenizer without EOS is a
one-line error. Uptrain, eval and calibration all pack through it."""

import re

import numpy as np
import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from skipv1.convert.calibrate import calibration_token_blocks
from skipv1.errors import SkipV1Error
from skipv1.packing import pack_blocks, token_stream
from skipv1.textdata import embedded_documents
from skipv1.uptrain.data import load_blocks

DOCS = ["hello world", "the quick brown fox", "a"]


@pytest.fixture
def tok(tokenizer_dir):
    """The tiny tokenizer, made to add a BOS token by default, so that packing must not."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    bos = (tokenizer.eos_token, tokenizer.eos_token_id)
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos[0]} $A", special_tokens=[bos]
    )
    return tokenizer


def reference(tokenizer, docs: list[str]) -> list[int]:
    """Each document's plain ids followed by EOS, tokenized one at a time."""
    eos = tokenizer.eos_token_id
    return [i for d in docs for i in [*tokenizer(d, add_special_tokens=False)["input_ids"], eos]]


def test_eos_follows_every_document_and_no_special_token_is_added(tok):
    stream = token_stream(iter(DOCS), tok)
    assert stream.dtype == np.int64
    assert stream.tolist() == reference(tok, DOCS)
    assert tok(DOCS[0])["input_ids"][0] == tok.eos_token_id  # the tokenizer would add BOS
    assert stream[0] != tok.eos_token_id and stream[-1] == tok.eos_token_id


def test_blocks_are_the_stream_cut_into_exact_seq_len_rows(tok):
    docs = embedded_documents("validation")[:5]
    full = reference(tok, docs)
    blocks = pack_blocks(docs, tok, 64)
    assert blocks.shape == (len(full) // 64, 64)
    assert blocks.reshape(-1).tolist() == full[: blocks.size]  # the partial last block dropped


def test_a_budget_cuts_the_stream_and_the_blocks(tok):
    docs = embedded_documents("validation")[:5]
    assert token_stream(docs, tok, max_tokens=100).tolist() == reference(tok, docs)[:100]
    assert (pack_blocks(docs, tok, 16, max_blocks=3) == pack_blocks(docs, tok, 16)[:3]).all()


def test_uptrain_and_calibration_pack_the_same_blocks(tok, tmp_path):
    docs = embedded_documents("validation")[:5]
    for i, doc in enumerate(docs):
        (tmp_path / f"doc{i}.txt").write_text(doc)
    expected = pack_blocks(docs, tok, 32)
    assert (load_blocks(str(tmp_path / "*.txt"), tok, 32, "eval") == expected).all()
    calibration = calibration_token_blocks(tok, iter(docs), 4 * 32, 32)
    assert (calibration.numpy() == expected[:4]).all()


def test_a_tokenizer_without_eos_is_a_one_line_error_naming_it(tokenizer_dir, tmp_path):
    no_eos = AutoTokenizer.from_pretrained(tokenizer_dir)
    no_eos.eos_token = None
    no_eos.save_pretrained(tmp_path / "no-eos")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "no-eos")
    message = rf"tokenizer {re.escape(str(tmp_path / 'no-eos'))} has no EOS token: .* `eos_token`"
    with pytest.raises(SkipV1Error, match=message) as caught:
        token_stream(iter(DOCS), tokenizer)
    assert "\n" not in str(caught.value)
    with pytest.raises(SkipV1Error, match=message):  # calibration no longer drops EOS silently
        calibration_token_blocks(tokenizer, iter(DOCS * 50), 64, 16)
