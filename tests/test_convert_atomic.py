"""The output of `skipv1 convert` appears whole or not at all: an error, Ctrl-C or SIGTERM
mid-way leaves neither DST nor the temporary directory, and stale ones are cleaned up."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import SKIPV1

from skipv1.convert import writer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from convert_speed import write_random_llama  # noqa: E402


def leftovers(dst: Path) -> list[str]:
    return [p.name for p in dst.parent.glob(f".{dst.name}.skipv1-tmp-*")]


def test_stale_workspace_of_a_dead_process_is_removed(checkpoint, tmp_path, cli):
    src, dst = checkpoint(), tmp_path / "dst"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".dst.skipv1-tmp-{dead.pid}"
    (stale / "out").mkdir(parents=True)
    (stale / "out" / "model.safetensors").write_bytes(b"half")
    alive = tmp_path / f".dst.skipv1-tmp-{os.getppid()}"
    alive.mkdir()
    result = cli("convert", src, dst, "--quiet", "--init", "mean")
    assert result.exit_code == 0, result.output
    assert not stale.exists() and alive.exists()
    assert (dst / "model.safetensors").exists()


def test_error_while_writing_removes_everything(checkpoint, tmp_path, monkeypatch, cli):
    src, dst = checkpoint(), tmp_path / "dst"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "copy_range", full_disk)  # mid-shard, header written
    result = cli("convert", src, dst, "--quiet", "--init", "mean")
    assert result.exit_code == 2 and "no space left on the device" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not dst.exists() and leftovers(dst) == []


@pytest.mark.slow  # a 200 MB conversion in a child process
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_conversion_leaves_nothing(tmp_path, sig, code):
    # ~200 MB in 3 shards; 20 MB output shards, so a signal after the first one is mid-way.
    src = write_random_llama(
        tmp_path / "src", hidden=1024, intermediate=2048, layers=6, heads=16, kv_heads=16,
        vocab=8192,
    )  # fmt: skip
    dst = tmp_path / "dst"
    proc = subprocess.Popen(
        [
            SKIPV1,
            "convert",
            str(src),
            str(dst),
            "--quiet",
            "--init",
            "mean",
            "--shard-size",
            "20MB",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".dst.skipv1-tmp-*/out/model-00001-*")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code, proc.stderr.read()
    assert not dst.exists() and leftovers(dst) == []
