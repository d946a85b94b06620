"""skipv1.uptrain.export.write_export goes through the atomic-directory helper: a failure in the
middle of an export leaves the previous export as it was and no temporary directory."""

import os
import subprocess
import sys

import pytest
import torch
from factories import make_skipv1_checkpoint

from skipv1 import SkipV1LlamaForCausalLM
from skipv1.atomic_dir import workspace_path
from skipv1.errors import SkipV1Error
from skipv1.uptrain.export import write_export


def snapshot(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def saved_model(tmp_path, tokenizer_dir):
    """A random SkipV1 model saved with a tokenizer, and the export info for it."""
    model_dir = tmp_path / "model"
    model = make_skipv1_checkpoint(model_dir, skip_v_heads=2, tokenizer_dir=tokenizer_dir)
    info = {"dtype": "float32", "model": str(model_dir), "tokens": 0, "steps": 0}
    info.update(tokens_per_step=1, train_flops=0.0, skip_v_heads=2)
    return model, model_dir, info


def test_failed_export_keeps_the_old_destination_and_leaves_no_temp_dir(tmp_path, tokenizer_dir):
    model, model_dir, info = saved_model(tmp_path, tokenizer_dir)
    dst = tmp_path / "exports" / "final"
    write_export(model.state_dict(), model_dir, dst, info, "")
    before = snapshot(dst)

    for file in tokenizer_dir.iterdir():  # the export now fails after writing the weights
        (model_dir / file.name).unlink()
    changed = {k: v + 1 for k, v in model.state_dict().items()}
    with pytest.raises(SkipV1Error, match="cannot load the tokenizer"):
        write_export(changed, model_dir, dst, info, "", overwrite=True)
    assert snapshot(dst) == before
    assert sorted(p.name for p in dst.parent.iterdir()) == ["final"]


def test_export_streams_weights_into_shards_as_they_fill(tmp_path, tokenizer_dir):
    model, model_dir, info = saved_model(tmp_path, tokenizer_dir)
    dst = tmp_path / "export"
    stream = ((k, v) for k, v in model.state_dict().items())  # a stream, not a dict
    write_export(stream, model_dir, dst, info, "", max_shard_bytes=64 * 1024)
    shards = sorted(p.name for p in dst.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0].startswith("model-00001-of-")
    assert (dst / "model.safetensors.index.json").is_file()
    assert not list(dst.glob(".part-*"))
    loaded = SkipV1LlamaForCausalLM.from_pretrained(dst)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_an_export_removes_the_workspace_a_killed_export_left(tmp_path, tokenizer_dir):
    """A kill -9 mid-export leaves its workspace (510 MB for a real model): the next export to
    the same DST removes it, as convert does; a live process's workspace is left alone."""
    model, model_dir, info = saved_model(tmp_path, tokenizer_dir)
    dst = tmp_path / "exports" / "final"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = workspace_path(dst, dead.pid)
    (stale / "out").mkdir(parents=True)
    (stale / "out" / "model.safetensors").write_bytes(b"half written")
    live = workspace_path(dst, os.getppid())
    live.mkdir()
    write_export(model.state_dict(), model_dir, dst, info, "")
    assert not stale.exists() and live.is_dir()
    assert SkipV1LlamaForCausalLM.from_pretrained(dst) is not None
