"""The README's first uptrain command, `skipv1 uptrain recipes/tiny-cpu.yaml`, runs from a fresh
clone without a manual step: the recipe names the packaged SmolLM2 (`builtin:smollm2`), which is
converted on the fly with the default init. Only the sizes are overridden, to keep it short."""

import json
import os
from pathlib import Path

import pytest

from skipv1.uptrain.metrics import read_metrics

# the packaged SmolLM2, converted and uptrained by DeepSpeed under torchrun
pytestmark = [pytest.mark.smollm2, pytest.mark.distributed]
ROOT = Path(__file__).resolve().parent.parent


def test_tiny_cpu_recipe_runs_as_written(tmp_path, cli):
    run = tmp_path / "run"
    args = [
        "uptrain",
        ROOT / "recipes/tiny-cpu.yaml",
        "--run-dir",
        run,
        "--nproc",
        "1",
        "--quiet",
        # sizes only: one optimizer step, a small calibration set, a short eval
        "budget.tokens=2048",
        "model.calib_tokens=1024",
        "model.calib_distill_steps=2",
        "eval.every=1",
        "eval.blocks=2",
        "checkpoint.every=1",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    # a hang guard, generous for a loaded machine (alone it takes a few minutes)
    result = cli.process(*args, timeout=1500, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run / "converted" / "skipv1_conversion.json").read_text())
    assert record["init"] == "reconstruct" and record["source"] == "builtin:smollm2"
    assert record["calibration"]["tokens"] == 1024
    losses = [r["loss"] for r in read_metrics(run) if "loss" in r]
    assert len(losses) == 1 and 0 < losses[0] < 10
    assert (run / "export" / "config.json").is_file()
