"""Uptraining options on SmolLM2-135M (issue 12, item 1), short paired runs, and where the gap
lies: out of domain only, or also on the training domain.

    nice -n 10 .venv/bin/python bench/recovery_smollm2_options.py --work-dir DIR   # ~50 min

Shares recovery_smollm2.py's work dir, stages and recipe (source, data, the `reconstruct`
conversion are reused when that bench has made them). Every run here is 16 steps of 2,048
tokens (32,768 tokens, a quarter of the main bench's budget, with its own 16-step schedule) from
the same checkpoint on the same batches; only the named setting changes. Two runs evaluate on
held-out GCIDE documents (the training domain, documents never trained on) instead of the KJV,
to tell whether the converted model's gap is one of generalisation or of capacity. Writes
docs/results/recovery_smollm2_options.{md,json}.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery import eval_curve_tokens, stage  # noqa: E402
from recovery_smollm2 import (  # noqa: E402
    BATCH_TOKENS,
    CONVERSIONS,
    REPO,
    convert,
    documents,
    export_source,
    make_data,
    recipe,
    uptrain,
)

STEPS = 16
# the command of rows from before the report recorded one (session 11, /work/exp/s11/rs)
EARLIER = ".venv/bin/python bench/recovery_smollm2_options.py --work-dir /work/exp/s11/rs"
LR = 1.5e-4
# name: (label, model: "source" or "reconstruct", eval domain, recipe changes from (E))
RUNS = {
    "E": ("(E) reconstruct + distillation alpha 0.5, T 1", "reconstruct", "kjv", {}),
    "alpha1": ("E with alpha 1.0 (KL only, no CE)", "reconstruct", "kjv", {"distill.alpha": 1.0}),
    "lr2x": ("E at twice the peak lr (3e-4)", "reconstruct", "kjv", {"optim.lr": 2 * LR}),
    "attn": (
        "E training only the attention modules (others at lr 0 for 99% of the steps)",
        "reconstruct",
        "kjv",
        {"optim.attention_first_fraction": 0.99},
    ),
    "E_calib_train": (
        "E from a reconstruct conversion calibrated on the training text (GCIDE)",
        "reconstruct_train_calib",
        "kjv",
        {},
    ),
    "calib_train_lr2x": (
        "E_calib_train at twice the peak lr (3e-4)",
        "reconstruct_train_calib",
        "kjv",
        {"optim.lr": 2 * LR},
    ),
    "calib_train_4x": (
        "E_calib_train with 4x the calibration tokens (131,072 of the training text)",
        "reconstruct_train_calib_4x",
        "kjv",
        {},
    ),
    "calib_train_all": (
        "E_calib_train calibrated on all the training text (--calib-tokens 262144: ~212k)",
        "reconstruct_train_calib_all",
        "kjv",
        {},
    ),
    "A_gcide": ("(A) MHA control, evaluated on held-out GCIDE", "source", "gcide", {"alpha": 0}),
    "E_gcide": ("(E), evaluated on held-out GCIDE", "reconstruct", "gcide", {}),
}


def write_gcide_eval(corpus: Path, data: Path, docs: int = 200) -> None:
    """GCIDE documents halfway between the training ones (recovery_smollm2.write_documents
    takes every k-th), none of them trained on."""
    all_docs = documents(corpus / "gcide.txt")
    train = {json.loads(line)["text"] for line in (data / "train.jsonl").open()}
    k = max(2, len(all_docs) // len(train))
    held = [d for d in all_docs[k // 2 :: k] if d not in train][:docs]
    (data / "gcide_eval.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in held))


def run_config(work: Path, model: str, domain: str, changes: dict) -> dict:
    changes = dict(changes)
    alpha = changes.pop("alpha", 0.5)
    path = work / "source" if model == "source" else work / model / "model"
    teacher = work / "source" if alpha else None
    lr = changes.pop("optim.lr", LR)
    c = recipe(path, work / "data", STEPS * BATCH_TOKENS, 8, 32, lr, teacher)
    if domain == "gcide":
        c["data"]["eval"] = str(work / "data" / "gcide_eval.jsonl")
    for key, value in changes.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def report(work: Path, out: Path, command: str, ran: list[str]) -> None:
    """The table of every run: those in `ran` from this work dir, the others carried from the
    report's last version (with the command that made them), so a partial rerun adds rows."""
    last_path = out / "recovery_smollm2_options.json"
    last = json.loads(last_path.read_text()) if last_path.is_file() else {}
    rows, results, earlier = [], {}, set()
    for name, (label, _, domain, _) in RUNS.items():
        if name in ran:
            curve = eval_curve_tokens(work / "options" / name / "run")
            results[name] = {"label": label, "domain": domain, "curve": curve, "command": command}
        elif name in last:
            results[name] = last[name] | {"command": last[name].get("command", EARLIER)}
            earlier.add(results[name]["command"])
        else:
            continue
        cells = " | ".join(f"{p:.3f}" for _, p in results[name]["curve"])
        mark = "" if name in ran else " *"
        rows.append(f"| {name}{mark} | {label} | {domain} | {cells} |")
    carried = "".join(f"\n- `{c}`" for c in sorted(earlier))
    carried = (
        f"Rows marked * are carried from earlier runs of this bench:{carried}\n" if carried else ""
    )
    text = f"""# SmolLM2-135M: uptraining options, short paired runs

Generated by `bench/recovery_smollm2_options.py` (niced, 2 CPU cores; stages an earlier run
finished are reused from the work dir):

```bash
{command}
```
{carried}
Every run: {STEPS} steps x {BATCH_TOKENS:,} tokens of GCIDE text (the same batches in the same
order), from the same `--init reconstruct` conversion (s = 1 of 3 KV heads) as
`recovery_smollm2.md`, or from the source for the MHA control; the main bench's recipe with its
own {STEPS}-step schedule (peak lr {LR:g}, 10% warmup, cosine to 10%) and one change each.
Perplexity on 32 blocks of 256 tokens of the KJV (held-out domain), or of GCIDE documents
never trained on (the training domain). One data order: differences of a few tenths are
within what another order could change. No wall times: the runs shared the CPU with a test run.

| run | setting | eval text | ppl step 0 | 16k tokens | 32k tokens |
|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
    out.mkdir(parents=True, exist_ok=True)
    (out / "recovery_smollm2_options.md").write_text(text)
    (out / "recovery_smollm2_options.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'recovery_smollm2_options.md'}")


def make_conversion(work: Path, name: str) -> None:
    """One of recovery_smollm2.CONVERSIONS, into the shared work dir."""
    init, calib, tokens = CONVERSIONS[name]
    calib_data = work / "data" / "train.jsonl" if calib == "train" else calib
    convert(work / "source", init, work / name, calib_data, tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus-dir", default=str(Path("..") / "shared" / "data" / "corpus"))
    p.add_argument("--work-dir", default=str(REPO / "runs" / "recovery-smollm2"))
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    p.add_argument(
        "--runs",
        nargs="+",
        choices=list(RUNS),
        default=list(RUNS),
        help="run only these; the report keeps the others' rows from its last version",
    )
    args = p.parse_args()
    corpus, work = Path(args.corpus_dir), Path(args.work_dir).absolute()
    if not (corpus / "kjv.txt").is_file() or not (corpus / "gcide.txt").is_file():
        sys.exit(f"--corpus-dir {corpus} must hold kjv.txt and gcide.txt")
    source, data = work / "source", work / "data"
    stage(source / "DONE", "export the packaged SmolLM2 as HF", lambda: export_source(source))
    stage(data / "DONE", "write data", lambda: make_data(corpus, data, 64 * BATCH_TOKENS, 32))
    stage(data / "GCIDE_EVAL_DONE", "GCIDE held-out", lambda: write_gcide_eval(corpus, data))
    for name in args.runs:
        label, model, domain, changes = RUNS[name]
        if model in CONVERSIONS:
            stage(
                work / model / "DONE", f"convert: {model}", lambda m=model: make_conversion(work, m)
            )
        out = work / "options" / name
        config = run_config(work, model, domain, changes)
        stage(out / "DONE", f"{name}: {label}", lambda c=config, o=out: uptrain(c, o))
    command = ".venv/bin/python bench/recovery_smollm2_options.py " + shlex.join(sys.argv[1:])
    report(work, Path(args.out), command.strip(), args.runs)


if __name__ == "__main__":
    main()
