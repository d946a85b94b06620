"""Terminal output shared by the commands: rich consoles, progress bars, and the error contract
(a SkipV1Error becomes one line on stderr and exit code 2)."""

import errno
import functools
import os
import sys
from collections.abc import Callable

import click
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .errors import SkipV1Error

# Errors of the disk a command writes to: the user can fix them, so one line and exit 2 (the
# atomic outputs have removed what was half-written by the time this is printed).
DISK_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only filesystem",
    errno.EACCES: "permission denied",
}
DISK_FIX = {
    errno.ENOSPC: "free some space or choose another destination, then rerun",
    errno.EDQUOT: "free some space or choose another destination, then rerun",
    errno.EROFS: "choose a writable destination",
    errno.EACCES: "choose a destination this user can write, or fix its permissions",
}

console = Console(stderr=True)
stdout = Console(soft_wrap=True)


def byte_progress(quiet: bool = False) -> Progress:
    """A progress bar over bytes with throughput and ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
    )


def step_progress(quiet: bool = False, *extra_columns) -> Progress:
    """A progress bar over counted steps."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
    )


def fail(message: str) -> None:
    """Prints `error: message` as a single line on stderr (no wrapping, no markup)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)


DEBUG_ENV = "SKIPV1_DEBUG"


def _internal_error(err: Exception):
    if os.environ.get(DEBUG_ENV):
        raise err
    first = (str(err).splitlines() or [""])[0][:300]
    fail(
        f"internal error: {type(err).__name__}: {first} (rerun with {DEBUG_ENV}=1 for the "
        "traceback, and please report it)"
    )
    raise typer.Exit(1) from None


def cli_command(fn: Callable) -> Callable:
    """Turns SkipV1Error into one line and exit 2, Ctrl-C into exit 130, for a typer command."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.ClickException):
            raise  # typer's own exits and usage errors
        except SkipV1Error as err:
            fail(str(err))
            raise typer.Exit(err.exit_code) from None
        except OSError as err:
            if err.errno not in DISK_ERRORS:
                return _internal_error(err)
            where = f" ({err.filename})" if err.filename else ""
            fail(f"{DISK_ERRORS[err.errno]}{where}: {DISK_FIX[err.errno]}")
            raise typer.Exit(2) from None
        except Exception as err:  # a bug of ours: one line and exit 1, the traceback on request
            return _internal_error(err)
        except KeyboardInterrupt:
            fail("interrupted")
            raise typer.Exit(130) from None

    return wrapper
