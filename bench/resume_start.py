"""Launch to first optimizer step: `skipv1 uptrain` started fresh (step 0) against resumed at step
2,000, end to end (imports, recipe, token store, DeepSpeed engine, checkpoint load, first
step), on a streamed corpus. Before the token store a streamed run resuming at step k re-read
and re-tokenized k global batches first; the goal is a ratio <= 1.1.

    .venv/bin/python bench/resume_start.py      # ~10 minutes on 2 CPU cores

A tiny random SkipV1 Llama (tests/factories.py) and its tokenizer, `data.streaming: true` over
KJV + GCIDE as JSONL (bench/data_store.py's corpus), seq_len 64, 1,024 tokens a step, one rank,
ZeRO-0, fp32. One run trains to step 2,000 and checkpoints there; then fresh starts and resumes
of that checkpoint (a copy of the run directory as a kill after the checkpoint leaves it) are
timed alternately, `--repeats` each: from the launch of the command to the wall-clock time
metrics.jsonl records for the first step (the step's own compute included in both); each is
killed once that step is recorded.
Writes docs/results/resume_start.md and .json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))


def setup(work: Path, corpus_dir: Path, chars: int, late: int) -> Path:
    from data_store import write_corpus
    from factories import build_tokenizer, make_skipv1_checkpoint

    tokenizer = build_tokenizer(work / "tokenizer")
    make_skipv1_checkpoint(work / "model", skip_v_heads=2, tokenizer_dir=tokenizer)
    (work / "corpus").mkdir()
    train = write_corpus(corpus_dir, work / "corpus", chars)
    recipe = {
        "model": {"path": str(work / "model"), "dtype": "float32"},
        "data": {
            "train": str(train),
            "eval": None,
            "seq_len": 64,
            "streaming": True,
            "cache_dir": str(work / "cache"),
        },
        "budget": {"tokens": (late + 4) * 1024},  # a few steps after the checkpoint
        "batch": {"global_batch_tokens": 1024, "micro_batch_size": 16},
        "deepspeed": {"zero_stage": 0},
        "checkpoint": {"every": late, "keep_last": 2},  # --late and the final one
        "log": {"progress": False, "tensorboard": False},
        "export": False,
    }
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return work / "recipe.yaml"


def command(recipe: Path, run_dir: Path) -> tuple[list[str], dict]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "skipv1", "uptrain", str(recipe), "--run-dir", str(run_dir)]
    return [*cmd, "--quiet"], env


def time_to_first_step(recipe: Path, run_dir: Path) -> float:
    """Launches `skipv1 uptrain`, waits for the first step it records, kills it (kill -9, as
    the checkpoints allow); returns the seconds from launch to that step's record. Only the
    bytes appended to metrics.jsonl are read while it runs (parsing the 2,000 earlier rows at
    every poll would take CPU from the resumed run alone)."""
    metrics = run_dir / "metrics.jsonl"
    seen = metrics.stat().st_size if metrics.is_file() else 0
    cmd, env = command(recipe, run_dir)
    launched = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while True:
        if metrics.is_file() and metrics.stat().st_size > seen:
            with open(metrics, "rb") as f:
                f.seek(seen)
                new = f.read().decode()
            rows = [json.loads(line) for line in new.splitlines() if line.endswith("}")]
            steps = [r for r in rows if "loss" in r]
            if steps:
                break
        if proc.poll() is not None:
            sys.exit(f"uptrain ended before its first step:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    return steps[0]["time"] - launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus-dir", type=Path, default=REPO.parent / "shared/data/corpus")
    parser.add_argument("--chars", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--late", type=int, default=2000, help="the step resumed from")
    parser.add_argument(
        "--work-dir", type=Path, help="keep the long run here and reuse it (default: a temp dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skipv1-resume-") as tmp:
        work = args.work_dir or Path(tmp)
        late = work / "late"
        if (work / "LATE-DONE").is_file():  # the untimed long run of an earlier invocation
            recipe = work / "recipe.yaml"
        else:
            work.mkdir(parents=True, exist_ok=True)
            recipe = setup(work, args.corpus_dir, args.chars, args.late)
            t0 = time.time()
            cmd, env = command(recipe, late)  # checkpoint at --late, then 4 steps
            if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
                sys.exit("the run to the late checkpoint failed")
            print(f"trained {args.late + 4} steps in {time.time() - t0:.0f} s")
            (work / "LATE-DONE").touch()
        for stale in [work / "fresh", *work.glob("resumed-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        from skipv1.uptrain.metrics import read_metrics

        kept = [r for r in read_metrics(late) if r.get("step", 0) <= args.late]
        fresh, resumed = [], []
        for i in range(args.repeats):
            shutil.rmtree(work / "fresh", ignore_errors=True)
            fresh.append(time_to_first_step(recipe, work / "fresh"))
            run = work / f"resumed-{i}"  # what a kill right after that checkpoint leaves
            shutil.copytree(late, run, ignore=shutil.ignore_patterns(f"step_{args.late + 4:08d}"))
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
            resumed.append(time_to_first_step(recipe, run))
            print(
                f"  pair {i + 1}: step 0 {fresh[-1]:.2f} s, step {args.late:,} {resumed[-1]:.2f} s"
            )
    ratio = statistics.median(resumed) / statistics.median(fresh)
    result = {
        "late_step": args.late,
        "fresh_s": fresh,
        "resumed_s": resumed,
        "ratio": ratio,
        "command": " ".join(["bench/resume_start.py", *sys.argv[1:]]),
        "load": os.getloadavg()[0],
    }
    print(f"resume at {args.late:,} / start at 0: {ratio:.2f} (goal <= 1.1)")
    out = REPO / "docs" / "results"
    (out / "resume_start.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(result, out / "resume_start.md")


def write_report(r: dict, path: Path) -> None:
    fresh = ", ".join(f"{s:.2f}" for s in r["fresh_s"])
    resumed = ", ".join(f"{s:.2f}" for s in r["resumed_s"])
    path.write_text(f"""# Launch to first step: start at step 0 vs resume at step {r["late_step"]:,}

Generated by `{r["command"]}` (`.venv/bin/python`), 2 CPU cores, load average
{r["load"]:.2f} (1-minute) at the end. A tiny random SkipV1 Llama, `data.streaming: true` over
KJV + GCIDE as JSONL, seq_len 64, 1,024 tokens a step, one rank, ZeRO-0, fp32, the token store
already built. Seconds from launching `skipv1 uptrain` to the time metrics.jsonl records for
the first step (imports, recipe, token store, DeepSpeed engine, checkpoint load, that step),
fresh and resumed runs alternated:

| start | seconds (each run) | median |
|---|---|---|
| step 0 (fresh run directory) | {fresh} | {statistics.median(r["fresh_s"]):.2f} |
| step {r["late_step"]:,} (resume from its checkpoint) | {resumed} | {statistics.median(r["resumed_s"]):.2f} |

Ratio resume / start: **{r["ratio"]:.2f}** (goal <= 1.1). Before the token store, a streamed
run resuming at step k re-read and re-tokenized k global batches on every rank first.
""")


if __name__ == "__main__":
    main()
