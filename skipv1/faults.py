"""Fault injection for the tests: `SKIPV1_FAULT=POINT[:N][@RANK]` makes the process SIGKILL itself
(kill -9: no cleanup, no flush, exactly what a crash or the OOM killer leaves) the N-th time
(default 1) it reaches the named point, on every rank or only on rank RANK. Unset, each point
costs one dictionary lookup. The points, each placed where a kill is hardest to survive:

  metrics-line       half of a metrics.jsonl line written and flushed (metrics.py)
  checkpoint-shards  a rank's checkpoint files written, before the state file (checkpointing.py)
  checkpoint-state   trainer_state.json written, before the `complete` marker (checkpointing.py)
  checkpoint-complete  the `complete` marker written, before older checkpoints are pruned
  train-step         a training step about to start (trainer.py)
  export-weight      a weight handed to the export's shard writer (export.py)
"""

import os
import signal

FAULT_ENV = "SKIPV1_FAULT"
POINTS = (
    "metrics-line",
    "checkpoint-shards",
    "checkpoint-state",
    "checkpoint-complete",
    "train-step",
    "export-weight",
)
_reached: dict[str, int] = {}


def _armed(point: str) -> int | None:
    """The count at which `point` fires in this process, or None."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    spec, _, rank = spec.partition("@")
    name, _, count = spec.partition(":")
    if name not in POINTS:  # a typo must not make a fault test pass silently
        raise ValueError(f"{FAULT_ENV}={spec!r}: unknown point; known: {', '.join(POINTS)}")
    if name != point or (rank and rank != os.environ.get("RANK", "0")):
        return None
    return int(count or 1)


def point(name: str, before_kill=None) -> None:
    """Kills this process here if SKIPV1_FAULT names this point and its count is reached;
    `before_kill` runs first (to leave a half-done write behind)."""
    at = _armed(name)
    if at is None:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == at:
        if before_kill is not None:
            before_kill()
        os.kill(os.getpid(), signal.SIGKILL)
