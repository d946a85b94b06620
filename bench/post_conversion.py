"""Benchmark: perplexity of SmolLM2-135M-Instruct right after conversion (no training), per init.

Each conversion is the real `skipv1 convert` command (a subprocess, timed end to end); each
evaluation is `skipv1 eval` on two held-out texts:
- `kjv`: the King James Bible (read by path from --corpus-dir), a domain that none of the
  calibration text comes from;
- `embedded:validation`: CPython documentation prose, the same domain as the calibration text
  (`embedded:train`, disjoint documents).
Writes docs/results/post_conversion_smollm2.{md,json}. Run from the repository root on an idle
machine (about 40 minutes on 2 CPU cores; the default row first, so its conversion time is taken on a machine
that is quiet if you keep it so):

    nice -n 5 .venv/bin/python bench/post_conversion.py [--work DIR] [--only NAME ...]
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (row name, convert arguments); calibration text --calib-data (embedded:train: the report's
# rows were made so, when it was convert's default; convert's default is now `sampled`).
CONVERSIONS = {
    "reconstruct": [],  # the default init: no --init, default calibration size and steps
    "keep": ["--init", "keep"],
    "mean": ["--init", "mean"],
    "calibrated": ["--init", "calibrated"],
    "reconstruct-8k": ["--calib-tokens", "8192"],
    "reconstruct-8k-no-distill": ["--calib-tokens", "8192", "--calib-distill-steps", "0"],
    "reconstruct-no-distill": ["--calib-distill-steps", "0"],
}
DEFAULT_ROWS = list(CONVERSIONS)  # the SmolLM2 report's rows
# calibration budgets beyond the default, for small sources (--only): hours on SmolLM2
CONVERSIONS |= {
    "reconstruct-8x": ["--calib-tokens", "262144"],
    "reconstruct-distill-300": ["--calib-distill-steps", "300"],
    "reconstruct-8x-distill-300": ["--calib-tokens", "262144", "--calib-distill-steps", "300"],
}
EVAL_TOKENS = 8192
CTX = 512


def run(cmd: list, log: Path) -> float:
    cmd = [str(c) for c in cmd]
    print("$", shlex.join(cmd), flush=True)
    start = time.perf_counter()
    with log.open("a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        result = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if result.returncode:
        sys.exit(f"failed (exit {result.returncode}): {shlex.join(cmd)}; see {log}")
    return time.perf_counter() - start


def skipv1(*args) -> list:
    return [sys.executable, "-m", "skipv1", *args]


def source_dir(work: Path) -> Path:
    src = work / "source"
    if not (src / "config.json").is_file():
        from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

        export_gguf_as_hf(smollm2_gguf_path(), src)
    return src


def evaluate(models: list[Path], data: str, out: Path, log: Path, ctx: int = CTX) -> dict:
    if not out.is_file():
        run(
            skipv1(
                "eval",
                *models,
                "--data",
                data,
                "--ctx",
                ctx,
                # the KV measure's generate() must fit the model's positions
                "--prompt-len",
                min(128, ctx // 2),
                "--new-tokens",
                min(32, ctx // 4),
                "--max-tokens",
                EVAL_TOKENS,
                "--no-speed",
                "--json",
                out,
            ),
            log,
        )
    return {Path(m["path"]).name: m for m in json.loads(out.read_text())["models"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/skipv1-post-conversion"))
    parser.add_argument("--corpus-dir", type=Path, default=ROOT.parent / "shared/data/corpus")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results")
    parser.add_argument("--only", nargs="*", choices=CONVERSIONS, default=DEFAULT_ROWS)
    parser.add_argument("--source", type=Path, help="another source (default: SmolLM2)")
    parser.add_argument(
        "--calib-data", default="embedded:train", help="calibration text (a data spec or sampled)"
    )
    parser.add_argument(
        "--eval",
        nargs=2,
        action="append",
        metavar=("NAME", "SPEC"),
        help="evaluation texts for --source (default: SmolLM2's kjv and embedded:validation)",
    )
    parser.add_argument("--skip-heads", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=CTX, help="eval window (<= the model's)")
    parser.add_argument("--calib-seq-len", type=int, help="calibration sequence length")
    parser.add_argument("--stem", default="post_conversion_smollm2")
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    if args.source:
        src, evals = args.source.absolute(), dict(args.eval or [])
    else:
        kjv = args.corpus_dir / "kjv.txt"
        if not kjv.is_file():
            sys.exit(f"{kjv} not found: pass --corpus-dir with kjv.txt")
        src, evals = (
            source_dir(work),
            {"kjv": str(kjv), "embedded:validation": "embedded:validation"},
        )
    calib = ["--calib-data", args.calib_data]
    calib += ["--calib-seq-len", str(args.calib_seq_len)] if args.calib_seq_len else []
    timings_file = work / "convert_seconds.json"
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    for name in args.only:
        dst = work / name
        if not (dst / "config.json").is_file():
            cmd = skipv1(
                "convert",
                src,
                dst,
                "--skip-heads",
                args.skip_heads,
                "--quiet",
                *CONVERSIONS[name],
                *(calib if name not in ("keep", "mean") else []),
            )
            timings[name] = round(run(cmd, log), 1)
            timings_file.write_text(json.dumps(timings, indent=2))
    models = [src] + [work / name for name in args.only]
    results = {
        name: evaluate(models, spec, work / f"eval-{name.replace(':', '-')}.json", log, args.ctx)
        for name, spec in evals.items()
    }
    write_report(args, src, timings, results)


def write_report(args, src: Path, timings: dict, results: dict) -> None:
    rows = []
    for name in ["source", *args.only]:
        key = src.name if name == "source" else name
        row = {"model": name, "convert_seconds": timings.get(name)}
        for domain, models in results.items():
            row[domain] = models[key]["perplexity"]
            row["kv_bytes_per_token"] = models[key]["kv_bytes_per_token"]
        rows.append(row)
    base = rows[0]
    record = {
        "command": "nice -n 5 .venv/bin/python bench/post_conversion.py "
        + shlex.join(sys.argv[1:]),
        "eval_tokens": EVAL_TOKENS,
        "ctx": args.ctx,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    domains = list(results)
    head = " | ".join(f"{d} ppl | vs source" for d in domains)
    lines = [
        f"| model | convert time (s) | {head} | KV bytes/token |",
        "|---|---|" + "---|---|" * len(domains) + "---|",
    ]
    for row in rows:
        t = "-" if row["convert_seconds"] is None else f"{row['convert_seconds']:.0f}"
        cells = " | ".join(f"{row[d]:,.2f} | {row[d] / base[d] - 1:+.1%}" for d in domains)
        lines.append(f"| {row['model']} | {t} | {cells} | {row['kv_bytes_per_token']:,} |")
    table = "\n".join(lines)
    print(table)
    (args.out / f"{args.stem}.table.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
