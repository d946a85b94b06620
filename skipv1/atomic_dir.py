"""One atomic-directory helper for everything that writes a directory (convert, export, the
token store, the universal-checkpoint copy, the demo's source export):
a temporary workspace beside DST whose `out/` is renamed to DST on success and which is removed
on any error, Ctrl-C or SIGTERM, so DST is either the old one, the new one, or absent."""

import contextlib
import errno
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import SkipV1Error

TMP_MARK = ".skipv1-tmp-"


class DestinationAppeared(SkipV1Error):
    """DST was created by another process while this one was writing it (nothing replaced)."""


def resolve_path(path: Path, role: str) -> Path:
    """`path` resolved, or a one-line error when it runs through a symlink loop."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as err:  # pathlib raises RuntimeError for loops
        raise SkipV1Error(
            f"{role} {path} cannot be resolved ({err}): it lies in a symlink loop or an "
            "unreadable directory; choose another path"
        ) from None


def make_writable_dir(path: Path, role: str) -> Path:
    """`path` created if needed and checked writable, or a one-line error naming `role` (the
    option or recipe key) before any work that would write there later."""
    path = resolve_path(path, role)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as err:
        raise SkipV1Error(
            f"{role} {path} cannot be created or written ({err.strerror or err}): choose a "
            "writable directory"
        ) from None
    return path


# Room for headers, config, tokenizer and provenance beyond the tensor bytes.
DISK_SLACK = 16 * 2**20


def check_room(dst: Path, need: int, role: str = "DST") -> None:
    """Before anything is written: DST's filesystem must be writable and have `need` bytes
    free (the up-front half of the disk contract; console.cli_command names a disk that fills
    up later)."""
    probe = dst.parent
    while not probe.exists():
        probe = probe.parent
    stat = os.statvfs(probe)
    if stat.f_flag & os.ST_RDONLY:
        raise SkipV1Error(
            f"{role} {dst} is on a read-only filesystem ({probe}): choose a writable place"
        )
    if not os.access(probe, os.W_OK):
        raise SkipV1Error(f"{role} {dst}: {probe} is not writable by this user: choose another")
    free = shutil.disk_usage(probe).free
    if need > free:
        raise SkipV1Error(
            f"not enough free disk for {dst}: the output needs {need / 1e9:.2f} GB and "
            f"{probe} has {free / 1e9:.2f} GB free; free some space or choose another {role}"
        )


def workspace_path(dst: Path, pid: int | None = None) -> Path:
    return dst.parent / f".{dst.name}{TMP_MARK}{os.getpid() if pid is None else pid}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_workspaces(dst: Path) -> list[Path]:
    """Removes temporary directories of earlier conversions to DST whose process is gone
    (killed with SIGKILL, or the machine went down)."""
    removed = []
    for path in dst.parent.glob(f".{dst.name}{TMP_MARK}*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class _Signals:
    """SIGINT and SIGTERM raise at once (KeyboardInterrupt, SystemExit(143)) so that cleanup runs;
    the signal is remembered because a library can turn the exception into another one
    (safetensors reports a KeyboardInterrupt inside get_tensor as a ValueError)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def handler(self, signum, frame):
        self.received = signum
        raise self.exception()

    def exception(self) -> BaseException:
        if self.received == signal.SIGINT:
            return KeyboardInterrupt()
        return SystemExit(128 + (self.received or signal.SIGTERM))

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        except Exception:
            if self.received is not None:
                raise self.exception() from None
            raise
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


@contextlib.contextmanager
def atomic_workspace(dst: Path, overwrite: bool) -> Iterator[Path]:
    """Yields a fresh workspace; its `out/` becomes DST when the block succeeds. Anything else
    (exception, Ctrl-C, SIGTERM) removes the workspace and leaves DST as it was."""
    work = workspace_path(dst)
    shutil.rmtree(work, ignore_errors=True)
    try:
        (work / "out").mkdir(parents=True)
    except OSError as err:  # e.g. a pseudo-filesystem (/proc, /sys) that passes the checks
        raise SkipV1Error(
            f"{dst} cannot be created ({err.strerror or err} at {work.parent}): choose a "
            "directory on a writable disk"
        ) from None
    try:
        with _Signals().raising():
            yield work
            _publish(work, dst, overwrite)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(work: Path, dst: Path, overwrite: bool) -> None:
    # safetensors creates files 0600; give the output the permissions the user's umask asks for.
    mode = 0o666 & ~_umask()
    for path in (work / "out").rglob("*"):
        if path.is_file():
            path.chmod(mode)
    if dst.exists() or dst.is_symlink():
        if not overwrite:  # another process created it while we were converting
            raise DestinationAppeared(
                f"{dst} appeared while it was being written: nothing was replaced"
            )
        # Move the old one aside first so DST is never a mix of old and new files.
        os.rename(dst, work / "previous")
    try:
        os.rename(work / "out", dst)
    except OSError:
        if (work / "previous").exists():
            os.rename(work / "previous", dst)
        raise
