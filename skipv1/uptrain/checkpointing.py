"""Checkpoints: DeepSpeed's own (model, optimizer, lr scheduler; ZeRO shards per rank) plus
`trainer_state.json` (step, tokens, data position, world size) and per-rank RNG states.

A checkpoint directory `step_XXXXXXXX` counts only once rank 0 has written its `complete` marker,
after a barrier that every rank reaches when its shards are on disk. A run killed mid-save
leaves a directory without the marker, which `resume: auto` ignores and the next save replaces.

Resuming on a different number of ranks: ZeRO shards are partitioned by the data-parallel world
size, so rank 0 first converts the checkpoint with DeepSpeed's universal-checkpoint tool
(`ds_to_universal`, into `step_XXXXXXXX.universal`, atomically) and every rank loads it with
`checkpoint.load_universal`. The data order does not depend on the world size (see data.py), so
the resumed run sees the same global batches.
"""

import errno
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from .. import faults
from ..atomic_dir import atomic_workspace, remove_stale_workspaces
from ..errors import SkipV1Error

COMPLETE = "complete"
STATE_FILE = "trainer_state.json"
TAG_RE = re.compile(r"^step_(\d{8})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete, readable checkpoints, oldest first; a marked one whose state file or tensor
    files are damaged (a disk that filled up, a file cut short) is skipped with a warning."""
    if not Path(ckpt_dir).is_dir():
        return []
    found = [
        p for p in Path(ckpt_dir).iterdir() if TAG_RE.match(p.name) and (p / COMPLETE).is_file()
    ]
    return sorted((p for p in found if _readable(p)), key=lambda p: p.name)


def _readable(ckpt: Path) -> bool:
    """The state file parses and every torch file is a whole zip archive (torch.save's format
    ends with the zip directory, so a cut file fails this cheaply)."""
    import zipfile

    problem = None
    try:
        json.loads((ckpt / STATE_FILE).read_text())
    except (OSError, ValueError):
        problem = f"{STATE_FILE} is missing or not JSON"
    if problem is None:
        bad = [p.name for p in ckpt.rglob("*.pt") if not zipfile.is_zipfile(p)]
        problem = f"{bad[0]} is cut short or damaged" if bad else None
    if problem is None:
        return True
    from ..console import console

    console.print(f"[yellow]warning:[/] skipping checkpoint {ckpt}: {problem}", highlight=False)
    return False


def resolve_resume(resume: str, ckpt_dir: Path) -> Path | None:
    """`auto`: the latest complete checkpoint or None; `never`: None (refusing to mix a fresh
    run into a directory that holds checkpoints); else the given checkpoint directory."""
    existing = complete_checkpoints(ckpt_dir)
    if resume == "auto":
        return existing[-1] if existing else None
    if resume == "never":
        if existing:
            raise SkipV1Error(
                f"{ckpt_dir} already holds checkpoints ({existing[-1].name}) and "
                "checkpoint.resume is `never`: use resume: auto, or a new --run-dir"
            )
        return None
    path = Path(resume)
    if not (path / COMPLETE).is_file() or not (path / STATE_FILE).is_file():
        raise SkipV1Error(
            f"checkpoint.resume {path} is not a complete checkpoint (no `{COMPLETE}` marker): "
            "give a step_XXXXXXXX directory written by skipv1 uptrain"
        )
    return path


def read_state(ckpt: Path) -> dict:
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def rng_state() -> dict:
    """Plain tuples, ints and tensors only, so that it loads with torch.load(weights_only=True)
    (a run directory's files never run code on resume)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save(engine, ckpt_dir: Path, state: dict, rank: int, keep_last: int) -> Path:
    """Every rank calls this; returns the checkpoint directory once it is complete."""
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for(state["step"])
    path = ckpt_dir / tag
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if path.exists():  # an incomplete leftover of a killed run
            shutil.rmtree(path)
    _barrier()
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, save_latest=False)
        torch.save(rng_state(), path / f"rng_rank{rank}.pt")
        faults.point("checkpoint-shards")
        _barrier()
        if rank == 0:
            _write_durable(path / STATE_FILE, json.dumps(state, indent=2))
            faults.point("checkpoint-state")
            _write_durable(path / COMPLETE, "")
    except (OSError, RuntimeError) as err:
        if not _write_failure(err, path):
            raise  # a collective that failed (another rank died): the trainer names it
        raise SkipV1Error(_write_failed_message(err, path, ckpt_dir)) from None
    faults.point("checkpoint-complete")
    if rank == 0:
        prune(ckpt_dir, keep_last)
    _barrier()
    return path


def _write_failure(err: BaseException, path: Path) -> bool:
    """An error of writing the checkpoint's files (torch.save reports a full disk as a
    RuntimeError of its zip writer), not of a collective."""
    from .engine import peer_failure

    return isinstance(err, OSError) or not peer_failure(err)


def _write_failed_message(err: BaseException, path: Path, ckpt_dir: Path) -> str:
    """The `complete` marker was not written, so the previous checkpoint stays the latest."""
    free = shutil.disk_usage(ckpt_dir).free
    if getattr(err, "errno", None) == errno.ENOSPC or free < 2**20:
        cause = f"no space left on the device ({free / 2**20:.1f} MiB free)"
    else:
        cause = " ".join(str(err).split())[:200]
    found = complete_checkpoints(ckpt_dir)
    latest = f"{found[-1].name} stays the latest" if found else "there is no complete checkpoint"
    return (
        f"cannot write checkpoint {path}: {cause}; it is not marked complete, {latest}: free "
        "some space or set checkpoint.dir elsewhere, then rerun to resume"
    )


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Deletes all but the newest `keep_last` complete checkpoints (and their conversions)."""
    for old in complete_checkpoints(ckpt_dir)[:-keep_last]:
        (old / COMPLETE).unlink()  # first, so a crash mid-delete leaves no "complete" husk
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(old.with_name(old.name + ".universal"), ignore_errors=True)


def universal_copy(ckpt: Path, rank: int) -> Path:
    """The universal-checkpoint conversion of `ckpt`, made once by rank 0 (temp dir + rename)."""
    out = ckpt.with_name(ckpt.name + ".universal")
    if rank == 0 and not (out / COMPLETE).is_file():
        remove_stale_workspaces(out)
        with atomic_workspace(out, overwrite=True) as work:
            _to_universal(ckpt, work / "out")
    _barrier()
    return out


def _to_universal(ckpt: Path, tmp: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(ckpt),
        "--output_folder",
        str(tmp),
        "--inject_missing_state",
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        raise SkipV1Error(
            f"converting {ckpt} to a universal checkpoint failed ({' '.join(tail)}): resume "
            "on the world size it was saved with"
        )
    for name in (STATE_FILE, COMPLETE):
        shutil.copy(ckpt / name, tmp / name)


TRUST_HINT = "`checkpoint.trust_pickles: true` for uptrain, `--trust-checkpoint` for export"


def deepspeed_state_classes() -> list[type]:
    """The DeepSpeed classes its optimizer state files hold, beside tensors and plain data."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def check_plain_pickles(ckpt: Path, trusted: bool) -> None:
    """DeepSpeed unpickles its state files with weights_only=False, which runs any code a crafted
    file holds. Unless the user trusts the directory, each file must first load under torch's
    allow-list (weights_only=True; memory-mapped, so tensors are not read)."""
    if trusted:
        return
    for file in sorted(ckpt.glob("*.pt")):
        try:
            with torch.serialization.safe_globals(deepspeed_state_classes()):
                torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL [\w.]+", str(err))
            reason = found.group(0) if found else "not plain data"
            raise SkipV1Error(
                f"{file} holds objects outside torch's weights-only allow-list ({reason}): not "
                f"unpickling it, as that could run code; if you trust this run directory, pass "
                f"{TRUST_HINT}"
            ) from None
        except RuntimeError as err:
            raise SkipV1Error(f"{file} is damaged ({str(err).splitlines()[0][:200]})") from None


def load(engine, ckpt: Path, rank: int, world_size: int, trusted: bool = False) -> dict:
    """Restores engine, scheduler and (same world size) RNG states; returns trainer state."""
    check_plain_pickles(ckpt, trusted)
    state = read_state(ckpt)
    same_world = state["world_size"] == world_size
    source = ckpt if same_world else universal_copy(ckpt, rank)
    load_path, _ = engine.load_checkpoint(
        str(source.parent),
        tag=source.name,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if load_path is None:
        raise SkipV1Error(f"DeepSpeed could not load checkpoint {source}: it may be damaged")
    rng_file = ckpt / f"rng_rank{rank}.pt"
    if same_world and rng_file.is_file():
        try:
            set_rng_state(torch.load(rng_file, weights_only=True))
        except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError) as err:
            from ..console import console

            console.print(
                f"[yellow]warning:[/] {rng_file} is not a plain RNG state ({type(err).__name__}); "
                "not loaded (RNG states only matter for dropout, which Llama-family models "
                "do not use)",
                highlight=False,
            )
    return state
