"""Fault injection: a real `skipv1 uptrain` (one rank, real DeepSpeed) killed with kill -9 at chosen
points through skipv1/faults.py (`SKIPV1_FAULT=POINT:N`: the process SIGKILLs itself the N-th
time it reaches POINT), then the promises: resuming gives the uninterrupted run's losses, a
damaged newest checkpoint is skipped for the previous complete one with a warning naming it, an
export leaves the old DST as it was, a checkpoint that cannot be written never becomes the
latest. Two-rank faults (a dead or hung node, a kill of torchrun) are in test_uptrain_deepspeed.py,
beside the two-rank reference run."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from factories import SKIPV1, make_skipv1_checkpoint, write_corpus
from safetensors.torch import load_file
from test_filesystems import tmpfs  # noqa: F401  (the fixture)

from skipv1.atomic_dir import TMP_MARK
from skipv1.uptrain.checkpointing import COMPLETE, STATE_FILE, complete_checkpoints
from skipv1.uptrain.metrics import read_metrics

pytestmark = pytest.mark.distributed
STEPS = 6
KILLED = -9  # a child's return code after SIGKILL


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny converted model, a corpus and a 6-step recipe: one rank, ZeRO-0, a checkpoint
    every 2 steps."""
    root = tmp_path_factory.mktemp("faults")
    make_skipv1_checkpoint(root / "model", skip_v_heads=2, tokenizer_dir=tokenizer_dir)
    corpus = write_corpus(root)
    recipe = {
        "model": {"path": str(root / "model"), "dtype": "float32"},
        "data": {"train": str(corpus / "train.jsonl"), "eval": None, "seq_len": 64},
        "budget": {"tokens": STEPS * 1024},
        "batch": {"global_batch_tokens": 1024, "micro_batch_size": 4},
        "optim": {"lr": 3e-3},
        "deepspeed": {"zero_stage": 0},
        "checkpoint": {"every": 2, "keep_last": 2},
        "log": {"progress": False},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root


def uptrain(workdir: Path, run: str, *overrides: str, fault: str | None = None):
    cmd = [SKIPV1, "uptrain", str(workdir / "recipe.yaml"), *overrides]
    cmd += ["--run-dir", str(workdir / run), "--quiet"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("SKIPV1_FAULT", None)
    if fault:
        env["SKIPV1_FAULT"] = fault
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def losses(run_dir: Path) -> dict[int, float]:
    steps = [r["step"] for r in read_metrics(run_dir) if "loss" in r]
    assert len(steps) == len(set(steps)), f"duplicate metrics rows: {steps}"
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def step_names(ckpt_dir: Path) -> list[str]:
    return [p.name for p in complete_checkpoints(ckpt_dir)]


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def reference(workdir) -> Path:
    """The uninterrupted run."""
    done = uptrain(workdir, "reference")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir / "reference"


def test_kill_9_at_each_write_point_then_resume_gives_the_uninterrupted_run(workdir, reference):
    run, ckpts = workdir / "killed", workdir / "killed" / "checkpoints"

    # 1. killed half-way through writing step 3's metrics line (after checkpoint 2)
    died = uptrain(workdir, "killed", fault="metrics-line:3")
    assert died.returncode == KILLED, died.stderr[-2000:]
    assert not (run / "metrics.jsonl").read_text().endswith("\n")
    assert step_names(ckpts) == ["step_00000002"]

    # 2. killed at step 4's checkpoint with the state file written, before the `complete` marker
    died = uptrain(workdir, "killed", fault="checkpoint-state:1")
    assert died.returncode == KILLED, died.stderr[-2000:]
    assert "dropped the cut last line" in died.stderr
    assert "(step 2)" in died.stderr  # resumed from checkpoint 2
    assert (ckpts / "step_00000004" / STATE_FILE).is_file()
    assert step_names(ckpts) == ["step_00000002"]  # the marker did not move

    # 3. killed right after step 4's marker, before the older checkpoints are pruned
    died = uptrain(workdir, "killed", fault="checkpoint-complete:1")
    assert died.returncode == KILLED, died.stderr[-2000:]
    assert "(step 2)" in died.stderr
    assert step_names(ckpts) == ["step_00000002", "step_00000004"]

    # 4. the newest checkpoint damaged (a model-state file cut short, as a lost page cache can
    # leave it), an old export in place, and the run killed while writing its new export
    states = ckpts / "step_00000004" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[: states.stat().st_size // 2])
    shutil.copytree(reference / "export", run / "export")
    old_export = snapshot(run / "export")
    died = uptrain(workdir, "killed", fault="export-weight:3")
    assert died.returncode == KILLED, died.stderr[-2000:]
    flat = " ".join(died.stderr.split())  # rich may wrap the warning
    assert f"skipping checkpoint {ckpts / 'step_00000004'}: mp_rank_00" in flat
    assert "(step 2)" in flat
    assert snapshot(run / "export") == old_export
    # a kill -9 cannot clean up: its workspace stays until the next export to that DST removes
    # it (test_export_atomic.py::test_an_export_removes_the_workspace_a_killed_export_left)
    (work,) = [p for p in run.iterdir() if TMP_MARK in p.name]
    assert not Path(f"/proc/{work.name.rsplit('-', 1)[1]}").exists()

    # all six steps trained once the damaged checkpoint was skipped: the uninterrupted losses
    expected, got = losses(reference), losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert max(abs(expected[s] - got[s]) for s in expected) <= 1e-6
    assert step_names(ckpts) == ["step_00000004", "step_00000006"]


def test_a_checkpoint_write_that_fills_the_disk_never_becomes_the_latest(workdir, tmpfs):  # noqa: F811
    """Each checkpoint is ~2 MB: step 2's fits in 3 MB, step 4's does not."""
    disk = tmpfs("3m")
    run = uptrain(workdir, "full-disk", f"checkpoint.dir={disk}", "budget.tokens=4096")
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on the device" in errors[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert step_names(disk) == ["step_00000002"]
    assert not (disk / "step_00000004" / COMPLETE).exists()


def test_an_offline_export_killed_mid_write_keeps_the_old_destination(workdir, reference, tmp_path):
    """`skipv1 export RUN_DIR DST --overwrite` killed while writing: the old DST stays as it was;
    the next export replaces it and removes the dead one's workspace."""
    dst = tmp_path / "export"
    shutil.copytree(reference / "export", dst)
    (dst / "old-marker").write_text("the export being replaced")
    old = snapshot(dst)
    cmd = [SKIPV1, "export", str(reference), str(dst), "--overwrite"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", SKIPV1_FAULT="export-weight:2")
    died = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert died.returncode == KILLED, died.stderr[-2000:]
    assert snapshot(dst) == old
    env.pop("SKIPV1_FAULT")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (dst / "old-marker").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no workspace left
    fresh, ended = (
        load_file(dst / "model.safetensors"),
        load_file(reference / "export" / "model.safetensors"),
    )
    assert fresh.keys() == ended.keys()
    assert all(torch.equal(fresh[k], ended[k]) for k in ended)
