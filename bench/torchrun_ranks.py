"""The 2-rank CPU launch the uptrain benchmarks share (uptrain_speed.py, export_memory.py): the
recipe written to a file, then `torchrun --nproc-per-node 2` of the benchmark's own file in its
worker mode, one thread per rank, this tree first on PYTHONPATH."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RANKS = 2


def rank_env(**extra: str) -> dict:
    """The environment of every process a benchmark starts (ranks and single children)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_ranks(script: str, recipe: dict, recipe_file: Path, args: list[str], env: dict) -> None:
    """`script ARGS --recipe RECIPE_FILE` on RANKS ranks; exits with the ranks' stderr if any
    rank fails."""
    recipe_file.write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS)]
    cmd += [script, *args, "--recipe", str(recipe_file)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the {RANKS}-rank run of {Path(script).name} failed:\n{run.stderr[-4000:]}")
