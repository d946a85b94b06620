"""Rank 0's view of a run: a rich progress bar (tokens/s, loss, lr, ETA), `metrics.jsonl`
(one JSON object per optimizer step: step, tokens, loss, lr, tokens_per_s, tflops and mfu
(when the device's peak is known); eval records:
step, tokens, eval_loss, eval_ppl), TensorBoard when installed, W&B when configured."""

import json
from pathlib import Path

from rich.progress import TextColumn

from .. import faults
from ..console import console, step_progress
from ..errors import SkipV1Error

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: "str | Path") -> list[dict]:
    """The records of metrics.jsonl; a last line cut by a kill (no newline, not valid JSON) is
    dropped with a warning, any other bad line is an error naming it."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):
                console.print(
                    f"[yellow]warning:[/] dropped the cut last line of {path} (a killed run)",
                    highlight=False,
                )
                continue
            raise SkipV1Error(
                f"{path} line {number} is not JSON: the metrics file is damaged; remove the "
                "line (or the file) and rerun"
            ) from None
    return records


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """On resume, drops records the killed run wrote after its last complete checkpoint, so the
    file reads as one uninterrupted run."""
    path = Path(run_dir) / METRICS_FILE
    kept = [r for r in read_metrics(run_dir) if r["step"] <= last_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


class MetricsLogger:
    """Does nothing on ranks other than 0."""

    def __init__(self, run_dir: Path, recipe, enabled: bool, total_steps: int, start_step: int):
        self.enabled = enabled
        self.every = recipe.log.every
        self.tb = self.wandb = self.progress = None
        if not enabled:
            return
        self.file = open(Path(run_dir) / METRICS_FILE, "a")
        if recipe.log.tensorboard:
            self.tb = _tensorboard(Path(run_dir) / "tensorboard")
        if recipe.log.wandb_project:
            self.wandb = _wandb(recipe)
        self.progress = step_progress(
            not recipe.log.progress,
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("lr {task.fields[lr]:.2e}"),
            TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TextColumn("{task.fields[flops]}"),
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "uptrain",
            total=total_steps,
            completed=start_step,
            loss=float("nan"),
            lr=0.0,
            tps=0.0,
            flops="",
        )

    def step(self, record: dict) -> None:
        if not self.enabled:
            return
        self._write(record)
        step = record["step"]
        if step % self.every == 0:
            self.progress.update(
                self.task,
                completed=step,
                loss=record["loss"],
                lr=record["lr"],
                tps=record["tokens_per_s"],
                flops=_flops_text(record),
            )
            if self.tb:
                for key in ("loss", "lr", "tokens_per_s", "grad_norm", "tflops", "mfu"):
                    if record.get(key) is not None:
                        self.tb.add_scalar(f"train/{key}", record[key], step)
        if self.wandb:
            self.wandb.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=step)

    def eval(self, record: dict) -> None:
        if not self.enabled:
            return
        self._write(record)
        self.print(
            f"step {record['step']}: eval loss {record['eval_loss']:.4f}, "
            f"ppl {record['eval_ppl']:.3f}"
        )
        if self.tb:
            self.tb.add_scalar("eval/ppl", record["eval_ppl"], record["step"])
        if self.wandb:
            self.wandb.log({"eval/ppl": record["eval_ppl"]}, step=record["step"])

    def print(self, message: str) -> None:
        if self.enabled:
            (self.progress.console if self.progress else console).print(
                message, markup=False, soft_wrap=True
            )

    def _write(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        faults.point("metrics-line", lambda: self._write_cut(line))
        self.file.write(line)
        self.file.flush()

    def _write_cut(self, line: str) -> None:
        self.file.write(line[: len(line) // 2])
        self.file.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.progress.stop()
        self.file.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _flops_text(record: dict) -> str:
    if "mfu" in record:
        return f"MFU {record['mfu']:.1%}"
    return f"{record['tflops']:.3g} TFLOP/s" if "tflops" in record else ""


def _tensorboard(path: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(path))


def _wandb(recipe):
    try:
        import wandb
    except ImportError:
        raise SkipV1Error(
            "log.wandb_project is set but wandb is not installed: `pip install wandb` or unset it"
        ) from None
    return wandb.init(
        project=recipe.log.wandb_project, name=recipe.log.wandb_run_name, config=recipe.to_dict()
    )
