"""Recipe schema, schedule, batch order and bad data: fast tests, no process group."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from skipv1.convert.options import ConvertOptions
from skipv1.errors import SkipV1Error
from skipv1.uptrain.data import (
    InMemoryBatches,
    load_blocks,
    rank_micro_batches,
)
from skipv1.uptrain.recipe import gradient_accumulation, load_recipe, total_steps
from skipv1.uptrain.schedule import lr_multiplier

REPO = Path(__file__).resolve().parents[1]


def write_recipe(path: Path, **sections) -> Path:
    base = {
        "model": {"path": str(path.parent)},
        "data": {"train": "embedded:train", "seq_len": 32},
        "budget": {"tokens": 4096},
        "batch": {"global_batch_tokens": 256, "micro_batch_size": 2},
    }
    for key, value in sections.items():
        base.setdefault(key, {}).update(value)
    path.write_text(yaml.safe_dump(base))
    return path


def test_defaults_follow_the_paper(tmp_path):
    r = load_recipe(write_recipe(tmp_path / "r.yaml"))
    o = r.optim
    assert (o.lr, o.betas, o.weight_decay, o.warmup_fraction, o.min_lr_ratio) == (
        1.5e-4,
        [0.9, 0.95],
        0.1,
        0.1,
        0.1,
    )
    assert total_steps(r) == 16 and gradient_accumulation(r, 2) == 2


def test_an_on_the_fly_conversion_calibrates_on_the_training_text_unless_told(tmp_path):
    """...and on 131,072 tokens of it, 4x `skipv1 convert`'s default (the better start measured
    in docs/results/recovery_smollm2_options.md), unless told."""
    train = tmp_path / "a.jsonl"
    train.write_text('{"text": "some words"}\n')
    model, data = {"path": None, "source": str(tmp_path)}, {"train": str(train)}
    r = load_recipe(write_recipe(tmp_path / "r.yaml", model=model, data=data))
    assert r.model.calib_data == str(train)
    assert r.model.convert_options().calib_tokens == 131072 == 4 * ConvertOptions().calib_tokens
    model.update(calib_data="embedded:train", calib_tokens=4096)
    r = load_recipe(write_recipe(tmp_path / "r.yaml", model=model, data=data))
    assert r.model.calib_data == "embedded:train"
    assert r.model.convert_options().calib_tokens == 4096


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown recipe key `optim.lrr`: allowed keys in `optim` are lr,"),
        (["colour=red"], "unknown recipe key `colour`"),
        (["optim.lr=fast"], "`optim.lr` must be float"),
        (["deepspeed.zero_stage=4"], "`deepspeed.zero_stage` is 4: allowed values are 0, 1, 2, 3"),
        (["model.dtype=int8"], "allowed values are float32, bfloat16, float16"),
        (["eval.every=yes"], "`eval.every` must be int"),
        (["budget.fraction=0.1"], "set exactly one of `budget.tokens` and `budget.fraction`"),
        (["batch.global_batch_tokens=100"], "must be a multiple of `data.seq_len`"),
        (["deepspeed.offload_params=true"], "needs `deepspeed.zero_stage: 3`"),
        (["model.source=/x"], "set exactly one of `model.path`"),
        (["budget.tokens=10"], "less than one step"),
        (["checkpoint.resume=sometimes"], "allowed values are auto, never or an existing"),
        (["optim"], "is not `dotted.key=value`"),
        (["deepspeed.zero_stage=true"], "`deepspeed.zero_stage` is True: allowed values are 0,"),
        (["optim.warmup_fraction=1"], "`optim.warmup_fraction` is 1.0: it must be in [0, 1)"),
        (["log.every=0"], "`log.every` is 0: it must be positive"),
        (["optim.betas=[0.9]"], "`optim.betas` is [0.9]: give two numbers in [0, 1)"),
        (["budget.tokens=4096.5"], "recipe key `budget.tokens` must be int, got float 4096.5"),
        (["optim=3"], "`optim` must be a mapping of keys"),
        (["optim.lr=inf"], "`optim.lr` is inf: it must be a finite number"),
        (["optim.lr=nan"], "`optim.lr` is nan: it must be"),
        (["optim.grad_clip=.inf"], "`optim.grad_clip` is inf: it must be a finite number"),
    ],
)
def test_schema_errors_name_the_key(tmp_path, overrides, message):
    with pytest.raises(SkipV1Error) as err:
        load_recipe(write_recipe(tmp_path / "r.yaml"), overrides)
    assert message in str(err.value)


def test_overrides_parse_yaml_values(tmp_path):
    r = load_recipe(
        write_recipe(tmp_path / "r.yaml"),
        ["optim.lr=3e-4", "deepspeed.zero_stage=3", "data.eval=null", "optim.betas=[0.9, 0.99]"],
    )
    assert (r.optim.lr, r.deepspeed.zero_stage, r.data.eval) == (3e-4, 3, None)
    assert r.optim.betas == [0.9, 0.99]


def test_yaml_numbers_and_empty_sections(tmp_path):
    r = load_recipe(write_recipe(tmp_path / "r.yaml"), ["budget.tokens=2e4", "optim="])
    assert (r.budget.tokens, r.optim.lr, r.data.store_timeout) == (20000, 1.5e-4, 7200.0)
    assert isinstance(r.to_dict()["data"]["store_timeout"], float)


def test_batch_must_split_over_ranks(tmp_path):
    r = load_recipe(write_recipe(tmp_path / "r.yaml"))  # 8 sequences per step, micro 2
    with pytest.raises(SkipV1Error, match="not divisible by batch.micro_batch_size"):
        gradient_accumulation(r, 3)


@pytest.mark.slow  # a child process: ~8 s of imports
def test_cli_schema_error_is_one_line_exit_2(tmp_path, cli):
    recipe = write_recipe(tmp_path / "r.yaml", optim={"lr": "fast"})
    result = cli.process("uptrain", recipe)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: recipe key `optim.lr` must be float, got str 'fast'"]


def test_a_batch_that_does_not_split_over_nproc_ranks_is_one_line_before_any_rank(tmp_path, cli):
    recipe = write_recipe(tmp_path / "r.yaml")  # 8 sequences per step, micro 2
    result = cli.process("uptrain", recipe, "--nproc", "3")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: the global batch (8 sequences") and "x 3 ranks" in line


@pytest.mark.parametrize("name", ["tiny-cpu", "smollm2-135m", "llama2-7b", "mistral-7b"])
def test_shipped_recipes_validate(name, tmp_path):
    load_recipe(REPO / "recipes" / f"{name}.yaml", [f"run_dir={tmp_path}"])


def test_schedule_warms_up_then_decays_to_min_ratio():
    lrs = [lr_multiplier(s, 100, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(0.1)


@pytest.mark.parametrize("total, warmup", [(100, 10), (16, 2), (10, 0)])
def test_schedule_is_transformers_cosine_with_warmup_one_step_earlier(total, warmup):
    """schedule.py says why we keep our own: transformers' cosine ending on our last step
    (num_training_steps=total - 1) matches ours; its warmup is ours minus 1/warmup."""
    import torch
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total - 1, min_lr_rate=0.1)
    for step in range(total):
        ours, theirs = lr_multiplier(step, total, warmup, 0.1), hf.lr_lambdas[0](step)
        shift = 1 / warmup if step < warmup else 0.0
        assert abs(ours - (theirs + shift)) < 1e-12, step


def test_batch_order_is_seeded_and_independent_of_ranks():
    blocks = np.arange(40).reshape(20, 2)
    a, b = InMemoryBatches(blocks, 8, seed=3), InMemoryBatches(blocks, 8, seed=3)
    assert all((a.global_batch(s) == b.global_batch(s)).all() for s in range(6))
    assert not (InMemoryBatches(blocks, 8, seed=4).global_batch(0) == a.global_batch(0)).all()
    resumed = next(a.batches(start_step=4))
    assert (resumed == b.global_batch(4)).all()  # epoch 2 starts inside step 2: still exact
    batch = a.global_batch(1)
    two = [m for r in range(2) for m in rank_micro_batches(batch, r, 2, 2)]
    one = rank_micro_batches(batch, 0, 1, 2)
    assert all((x == y).all() for x, y in zip(two, one, strict=True))


def _tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_empty_files_and_records_without_text_are_counted_and_skipped(tmp_path, tokenizer_dir):
    (tmp_path / "empty.jsonl").write_text("")
    lines = [{"text": "hello world " * 20}, {"other": 1}, {"text": None}, {"text": "  "}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.warns(UserWarning) as caught:
        blocks = load_blocks(str(tmp_path / "*.jsonl"), _tok(tokenizer_dir), 16, "train")
    messages = " ".join(str(w.message) for w in caught)
    assert "skipped 1 empty file" in messages and "skipped 3 record(s)" in messages
    assert blocks.shape[1] == 16


def test_undecodable_bytes_name_the_file(tmp_path, tokenizer_dir):
    (tmp_path / "good.txt").write_text("fine text " * 50)
    (tmp_path / "bad.txt").write_bytes(b"abc \xff\xfe def " * 10)
    for streaming_limit in (None, 4):
        with pytest.raises(SkipV1Error, match=r"bad.txt is not valid UTF-8 \(byte 0xff"):
            load_blocks(str(tmp_path / "*.txt"), _tok(tokenizer_dir), 16, "train", streaming_limit)


def test_malformed_or_empty_json_data_names_the_file_and_line(tmp_path, tokenizer_dir):
    """datasets says only "An error occurred while generating the dataset" (a bare StopIteration
    for empty files, a raw pyarrow error when streamed): the error names the file and line."""
    (tmp_path / "good.jsonl").write_text(json.dumps({"text": "fine text " * 50}) + "\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{text: "no quotes"}\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text("")
    (tmp_path / "empty" / "b.jsonl").write_text("\n")
    for streaming_limit in (None, 4):
        with pytest.raises(SkipV1Error, match=r"bad.jsonl line 2 is not JSON \(Expecting prop"):
            load_blocks(
                str(tmp_path / "*.jsonl"), _tok(tokenizer_dir), 16, "train", streaming_limit
            )
        with pytest.raises(SkipV1Error, match=r"empty/b.jsonl holds no records"):
            load_blocks(str(tmp_path / "empty"), _tok(tokenizer_dir), 16, "train", streaming_limit)


def test_missing_text_column_lists_the_fields(tmp_path, tokenizer_dir):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x" * 100}) + "\n")
    for streaming_limit in (None, 4):  # streamed: found on the first record
        with pytest.raises(SkipV1Error, match=r"no text field 'text': set `text_field` to one of"):
            load_blocks(
                str(tmp_path / "a.jsonl"), _tok(tokenizer_dir), 16, "train", streaming_limit
            )


def test_all_empty_and_too_small_data_are_errors(tmp_path, tokenizer_dir):
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(SkipV1Error, match="every data file .* is empty"):
        load_blocks(str(tmp_path / "e.txt"), _tok(tokenizer_dir), 16, "train")
    (tmp_path / "s.txt").write_text("tiny")
    with pytest.raises(SkipV1Error, match="holds no block of data.seq_len=16"):
        load_blocks(str(tmp_path / "s.txt"), _tok(tokenizer_dir), 16, "train")
    with pytest.raises(SkipV1Error, match="fewer than one global batch"):
        InMemoryBatches(np.zeros((3, 16), dtype=np.int64), 8, seed=0)
