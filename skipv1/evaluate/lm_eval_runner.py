"""Optional downstream scores through EleutherAI's lm-evaluation-harness (`pip install
'skipv1[lm-eval]'`). Each checkpoint is loaded by lm-eval itself from its directory, in this
process, where `import skipv1` has registered the SkipV1 classes: trust_remote_code stays off, so
no code from a checkpoint directory runs."""

from pathlib import Path

from ..errors import SkipV1Error

INSTALL_HINT = "pip install 'skipv1[lm-eval]' (or pip install 'lm-eval>=0.4')"


def parse_tasks(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise SkipV1Error(
            f"--tasks needs lm-evaluation-harness, not installed: {INSTALL_HINT}"
        ) from None
    return lm_eval, TaskManager


def task_manager(tasks: list[str], tasks_dir: str | None):
    """An lm-eval TaskManager that knows `tasks` (checked up front, before any model loads)."""
    _, TaskManager = _import_lm_eval()
    if tasks_dir is not None and not Path(tasks_dir).is_dir():
        raise SkipV1Error(f"--tasks-dir {tasks_dir} is not a directory of lm-eval task YAMLs")
    if tasks_dir is not None:  # indexing only the user's YAMLs is seconds faster
        manager = TaskManager(include_path=tasks_dir, include_defaults=False)
        if set(tasks) <= set(manager.all_tasks):
            return manager
    manager = TaskManager(include_path=tasks_dir)
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise SkipV1Error(
            f"unknown lm-eval task(s) {', '.join(unknown)}: see `lm-eval ls tasks`, or give "
            "--tasks-dir with your task YAMLs"
        )
    return manager


def run_lm_eval(
    path: str,
    tasks: list[str],
    manager,
    device: str,
    dtype: str,
    batch_size: int = 1,
    limit: int | None = None,
) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for one checkpoint (numeric metrics only, e.g. `acc,none`)."""
    lm_eval, _ = _import_lm_eval()
    output = lm_eval.simple_evaluate(
        model="hf",
        model_args={
            "pretrained": str(path),
            # skipv1's classes are registered in this process (`import skipv1`): no code from the
            # checkpoint directory is run.
            "trust_remote_code": False,
            "dtype": dtype,
            "device": device,
        },
        tasks=tasks,
        batch_size=batch_size,
        limit=limit,
        task_manager=manager,
        log_samples=False,
        bootstrap_iters=1000,
    )
    results = (output or {}).get("results", {})
    return {
        task: {
            metric: float(value)
            for metric, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        for task, metrics in results.items()
    }
