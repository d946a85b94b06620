"""Starting ranks. `skipv1 uptrain --nproc N` spawns N local ranks with torchrun (which sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR); multi-node runs use the DeepSpeed launcher with a
hostfile or SLURM's srun (see docs/uptrain.md), which set the same variables."""

import contextlib
import logging
import os
import socket
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
    """Runs `python -m skipv1.uptrain RECIPE OVERRIDES` on `nproc` local ranks through torchrun's
    own entry point, in this process: a rank's SkipV1Error, or a rank that died (killed, out of
    memory), comes back as this process's one line (exit 2) instead of torchrun's traceback."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv = ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1"]
    argv += ["--master-port", str(free_port()), "-m", "skipv1.uptrain"]
    argv += [*([str(recipe)] if recipe else []), *overrides]
    # Our line replaces the agent's log lines (the SIGTERMs it sends, its failure report).
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with (
        tempfile.TemporaryDirectory() as tmp,
        _environ(ERROR_FILE_ENV, Path(tmp) / "error") as errors,
    ):
        try:
            run(parse_args(argv))
        except ChildFailedError as failed:
            raise SkipV1Error(failure_message(failed, _first_line(errors))) from None
        except SignalException as stopped:  # Ctrl-C or a SIGTERM to this process
            raise SkipV1Error(
                f"stopped by {stopped.sigval.name}; the ranks were stopped; rerun the same "
                "command to resume from the last complete checkpoint"
            ) from None
    return 0


def failure_message(failed, reported: str | None) -> str:
    """One line for a failed torchrun: what a rank reported (a SkipV1Error) if the first rank to
    fail exited by itself, else which rank died of which signal, then what the others saw."""
    rank, first = root_failure(failed.failures)
    if first.exitcode >= 0 and reported:
        return reported
    if first.exitcode < 0:
        name = first.signal_name()
        cause = " (the out-of-memory killer or a kill -9)" if name == "SIGKILL" else ""
        died = f"rank {rank} was killed by {name}{cause}"
    else:
        died = f"rank {rank} exited with status {first.exitcode} (its output above says why)"
    then = reported or (
        "the other ranks were stopped; rerun the same command to resume from the last "
        "complete checkpoint"
    )
    return f"{died}; then {then}"


# Signals a rank gets for another rank's failure: torchrun's stop (SIGTERM), a collective's
# abort when its peer is gone (SIGABRT).
FOLLOW_ON_SIGNALS = {"SIGTERM", "SIGINT", "SIGHUP", "SIGABRT"}


def root_failure(failures: dict) -> tuple:
    """(rank, ProcessFailure) of the failure that caused the others: a rank killed by any other
    signal (SIGKILL: kill -9 or the out-of-memory killer; a crash) first, then a rank that
    exited by itself (its report), then a rank stopped for another's failure. Within one kind
    the earliest. torchrun's own pick, the earliest timestamp alone, is in whole seconds, so a
    tie names the lower rank: often the survivor."""

    def kind(rank: int) -> tuple:
        failure = failures[rank]
        if failure.exitcode >= 0:
            return 1, failure.timestamp
        return (2 if failure.signal_name() in FOLLOW_ON_SIGNALS else 0), failure.timestamp

    rank = min(failures, key=kind)  # ties keep torchrun's order
    return rank, failures[rank]


def _first_line(path: Path) -> str | None:
    text = path.read_text().strip() if path.is_file() else ""
    return text.splitlines()[0] if text else None


@contextlib.contextmanager
def _environ(key: str, value: Path):
    """`key=value` in this process's environment (which the ranks inherit) for the block."""
    old = os.environ.get(key)
    os.environ[key] = str(value)
    try:
        yield value
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


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
