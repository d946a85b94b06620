"""The token store: built once (by `skipv1 prepare-data` or the first run), reused, refused
when built for something else, and giving the batches the in-memory loader gave."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from factories import write_corpus
from transformers import AutoTokenizer

from skipv1.errors import SkipV1Error
from skipv1.packing import pack_blocks
from skipv1.textdata import DataStats, iter_documents
from skipv1.uptrain.data import InMemoryBatches, load_blocks, make_train_batches, resolve_spec
from skipv1.uptrain.recipe import load_recipe
from skipv1.uptrain.token_store import META, TOKENS, train_store


def recipe_file(tmp_path: Path, model_dir: Path, **data) -> Path:
    corpus = write_corpus(tmp_path)
    recipe = {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {
            "train": str(corpus / "train.jsonl"),
            "eval": None,
            "seq_len": 32,
            "cache_dir": str(tmp_path / "cache"),
            **data,
        },
        "budget": {"tokens": 10 * 256},
        "batch": {"global_batch_tokens": 256, "micro_batch_size": 2},
        "run_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def prepare(cli):
    """prepare(RECIPE, *EXTRA): `python -m skipv1 prepare-data RECIPE --json EXTRA` succeeds;
    returns its JSON output and stderr."""

    def _prepare(recipe: Path, *extra: str) -> dict:
        run = cli.process("prepare-data", recipe, "--json", *extra, timeout=300, as_module=True)
        assert run.returncode == 0, run.stderr
        return {"out": json.loads(run.stdout), "err": run.stderr}

    return _prepare


@pytest.mark.slow  # child processes
def test_prepare_data_builds_once_and_a_second_run_reuses_it(tmp_path, tokenizer_dir, prepare):
    recipe = recipe_file(tmp_path, tokenizer_dir)
    first = prepare(recipe, "--num-proc", "2")
    store = Path(first["out"]["path"])
    assert "building the token store" in first["err"]
    assert first["out"]["dtype"] == "uint16"  # a 320-token vocabulary
    assert (store / TOKENS).stat().st_size == first["out"]["tokens"] * 2
    stamp = (store / TOKENS).stat().st_mtime_ns
    second = prepare(recipe)
    assert "building" not in second["err"] and second["out"]["path"] == str(store)
    assert (store / TOKENS).stat().st_mtime_ns == stamp
    assert not [p for p in store.parent.iterdir() if ".tmp-" in p.name]


def test_store_batches_equal_the_in_memory_loader_s_for_any_world_size(tmp_path, tokenizer_dir):
    recipe = load_recipe(recipe_file(tmp_path, tokenizer_dir), [])
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    stored = make_train_batches(recipe, tok, log=lambda _: None)
    reference = InMemoryBatches(load_blocks(recipe.data.train, tok, 32, "train"), 8, seed=0)
    for step in (0, 3, 9):
        whole = reference.global_batch(step)
        assert (stored.global_batch(step) == whole).all()
        halves = [stored.rank_rows(step, rank, 2) for rank in range(2)]
        assert (np.concatenate(halves) == whole).all()


def test_streamed_store_keeps_the_seeded_stream_order_up_to_the_budget(tmp_path, tokenizer_dir):
    recipe = load_recipe(recipe_file(tmp_path, tokenizer_dir, streaming=True, shuffle_buffer=8), [])
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    path, meta = train_store(recipe, tok, 0, log=lambda _: None)
    assert meta["blocks"] == 10 * 8  # the budget's blocks, not the whole corpus
    stats = DataStats()
    spec = resolve_spec(recipe.data.train, stats)
    docs = iter_documents(spec, streaming=True, stats=stats, shuffle=(0, 8))
    expected = pack_blocks(docs, tok, 32, max_blocks=16)
    batches = make_train_batches(recipe, tok, log=lambda _: None).batches(0)
    assert (np.concatenate([next(batches), next(batches)]) == expected).all()


@pytest.mark.slow  # child processes
def test_an_explicit_store_built_for_another_seq_len_or_tokenizer_is_refused(
    tmp_path, tokenizer_dir, prepare
):
    recipe = recipe_file(tmp_path, tokenizer_dir)
    store = prepare(recipe)["out"]["path"]
    with pytest.raises(SkipV1Error, match=r"built with another seq_len \(32, this run needs 16\)"):
        loaded = load_recipe(recipe, [f"data.store={store}", "data.seq_len=16"])
        train_store(loaded, AutoTokenizer.from_pretrained(tokenizer_dir), 0)
    other = AutoTokenizer.from_pretrained(tokenizer_dir)
    other.add_tokens(["zzzz"])
    with pytest.raises(SkipV1Error, match="built with another tokenizer"):
        train_store(load_recipe(recipe, [f"data.store={store}"]), other, 0)


def test_a_failed_build_leaves_no_store_and_no_temp_dir(tmp_path, tokenizer_dir):
    recipe = recipe_file(tmp_path, tokenizer_dir)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \xff\xfe def " * 10)
    loaded = load_recipe(recipe, [f"data.train={bad}"])
    with pytest.raises(SkipV1Error, match=r"bad.txt is not valid UTF-8"):
        train_store(loaded, AutoTokenizer.from_pretrained(tokenizer_dir), 0, num_proc=2)
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize("streaming", [False, True])
def test_records_without_string_text_are_counted_in_the_no_block_error(
    tmp_path, tokenizer_dir, streaming
):
    """A batch of only skipped records (here: numbers in the text field) used to reach the
    tokenizer as an empty batch: an IndexError inside a fast tokenizer."""
    recipe = recipe_file(tmp_path, tokenizer_dir)
    data = tmp_path / "numbers.jsonl"
    data.write_text('{"txt": 1}\n{"txt": null}\n')
    spec = f"data.train={{files: {data}, text_field: txt}}"
    loaded = load_recipe(recipe, [spec, f"data.streaming={str(streaming).lower()}"])
    with pytest.raises(SkipV1Error, match=r"0 usable documents; 2 record\(s\) skipped: missing"):
        train_store(loaded, AutoTokenizer.from_pretrained(tokenizer_dir), 0)


@pytest.mark.slow  # child processes
def test_prepare_data_bad_input_is_one_line_exit_2(tmp_path, tokenizer_dir, cli):
    recipe = recipe_file(tmp_path, tokenizer_dir)
    run = cli.process("prepare-data", recipe, "data.store=/nowhere", timeout=300, as_module=True)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: /nowhere is not a complete token store (no readable meta.json): rebuild it with "
        "`skipv1 prepare-data`"
    ]
    assert not (Path("/nowhere") / META).exists()
