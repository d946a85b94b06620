"""Read-only and full filesystems, for real: each test mounts a small tmpfs (skipped where this
user cannot mount, e.g. without root). Up front, convert, export and demo refuse a read-only or
too small destination with one line; a disk that fills up mid-write is one line too, and the
atomic outputs leave nothing behind."""

import subprocess

import pytest
import torch
import yaml
from factories import make_skipv1_checkpoint

from skipv1.errors import SkipV1Error
from skipv1.uptrain.export import write_export


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(size: str, read_only: bool = False):
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        run = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True
        )
        if run.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {run.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def one_line(run, expected: str) -> None:
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr
    assert expected in run.stderr, run.stderr


@pytest.mark.slow  # child processes
def test_convert_to_a_read_only_or_too_small_filesystem_is_one_line(checkpoint, tmpfs, cli):
    src = checkpoint("src")
    read_only = tmpfs("1m", read_only=True)
    convert = ("convert", src, read_only / "out", "--init", "keep")
    one_line(cli.process(*convert, timeout=300, as_module=True), "read-only filesystem")
    small = tmpfs("16k")
    convert = ("convert", src, small / "out", "--init", "keep")
    one_line(cli.process(*convert, timeout=300, as_module=True), "not enough free disk")
    assert not any(small.iterdir())


def test_export_to_a_read_only_or_too_small_filesystem_is_refused(tmp_path, tokenizer_dir, tmpfs):
    model_dir = tmp_path / "model"
    model = make_skipv1_checkpoint(model_dir, skip_v_heads=2, tokenizer_dir=tokenizer_dir)
    info = {"dtype": "float32", "model": str(model_dir), "tokens": 0, "steps": 0}
    weights = model.state_dict()
    with pytest.raises(SkipV1Error, match="read-only filesystem"):
        write_export(weights, model_dir, tmpfs("1m", read_only=True) / "export", info, "")
    small = tmpfs("16k")
    with pytest.raises(SkipV1Error, match="not enough free disk"):
        write_export(weights, model_dir, small / "export", info, "")
    assert not any(small.iterdir())
    assert torch.equal(model.state_dict()["lm_head.weight"], weights["lm_head.weight"])


@pytest.mark.slow  # a child process
def test_demo_out_on_a_read_only_filesystem_is_one_line(tmpfs, cli):
    read_only = tmpfs("1m", read_only=True)
    demo = cli.process("demo", "--out", read_only / "demo", timeout=300, as_module=True)
    one_line(demo, "read-only filesystem")


@pytest.mark.slow  # a child process
def test_a_disk_that_fills_up_mid_write_is_one_line_and_leaves_no_temp_dir(
    tmp_path, tokenizer_dir, tmpfs, cli
):
    """The token store has no size estimate up front: it meets ENOSPC while writing."""
    text = tmp_path / "train.txt"
    text.write_text(
        "".join(f"line {i} of a text long enough to fill a small disk\n" for i in range(8000))
    )
    cache = tmpfs("32k")
    recipe = {
        "model": {"path": str(tokenizer_dir), "dtype": "float32"},
        "data": {"train": str(text), "eval": None, "seq_len": 32, "cache_dir": str(cache)},
        "budget": {"tokens": 10 * 256},
        "batch": {"global_batch_tokens": 256, "micro_batch_size": 2},
        "run_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run = cli.process("prepare-data", path, timeout=300, as_module=True)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert errors == [run.stderr.splitlines()[-1]], run.stderr  # one error line, the last
    assert "no space left on the device: free some space" in errors[0]
    leftovers = [p for p in cache.rglob("*") if p.is_file()]
    assert leftovers == [], leftovers
