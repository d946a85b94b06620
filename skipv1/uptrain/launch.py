"""Starting ranks. `skipv1 uptrain --nproc N` spawns N local ranks with torchrun (which sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR); multi-node runs use the DeepSpeed launcher with a
hostfile or SLURM's srun (see docs/uptrain.md), which set the same variables."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import SkipV1Error

ERROR_FILE_ENV = "SKIPV1_ERROR_FILE"


def is_worker() -> bool:
    """True under torchrun, the DeepSpeed launcher or any launcher that sets WORLD_SIZE."""
    return "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(recipe: Path | None, overrides: list[str], nproc: int) -> int:
    """Runs `python -m skipv1.uptrain RECIPE OVERRIDES` on `nproc` local ranks; a rank's
    SkipV1Error comes back as this process's one-line error (exit 2)."""
    with tempfile.TemporaryDirectory() as tmp:
        error_file = Path(tmp) / "error"
        env = dict(os.environ, **{ERROR_FILE_ENV: str(error_file)})
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "skipv1.uptrain",
            *([str(recipe)] if recipe else []),
            *overrides,
        ]
        rc = subprocess.call(cmd, env=env)
        if rc != 0 and error_file.is_file() and error_file.read_text().strip():
            raise SkipV1Error(error_file.read_text().strip().splitlines()[0])
        if rc != 0:  # e.g. a rank killed or out of memory: torchrun's report above names it
            raise SkipV1Error(
                f"a rank failed (torchrun exit status {rc}; the report above names the rank and "
                "its exit code or signal) and the other ranks were stopped; rerun the same "
                "command to resume from the last complete checkpoint"
            )
        return rc


def report_error(message: str, every_rank: bool = False) -> bool:
    """Called by a rank that fails with a SkipV1Error. Under `skipv1 uptrain --nproc N` the
    message goes to the launching process, which prints it once; under another launcher only
    rank 0 prints, or every rank for an error only some ranks see (`every_rank`: another rank
    died). Returns True when this rank must exit without printing."""
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(" ".join(message.split()) + "\n")
        return True
    return not every_rank and os.environ.get("RANK", "0") != "0"


def die_with_launcher() -> None:
    """A rank dies with the launcher that started it. torchrun starts each rank in a session of
    its own (to signal it as a group), so a kill -9 of torchrun, or of its process group, left
    the rank running: training on, holding the run directory, or stuck in a collective. The
    kernel's parent-death signal (Linux prctl PR_SET_PDEATHSIG) kills it when the launcher's
    process ends; a launcher already gone before this call (the rank was reparented) ends the
    rank here."""
    if not is_worker() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    launcher = os.getppid()
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not fatal: only the guarantee is lost
    if launcher == 1 or os.getppid() != launcher:
        os._exit(1)
