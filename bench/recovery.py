"""The recovery experiment: how much continued training does a converted model need to get back
to the source's validation perplexity? One command, end to end:

    nice -n 10 .venv/bin/python bench/recovery.py                   # the issue's: ~1.5 h, 2 CPUs
    nice -n 10 .venv/bin/python bench/recovery.py --scale smoke     # plumbing check, minutes

Stages (each reused when a rerun finds it finished, in --work-dir):
1. data: KJV + GCIDE read by path from --corpus-dir; the last 2% of each file's lines are the
   validation split; documents of 50 lines, written as JSONL to the work dir (not the repo).
2. tokenizer: byte-level BPE trained on the training split.
3. source: a random-init MHA Llama pretrained from scratch for T tokens with `skipv1 uptrain`
   (`converged`: ~21 tokens per parameter).
4. arms (ARMS below), each continued from the source for 15% of T with the same schedule and
   hyperparameters, 1 or SEEDS seeds (data orders), validation perplexity every 1% of T.
5. report: docs/results/recovery.md, .png, .json (recovery-SCALE.* for the other scales;
   --out for another folder).
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"
LINES_PER_DOC = 50
HOLDOUT = 0.02  # last 2% of each file's lines
VOCAB = 4096
MIN_LR_RATIO = 0.1  # cosine schedules end at this fraction of their peak lr


# Data orders per key arm (the gradual arm has one: it is not the best arm).
SEEDS = 3


@dataclass(frozen=True)
class Arm:
    label: str
    init: str | None  # `skipv1 convert --init`; None: the source itself; "gqa": pooled GQA
    distill: bool = False  # distillation from the source
    gradual: float = 0.0  # model.gradual_fraction
    seeds: int = 1  # data orders (data.seed 2, 3, ...)
    alpha: float = 0.5  # distill.alpha
    temperature: float = 1.0  # distill.temperature
    alpha_end: float | None = None  # distill.alpha_end (alpha moves linearly to it); None: constant
    warmup: float = 0.1  # optim.warmup_fraction (0: no lr re-warming)
    attention_first: float = 0.0  # optim.attention_first_fraction
    lr_scale: float = 1.0  # peak lr as a multiple of the scale's arm_lr
    model_from: str | None = None  # start from this arm's converted checkpoint (same init)
    calib_tokens: int | None = None  # `convert --calib-tokens`; None: the scale's
    calib_distill_steps: int | None = None  # `convert --calib-distill-steps`; None: convert's
    budget_pct: float = 15.0  # training tokens, % of T; the lr schedule ends there
    batch_scale: float = 1.0  # tokens per optimizer step as a multiple of the scale's (same tokens)
    hidden: float = 0.0  # distill.hidden: weight of the hidden-state term (0: none)


ARMS = {
    "A": Arm("MHA continued (control)", None, seeds=SEEDS),
    "B": Arm("SkipV1 --init mean (paper)", "mean"),
    "C": Arm("SkipV1 --init calibrated", "calibrated"),
    "D": Arm("SkipV1 --init reconstruct (default)", "reconstruct", seeds=SEEDS),
    "E": Arm("D + distillation from the source", "reconstruct", distill=True, seeds=SEEDS),
    "G": Arm(
        "gradual conversion (--init keep, 30% ramp) + distillation",
        "keep",
        distill=True,
        gradual=0.3,
    ),
    "F": Arm("GQA n_kv/2 (mean-pooled K/V, Ainslie)", "gqa"),
    # the uptraining options of issue 12, each one change from (D) or (E), on D's checkpoint
    "H": Arm(
        "D + attention only for the first third",
        "reconstruct",
        attention_first=1 / 3,
        model_from="D",
    ),
    "I": Arm("D without lr re-warming (no warmup)", "reconstruct", warmup=0.0, model_from="D"),
    "K": Arm("D at twice the peak lr", "reconstruct", lr_scale=2.0, model_from="D", seeds=SEEDS),
    "J": Arm(
        "E with alpha 0.9, temperature 2",
        "reconstruct",
        distill=True,
        alpha=0.9,
        temperature=2.0,
        model_from="D",
    ),
}
# the best conversion budget of bench/post_conversion.py on this source, and a short schedule
ARMS |= {
    "L": Arm(
        "E from a conversion on 8x the calibration tokens, 300 distillation steps",
        "reconstruct",
        distill=True,
        calib_tokens=262_144,
        calib_distill_steps=300,
        seeds=SEEDS,
    ),
    "M": Arm(
        "L trained for 2.5% of T (its schedule ends there)",
        "reconstruct",
        distill=True,
        budget_pct=2.5,
        model_from="L",
        seeds=SEEDS,
    ),
    "O": Arm(
        "E trained for 2.5% of T (its schedule ends there)",
        "reconstruct",
        distill=True,
        budget_pct=2.5,
        model_from="D",
        seeds=SEEDS,
    ),
    "N": Arm(
        "MHA continued for 2.5% of T (the control of M and O)", None, budget_pct=2.5, seeds=SEEDS
    ),
}


def _variant(base: str, label: str, seeds: int = 1, **changes) -> Arm:
    """Another arm's settings with a few changed (from its converted checkpoint)."""
    spec = ARMS[base]
    return replace(spec, label=label, seeds=seeds, model_from=spec.model_from or base, **changes)


# the learning rate, the one option that moved the end point (K): higher, with distillation,
# and the control at K's lr (is the control's gain the lr's too?)
ARMS["P"] = _variant("K", "D at four times the peak lr", lr_scale=4.0)
ARMS["Q"] = _variant("K", "E at twice the peak lr", distill=True)
ARMS["R"] = Arm("MHA continued at twice the peak lr (control of K)", None, lr_scale=2.0)
# the same tokens in twice the optimizer steps, and with Q's settings
ARMS["S"] = _variant("D", "D at half the batch (4,096 tokens, 600 steps)", batch_scale=0.5)
ARMS["U"] = Arm("MHA continued at half the batch (control of S)", None, batch_scale=0.5)
ARMS["V"] = _variant("Q", "Q at half the batch", seeds=SEEDS, batch_scale=0.5)
ARMS["X"] = _variant(
    "Q", "Q at a quarter of the batch (2,048 tokens, 1,200 steps)", batch_scale=0.25
)
ARMS["Y"] = _variant(
    "V", "V trained for 2.5% of T (its schedule ends there)", seeds=SEEDS, budget_pct=2.5
)
ARMS["Z"] = Arm(
    "MHA continued with V's lr and batch (control of V)", None, lr_scale=2.0, batch_scale=0.5
)
# J's stronger distillation (best at 2.5% of T on the long schedule) with V's lr and batch
ARMS["W"] = _variant("V", "V with alpha 0.9, temperature 2", alpha=0.9, temperature=2.0)
ARMS["T"] = _variant(
    "W", "W trained for 2.5% of T (its schedule ends there)", seeds=SEEDS, budget_pct=2.5
)
# (T)'s strong pull to the teacher early, (V)'s weaker one (or none) late
ARMS["AA"] = _variant("V", "V with alpha 0.9 -> 0.5 over the run", alpha=0.9, alpha_end=0.5)
ARMS["AB"] = _variant("V", "V with alpha 0.9 -> 0 over the run", alpha=0.9, alpha_end=0.0)
# the hidden-state term (each layer's output pulled to the source's), on the best 2.5%-of-T arm
ARMS["AC"] = _variant("T", "T with the hidden-state term, beta 1", seeds=SEEDS, hidden=1.0)
ARMS["AD"] = _variant("T", "T with the hidden-state term, beta 10", seeds=SEEDS, hidden=10.0)
# the whole loss from the teacher (no next-token term), on the same arm
ARMS["AE"] = _variant("T", "T with distillation only (alpha 1)", seeds=SEEDS, alpha=1.0)
# gradual conversion from the default init (the bridges of skipv1/uptrain/gradual.py undo its
# refits at the start), on the best 2.5%-of-T arm: the ramp over the first half of the budget
ARMS["AF"] = _variant(
    "T", "T with gradual conversion from D's init over the first half", seeds=SEEDS, gradual=0.5
)
# the two best changes together: (AD)'s hidden-state term from (L)'s larger conversion budget
ARMS["AG"] = replace(
    ARMS["AD"],
    label="AD from L's conversion (8x calibration, 300 distillation steps)",
    model_from="L",
)
SKIPV1_ARMS = [a for a, spec in ARMS.items() if spec.init not in (None, "gqa")]


@dataclass(frozen=True)
class Scale:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    seq_len: int
    batch_tokens: int  # tokens per optimizer step
    steps_per_pct: int  # optimizer steps in 1% of T
    train_chars: int  # training text kept (all of KJV, GCIDE sampled evenly to fill the rest)
    eval_blocks: int
    pretrain_lr: float
    arm_lr: float
    calib_tokens: int
    vocab: int = VOCAB

    @property
    def pretrain_tokens(self) -> int:  # T
        return 100 * self.steps_per_pct * self.batch_tokens


SCALES = {
    # ~1.4M parameters, T ~ 1.0M tokens: ~8 min of pretraining on 2 CPU cores (more when they
    # are shared: the runs are niced)
    "small": Scale(128, 4, 4, 384, 128, 2048, 5, 8_000_000, 64, 2e-3, 3e-4, 16384),
    # ~5.8M parameters, T ~ 9.8M tokens (~1.7 tokens per parameter, about one pass over the
    # training text): 45-60 minutes of pretraining on the same cores at ~3,700 tokens/s
    "full": Scale(256, 6, 8, 688, 256, 8192, 12, 32_000_000, 128, 1.5e-3, 2.25e-4, 32768),
    # ~0.76M parameters pretrained for T ~ 16.4M tokens (~21 tokens per parameter, about one
    # pass over the corpus): closer to convergence than `full`, in ~25 minutes on 2 CPU cores
    "converged": Scale(96, 6, 4, 256, 128, 8192, 20, 45_000_000, 128, 3e-3, 4.5e-4, 32768, 1024),
    # plumbing check only (~2 minutes in all): numbers mean nothing
    "smoke": Scale(64, 3, 4, 128, 64, 512, 1, 400_000, 8, 2e-3, 3e-4, 1024),
}


# --- stages -----------------------------------------------------------------------------------


def split_corpus(corpus: Path, out: Path, train_chars: int) -> None:
    """train.jsonl / valid.jsonl: 50-line documents, files interleaved so that any prefix (the
    eval blocks, the calibration tokens) covers both; the holdout is each file's last 2%."""
    train, valid = [], []
    for name in ("kjv.txt", "gcide.txt"):
        # GCIDE holds a few cp1252 bytes: replaced, not fatal
        lines = (corpus / name).read_text(encoding="utf-8", errors="replace").splitlines()
        cut = int(len(lines) * (1 - HOLDOUT))
        train.append(_documents(lines[:cut]))
        valid.append(_documents(lines[cut:]))
    kjv, gcide = train
    kjv = kjv[:: max(1, math.ceil(sum(map(len, kjv)) / train_chars))]
    room = max(train_chars - sum(map(len, kjv)), 1)
    train = [kjv, gcide[:: max(1, math.ceil(sum(map(len, gcide)) / room))]]
    out.mkdir(parents=True, exist_ok=True)
    for split, parts in (("train", train), ("valid", valid)):
        docs = _interleave(parts)
        (out / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))


def _documents(lines: list[str]) -> list[str]:
    docs = ["\n".join(lines[i : i + LINES_PER_DOC]) for i in range(0, len(lines), LINES_PER_DOC)]
    return [d for d in docs if d.strip()]


def _interleave(parts: list[list[str]]) -> list[str]:
    """Round-robin, each list spread evenly over the whole output."""
    keyed = [((i + 0.5) / len(p), j, d) for j, p in enumerate(parts) for i, d in enumerate(p)]
    return [d for _, _, d in sorted(keyed)]


def train_tokenizer(data: Path, out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    texts = (json.loads(line)["text"] for line in (data / "train.jsonl").open())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS
    )
    fast.save_pretrained(out)


def random_init(scale: Scale, tokenizer: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer)
    config = LlamaConfig(
        hidden_size=scale.hidden,
        intermediate_size=scale.intermediate,
        num_hidden_layers=scale.layers,
        num_attention_heads=scale.heads,
        num_key_value_heads=scale.heads,  # MHA
        vocab_size=len(tok),
        max_position_embeddings=scale.seq_len,
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)


def recipe(
    scale: Scale,
    model: Path,
    data: Path,
    *,
    pretrain: bool,
    teacher: Path | None,
    seed: int = 0,
    arm: Arm | None = None,
) -> dict:
    """Pretraining and every arm share this; the arms differ only in `model.path`, `distill`,
    their `Arm` options and their seed (the data order)."""
    arm = arm or Arm("pretraining", None)
    t = scale.pretrain_tokens
    batch_tokens = round(scale.batch_tokens * arm.batch_scale)
    steps_per_pct = round(scale.steps_per_pct / arm.batch_scale)
    steps = 100 * steps_per_pct if pretrain else round(arm.budget_pct * steps_per_pct)
    blocks = batch_tokens // scale.seq_len
    return {
        "model": {"path": str(model), "dtype": "float32", "gradual_fraction": arm.gradual},
        "data": {
            "train": str(data / "train.jsonl"),
            "eval": str(data / "valid.jsonl"),
            "seq_len": scale.seq_len,
            # the arms see data in orders pretraining did not
            "seed": 1 if pretrain else 2 + seed,
        },
        "budget": {"tokens": steps * batch_tokens, "pretraining_tokens": t},
        "batch": {
            "global_batch_tokens": batch_tokens,
            "micro_batch_size": min(blocks, max(16, 4096 // scale.seq_len)),
        },
        "optim": {
            "lr": scale.pretrain_lr if pretrain else scale.arm_lr * arm.lr_scale,
            "warmup_fraction": 0.05 if pretrain else arm.warmup,
            "min_lr_ratio": MIN_LR_RATIO,
            "attention_first_fraction": arm.attention_first,
        },
        "deepspeed": {"zero_stage": 0},
        "eval": {
            "every": 10 * steps_per_pct if pretrain else steps_per_pct,
            "blocks": scale.eval_blocks,
        },
        "checkpoint": {"every": 0, "keep_last": 1},
        "log": {"progress": False, "tensorboard": False},
        "distill": {
            "teacher": str(teacher) if teacher else None,
            "alpha": arm.alpha,
            "temperature": arm.temperature,
            "alpha_end": arm.alpha_end,
            "hidden": arm.hidden,
        },
        "export": pretrain,
    }


def run_logged(cmd: list[str], log: Path) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    with log.open("a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        sys.exit(f"{shlex.join(cmd)} failed (exit {rc}); log {log}:\n{tail}")


def skipv1_cmd() -> list[str]:
    script = Path(sys.executable).parent / "skipv1"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "skipv1"]


def uptrain(config: dict, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "bench_recipe.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [*skipv1_cmd(), "uptrain", str(path), "--run-dir", str(run_dir / "run"), "--quiet"]
    run_logged(cmd, run_dir / "log.txt")


def arm_model(arm: str, source: Path, data: Path, scale: Scale, out: Path) -> Path:
    """The arm's starting checkpoint, made from the source (reused when it exists)."""
    init = ARMS[arm].init
    if init is None:
        return source
    if ARMS[arm].model_from:
        return arm_model(
            ARMS[arm].model_from, source, data, scale, out.parent / ARMS[arm].model_from
        )
    model = out / "model"
    if (model / "config.json").is_file():
        return model
    if init == "gqa":
        from gqa_pool import write_pooled_gqa

        write_pooled_gqa(source, model, scale.heads // 2)
        return model
    cmd = [*skipv1_cmd(), "convert", str(source), str(model), "--init", init, "--quiet"]
    cmd += ["--skip-heads", str(scale.heads // 2)]
    spec = ARMS[arm]
    if init in ("calibrated", "reconstruct"):
        cmd += ["--calib-data", str(data / "train.jsonl"), "--calib-tokens"]
        cmd += [str(spec.calib_tokens or scale.calib_tokens), "--calib-seq-len", str(scale.seq_len)]
    if spec.calib_distill_steps is not None:
        cmd += ["--calib-distill-steps", str(spec.calib_distill_steps)]
    out.mkdir(parents=True, exist_ok=True)
    run_logged(cmd, out / "log.txt")
    return model


def pretrain_skipv1(init: Path, data: Path, scale: Scale, out: Path) -> None:
    """The SkipV1 architecture pretrained from the source's random init (`--init keep` of it:
    later layers' own value heads keep their random rows) with the source's recipe, batches and
    tokens: the level the architecture itself reaches at this size."""
    model = out / "model"
    if not (model / "config.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        cmd = [*skipv1_cmd(), "convert", str(init), str(model), "--init", "keep", "--quiet"]
        run_logged(cmd + ["--skip-heads", str(scale.heads // 2)], out / "log.txt")
    uptrain(recipe(scale, model, data, pretrain=True, teacher=None), out)


def stage(marker: Path, what: str, fn) -> None:
    """Runs `fn` unless `marker` says it finished; records its wall time."""
    if marker.is_file():
        print(f"[reuse] {what}", flush=True)
        return
    print(f"[run]   {what}", flush=True)
    start = time.time()
    fn()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"seconds": round(time.time() - start, 1)}))


def seconds(marker: Path) -> float:
    return json.loads(marker.read_text())["seconds"] if marker.is_file() else float("nan")


# --- report -----------------------------------------------------------------------------------

SMALL_NOTE = """**This is not the issue's experiment.** The source here is pretrained for minutes
on few tokens per parameter, and perplexity is measured on a few dozen blocks: differences of a
few tenths of a point are within noise. `--scale converged` runs the issue's configuration; its
report is `recovery.md`."""
POINTS = (2.5, 5, 10, 15)  # % of T reported in the table
EARLIER = "an earlier run (its command was not recorded)"
PAIRED = (
    "D",
    "E",
    "H",
    "I",
    "K",
    "J",
    "L",
    "P",
    "Q",
    "S",
    "V",
    "X",
    "W",
    "AA",
    "AB",
)  # seed 0 of these, side by side


def eval_curve_tokens(run_dir: Path) -> list[tuple[int, float]]:
    """(training tokens, validation perplexity) pairs of a run, step 0 first."""
    from skipv1.uptrain.metrics import read_metrics

    return [(r["tokens"], r["eval_ppl"]) for r in read_metrics(run_dir) if "eval_ppl" in r]


def eval_curve(run_dir: Path, scale: Scale) -> list[tuple[float, float]]:
    """(% of T, validation perplexity) pairs of a run."""
    t = scale.pretrain_tokens
    return [(100 * tokens / t, ppl) for tokens, ppl in eval_curve_tokens(run_dir)]


def compute_fraction(model: Path, source: Path, teacher: bool, pct: float) -> float:
    """Training FLOPs of `pct`% of T on this arm (plus the teacher's forwards) as a fraction of
    the source's pretraining FLOPs: (6 P_arm + 2 P_src [teacher]) pct / (6 P_src 100)."""
    from skipv1.checkpoint_info import read_config
    from skipv1.modeling.layout import count_parameters

    p_arm, p_src = count_parameters(read_config(model)), count_parameters(read_config(source))
    return (6 * p_arm + (2 * p_src if teacher else 0)) * pct / (6 * p_src * 100)


def conversion_compute(arm: str, scale: Scale) -> float:
    """An estimate of the conversion's FLOPs as a fraction of the source's pretraining FLOPs
    (6 P T): each calibration stream is a forward (2 P per token; `reconstruct` carries two),
    and each step of its attention distillation a student forward and backward and a teacher
    forward (8 P per token, 4 sequences per step)."""
    spec = ARMS[arm]
    if spec.model_from:
        spec = ARMS[spec.model_from]
    if spec.init not in ("calibrated", "reconstruct"):
        return 0.0
    from skipv1.convert.options import ConvertOptions

    tokens = spec.calib_tokens or scale.calib_tokens
    steps = spec.calib_distill_steps
    steps = ConvertOptions.calib_distill_steps if steps is None else steps
    streams, steps = (2, steps) if spec.init == "reconstruct" else (1, 0)
    flops = 2 * streams * tokens + 8 * 4 * scale.seq_len * steps  # per parameter
    return flops / (6 * scale.pretrain_tokens)


def kv_bytes(model: Path) -> int:
    from skipv1.checkpoint_info import read_config
    from skipv1.modeling.layout import kv_layout

    return kv_layout(read_config(model)).bytes_per_token(2)


def ppl_at(curve: list[tuple[float, float]], pct: float) -> float | None:
    """Perplexity at `pct`% of T (linear between the two nearest evaluations); None past the
    run's end."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= pct <= x1:
            return y0 + (y1 - y0) * (pct - x0) / (x1 - x0)
    return curve[-1][1] if pct <= curve[-1][0] + 1e-9 else None


def ppl_stats(curves: list, mean_curve: list, pct: float) -> dict | None:
    """Mean, min and max over seeds at `pct`% of T; None past the arm's budget."""
    mean = ppl_at(mean_curve, pct)
    if mean is None:
        return None
    each = [ppl_at(c, pct) for c in curves]
    return {"mean": mean, "min": min(each), "max": max(each)}


def first_reach(curve: list[tuple[float, float]], target: float, start: float = 0) -> float | None:
    """First % of T at or below `target`, counted from `start` (a gradual arm is only converted
    once its ramp has ended)."""
    return next((pct for pct, ppl in curve if ppl <= target and pct >= start), None)


def seed_dirs(root: Path, arm: str) -> list[Path]:
    return [root / arm / f"seed{k}" for k in range(ARMS[arm].seeds)]


def measured_arm(root: Path, arm: str, scale: Scale, source: Path, command: str) -> dict:
    spec = ARMS[arm]
    curves = [eval_curve(d / "run", scale) for d in seed_dirs(root, arm)]
    model = source if spec.init is None else root / (spec.model_from or arm) / "model"
    mean = [(pts[0][0], sum(p[1] for p in pts) / len(pts)) for pts in zip(*curves, strict=True)]
    return {
        "curves": curves,
        "mean_curve": mean,
        "kv_bytes_per_token": kv_bytes(model),
        "compute_per_pct": compute_fraction(model, source, spec.distill, 1.0),
        "seconds": sum(seconds(d / "DONE") for d in seed_dirs(root, arm)) / spec.seeds,
        "command": command,
    }


def summarize(root: Path, scale: Scale, source: Path, last: dict, command: str, ran) -> dict:
    """Every arm: measured in this work dir for the arms this command ran (`ran`) or that the
    report's last version (`last`, its json) lacks, else carried from it with the command that
    made it; arms in neither are left out. Carrying needs the same source: its pretraining
    must end at the validation perplexity the carried arms started from (to 1e-4: the
    tolerance of evaluating the exported copy instead of the trained model)."""
    pretrained = eval_curve(root.parent / "source" / "run", scale)[-1][1]
    if last and abs(last["source_ppl"] - pretrained) > 1e-4 * pretrained:
        sys.exit(
            f"this work dir's source ends at validation ppl {pretrained:.6f}, the report's arms "
            f"started from {last['source_ppl']:.6f}: another source; rerun every arm (no "
            "--arms) or use the work dir they ran in"
        )
    arms = {}
    for arm in ARMS:
        done = all((d / "DONE").is_file() for d in seed_dirs(root, arm))
        if done and (arm in ran or arm not in last.get("arms", {})):
            arms[arm] = measured_arm(root, arm, scale, source, command)
        elif arm in last.get("arms", {}):
            arms[arm] = {"seconds": float("nan"), "command": EARLIER} | last["arms"][arm]
    if "A" not in arms:
        sys.exit("arm A (the MHA control) has not run: add it to --arms")
    src_ppl = arms["A"]["curves"][0][0][1]  # the source itself, on the same eval blocks
    for arm, info in arms.items():
        start = ARMS[arm].gradual * ARMS[arm].budget_pct  # % of T where the ramp ends
        info["step0"] = info["mean_curve"][0][1]
        info["reach"] = first_reach(info["mean_curve"], src_ppl, start)
        info["reach_per_seed"] = [first_reach(c, src_ppl, start) for c in info["curves"]]
        info["at"] = {str(p): ppl_stats(info["curves"], info["mean_curve"], p) for p in POINTS}
    return {"source_ppl": src_ppl, "arms": arms}


def scratch_curve(work: Path, scale: Scale, last: dict, command: str, ran: bool) -> dict | None:
    """The from-scratch SkipV1 pretraining: measured here when this command ran it (or the last
    report lacks it), else carried; None when neither has it."""
    done = (work / "scratch" / "DONE").is_file()
    if done and (ran or not last.get("scratch")):
        return {
            "curve": eval_curve(work / "scratch" / "run", scale),
            "seconds": seconds(work / "scratch" / "DONE"),
            "command": command,
        }
    return last.get("scratch")


def best_skipv1_arm(s: dict, at: str = "15") -> str:
    """The SkipV1 arm lowest at `at`% of T, among those that trained that far."""
    present = [a for a in SKIPV1_ARMS if s["arms"].get(a, {}).get("at", {}).get(at)]
    return min(present, key=lambda a: s["arms"][a]["at"][at]["mean"])


def earliest_skipv1_arm(s: dict) -> str:
    """The SkipV1 arm that reaches the source first (then: the lowest at 2.5% of T)."""
    present = [a for a in SKIPV1_ARMS if a in s["arms"]]
    never = float("inf")
    return min(
        present,
        key=lambda a: (
            never if s["arms"][a]["reach"] is None else s["arms"][a]["reach"],
            s["arms"][a]["at"]["2.5"]["mean"],
        ),
    )


def _seeds(arm: str) -> str:
    n = ARMS[arm].seeds
    return f"{n} seed{'s' if n > 1 else ''}"


def goals(s: dict) -> list[str]:
    best = earliest_skipv1_arm(s)
    a, b, src = s["arms"]["A"], s["arms"][best], s["source_ppl"]
    reach = b["reach"]
    met = reach is not None and reach <= 2.5
    lines = [
        f"- The best SkipV1 arm, ({best}) {ARMS[best].label}, reaches the source's perplexity "
        f"({src:.3f}) within 2.5% of T (mean of its seeds): "
        + ("**met**" if met else "**not met**")
        + (
            f" (reached at {reach:g}% of T = {reach * b['compute_per_pct'] * 100:.2g}% of the "
            "source's pretraining compute, teacher forwards included; per seed: "
            + ", ".join("never" if r is None else f"{r:g}%" for r in b["reach_per_seed"])
            + ")."
            if reach is not None
            else f" (not reached within its {ARMS[best].budget_pct:g}% of T)."
        )
    ]
    best = best_skipv1_arm(s)
    b = s["arms"][best]
    b15, a15 = b["at"]["15"], a["at"]["15"]
    ok = b15["mean"] <= a15["mean"] and b15["max"] < a15["min"]
    lines.append(
        f"- At 15% of T, ({best}) is at or below the MHA control (A), mean of seeds and outside "
        f"the spread: {'**met**' if ok else '**not met**'} (({best}), {_seeds(best)}: "
        f"{b15['mean']:.3f} [{b15['min']:.3f}, {b15['max']:.3f}] vs (A) {a15['mean']:.3f} "
        f"[{a15['min']:.3f}, {a15['max']:.3f}])."
    )
    early = best_skipv1_arm(s, "2.5")
    e, n = s["arms"][early]["at"]["2.5"], s["arms"].get("N", a)["at"]["2.5"]
    lines.append(
        f"- At 2.5% of T the lowest SkipV1 arm is ({early}) {ARMS[early].label} "
        f"({_seeds(early)}): {_cell(e)} "
        f"({100 * (e['mean'] / src - 1):+.1f}% vs the source; the MHA control "
        f"{'trained for 2.5% of T, (N)' if 'N' in s['arms'] else '(A)'}: {_cell(n)})."
    )
    low = min(a["mean_curve"], key=lambda p: p[1])
    lines.append(
        f"- Context: the MHA control (A) itself is at {a15['mean']:.3f} after 15% of T "
        f"({a15['mean'] - src:+.3f} vs the source; its lowest point {low[1]:.3f} at {low[0]:g}%)."
    )
    return lines


def plot(s: dict, scale_name: str, path: Path) -> None:
    """All arms on a log scale (left) and the same curves near the source (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = matplotlib.colormaps["tab20"].colors
    src = s["source_ppl"]
    for ax in axes:
        for i, (arm, info) in enumerate(s["arms"].items()):
            pct, ppl = zip(*info["mean_curve"], strict=True)
            style = "--" if ARMS[arm].budget_pct < 15 else "-"
            label = f"({arm}) {ARMS[arm].label}"
            ax.plot(pct, ppl, style, marker="o", markersize=2.5, color=colors[i % 20], label=label)
            if len(info["curves"]) > 1:
                lows = [min(c[j][1] for c in info["curves"]) for j in range(len(pct))]
                highs = [max(c[j][1] for c in info["curves"]) for j in range(len(pct))]
                ax.fill_between(pct, lows, highs, color=colors[i % 20], alpha=0.2)
        ax.axhline(src, color="black", linestyle=":", linewidth=1, label="source")
        ax.set_xlabel("continued training, % of the source's pretraining tokens T")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axes[0].yaxis.set_major_formatter(plain)
    axes[0].yaxis.set_minor_formatter(plain)
    axes[0].set_ylabel("validation perplexity (mean of seeds; band: min-max)")
    axes[0].set_title(f"Recovery after conversion ({scale_name} scale, CPU)")
    axes[1].set_ylim(src * 0.96, src * 1.1)
    axes[1].set_title("near the source (dashed: 2.5%-of-T schedules)")
    axes[0].legend(fontsize=6.5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _cell(at: dict | None) -> str:
    if at is None:
        return "-"
    if at["min"] == at["max"]:
        return f"{at['mean']:.3f}"
    return f"{at['mean']:.3f} [{at['min']:.3f}, {at['max']:.3f}]"


def paired_rows(s: dict) -> list[str]:
    """Seed 0 of (D), (E) and the one-change arms at each reported point."""
    arms = [a for a in PAIRED if a in s["arms"]]
    rows = ["| arm | " + " | ".join(f"{p:g}% of T" for p in POINTS) + " |"]
    rows.append("|---" * (len(POINTS) + 1) + "|")
    for arm in arms:
        curve = s["arms"][arm]["curves"][0]
        cells = " | ".join(_cell(ppl_stats([curve], curve, p)) for p in POINTS)
        rows.append(f"| ({arm}) {ARMS[arm].label} | {cells} |")
    return rows


def scratch_section(s: dict, pre_curve: list, command: str) -> str:
    """The from-scratch SkipV1 pretraining beside the source's, when there is one."""
    sc = s.get("scratch")
    if not sc:
        return ""
    mine = dict(sc["curve"])
    points = [p for p, _ in pre_curve if p > 0 and p in mine]
    head = "| % of T | " + " | ".join(f"{p:g}" for p in points) + " |"
    rows = [head, "|---" * (len(points) + 1) + "|"]
    rows.append(
        "| source (MHA) | " + " | ".join(f"{dict(pre_curve)[p]:.3f}" for p in points) + " |"
    )
    rows.append("| SkipV1 from scratch | " + " | ".join(f"{mine[p]:.3f}" for p in points) + " |")
    end, src = sc["curve"][-1][1], pre_curve[-1][1]
    carried = "" if sc["command"] == command else f" Carried from `{sc['command']}`."
    verdict = (
        "It ends below the source: the converted arms' gap to the source and to the MHA control "
        "is the conversion's (a start the uptraining has not left behind), not a limit of the "
        "architecture."
        if end < src
        else "It ends above the source: that much of a converted arm's gap is the "
        "architecture's, which no uptraining option removes."
    )
    return f"""
## The architecture's own level

The SkipV1 architecture (s = {s["skip_heads"]} of {s["kv_heads"]} KV heads in every later
layer) pretrained from the source's random init (`--init keep` of it) with the source's
recipe, batches and T tokens (`--skipv1-from-scratch`; one run, in the source's data order;
{sc["seconds"]:.0f} s of wall time on the shared CPU).{carried}
Validation perplexity on the same blocks:

{chr(10).join(rows)}

At T the SkipV1 architecture ends at **{end:.3f}**, {100 * (end / src - 1):+.1f}% against the
source's {src:.3f} after the same tokens: what the architecture itself reaches at this size.
{verdict}
"""


def write_report(s: dict, args, scale: Scale, work: Path, out: Path, command: str) -> None:
    from skipv1.checkpoint_info import read_config
    from skipv1.modeling.layout import count_parameters

    source = work / "source" / "run" / "export"
    t = scale.pretrain_tokens
    pre_curve = eval_curve(work / "source" / "run", scale)
    fmt = lambda v: "not reached" if v is None else f"{v:g}%"  # noqa: E731
    rows = [
        "| arm | seeds | KV bytes/token (bf16) | conversion compute (est.) | training compute "
        "| ppl step 0 | reaches source ppl at (% of T, mean) | "
        + " | ".join(f"ppl {p:g}%" for p in POINTS)
        + " | 15%: gap to (A) |",
        "|---" * (8 + len(POINTS)) + "|",
    ]
    a15 = s["arms"]["A"]["at"]["15"]["mean"]
    for arm, a in s["arms"].items():
        spec = ARMS[arm]
        mark = " *" if a["command"] != command else ""
        rows.append(
            f"| ({arm}){mark} {spec.label} | {spec.seeds} | {a['kv_bytes_per_token']:,} | "
            f"{conversion_compute(arm, scale) * 100:.2f}% | "
            f"{a['compute_per_pct'] * spec.budget_pct * 100:.1f}% | {a['step0']:.3f} | "
            f"{fmt(a['reach'])} | "
            + " | ".join(_cell(a["at"][str(p)]) for p in POINTS)
            + (f" | {a['at']['15']['mean'] - a15:+.3f} |" if a["at"]["15"] else " | - |")
        )
    curve_head = "| % of T | " + " | ".join(f"({a})" for a in s["arms"]) + " |"
    curve_rows = [curve_head, "|---" * (len(s["arms"]) + 1) + "|"]
    by_pct = [dict(a["mean_curve"]) for a in s["arms"].values()]
    for pct in sorted({p for curve in by_pct for p in curve}):
        cells = [f"{c[pct]:.3f}" if pct in c else "-" for c in by_pct]
        curve_rows.append(f"| {pct:g} | " + " | ".join(cells) + " |")
    params = count_parameters(read_config(source))
    times = {"pretraining": seconds(work / "source" / "DONE")}
    times |= {f"arm {arm}": a["seconds"] for arm, a in s["arms"].items()}
    earlier = sorted({a["command"] for a in s["arms"].values()} - {command})
    carried = "".join(f"\n- `{c}`" for c in earlier)
    if carried:
        carried = (
            "\nArms marked * are carried from the report's earlier runs, from the same source "
            f"(the command checks that its pretraining ends at the same perplexity):{carried}\n"
        )
    label = {
        "small": "SMALL scale (not the issue's experiment)",
        "full": "FULL scale (5.8M parameters, 1.7 tokens per parameter)",
        "converged": "converged source (~21 tokens per parameter)",
        "smoke": "SMOKE scale (a plumbing check; the numbers mean nothing)",
    }[args.scale]
    end_lr = scale.pretrain_lr * MIN_LR_RATIO
    lr_note = f"{scale.arm_lr / end_lr:g}x the end of pretraining"
    if args.arm_lr is None:
        lr_note += ", as in the paper"
    else:
        label += f", arms at lr {scale.arm_lr:g} (sensitivity run)"
    tokens_per_param = t / params
    short = ", ".join(f"({a})" for a in s["arms"] if ARMS[a].budget_pct != 15)
    text = f"""# Recovery after conversion: {label}

Generated by `bench/recovery.py`. Command that wrote this report (from the repository root;
stages that an earlier run of the same command finished, marked by `DONE` files in the work
dir, are reused, so the wall times below are those of the runs that did the work; the runs were
started under `nice`):

```bash
{command}
```
{carried}
{SMALL_NOTE if args.scale != "converged" else ""}

## Settings

- Corpus: `kjv.txt` + `gcide.txt` from `{args.corpus_dir}` (by path); validation = the last 2% of
  each file's lines (never trained on, never used for calibration); documents of
  {LINES_PER_DOC} lines; training text ~{scale.train_chars / 1e6:g}M characters at most (KJV,
  then GCIDE sampled evenly to fill it). Tokenizer: byte-level BPE, vocab {scale.vocab}, trained
  on the training split.
- Source: Llama, MHA, {scale.layers} layers, hidden {scale.hidden}, {scale.heads} heads
  (head dim {scale.hidden // scale.heads}), MLP {scale.intermediate}, tied embeddings,
  {params:,} parameters; random init (seed 0), pretrained with `skipv1 uptrain` for
  **T = {t:,} tokens** ({tokens_per_param:.1f} tokens per parameter; {100 * scale.steps_per_pct}
  steps x {scale.batch_tokens:,} tokens, sequences of {scale.seq_len}), AdamW peak lr
  {scale.pretrain_lr:g}, 5% warmup, cosine to 10%.
  Pretraining validation perplexity: {", ".join(f"{p:g}%: {v:.2f}" for p, v in pre_curve)}.
- Arms: each continues from the source for 15% of T = {15 * scale.steps_per_pct} steps
  ({15 * scale.steps_per_pct * scale.batch_tokens:,} tokens; {short}: 2.5%, below), AdamW peak lr {scale.arm_lr:g}
  ({lr_note}), 10% warmup, cosine to 10%, weight decay 0.1, clip 1.0, fp32, one process
  (ZeRO-0). Seeds are data orders (`data.seed` 2, 3, ...): seed k of every arm sees the same
  batches. Validation perplexity every 1% of T on the first {scale.eval_blocks} validation
  blocks of {scale.seq_len} tokens (the same blocks for all).
  SkipV1 arms: s = {scale.heads // 2} of {scale.heads} KV heads (`skipv1 convert --skip-heads
  {scale.heads // 2}`); calibrated and reconstruct inits fit on the first {scale.calib_tokens:,}
  training-split tokens. Distillation: alpha 0.5, T 1.0 (FLOPs include the teacher's forward,
  2 x params x tokens). Gradual conversion: `model.gradual_fraction: 0.3` from a `--init keep`
  conversion (`skipv1/uptrain/gradual.py`): the borrowed heads' values move linearly from the
  layer's own source values to layer 0's over the first 30% of the steps (4.5% of T; its
  "reaches" column counts from there, when the model is a SkipV1 model). (AF): (T) with
  `model.gradual_fraction: 0.5` from D's `reconstruct` checkpoint: besides the values, every
  linear the conversion changed (o_proj and down_proj refits, the attention distillation's
  q/k/v/o) adds (1 - m) x (source weight - converted weight) to its output, so step 0 is the
  source's function and the ramp's end (1.25% of T) the SkipV1 model's. GQA: K and V heads
  mean-pooled in adjacent pairs (`skipv1.convert.gqa`), a plain Llama checkpoint.
- Uptraining options (issue 12, item 1), one change each from (D), or from (E) for (J), on D's
  converted checkpoint, one seed: (H) only the attention modules train for the first third of
  the steps (`optim.attention_first_fraction: 0.333`, the rest held at lr 0); (I) no lr
  re-warming (`optim.warmup_fraction: 0`: the arm starts at its peak lr); (K) twice the peak
  lr; (J) distillation alpha 0.9, temperature 2. Seed 0 of every arm sees the same batches, so
  the paired table below compares them with seed 0 of (D) and (E).
- Conversion budget and schedule length: (L) is (E) from a `reconstruct` conversion on 8x the
  calibration tokens (262,144) with 300 attention-distillation steps instead of 30 (the best
  of the budgets `bench/post_conversion.py` compared on this source:
  `post_conversion_converged.table.md`). (M), (O) and (N) train for 2.5% of T only, so that their
  lr schedule (10% warmup, cosine to 10%) has ended where the first goal measures, instead of
  being near its peak there: (M) from L's checkpoint, (O) from D's (that is, (E) shortened),
  (N) the MHA control shortened. Their columns past 2.5% are empty.
- Learning rate and batch (the settings that moved the end point, one seed each, then 3 seeds
  for the best): (P) 4x the peak lr; (Q) (E) at 2x; (S) half the tokens per optimizer step
  (4,096, so twice the steps on the same tokens; the lr schedule and the evaluations follow the
  tokens); (V) (Q) at half the batch, (X) at a quarter; (Y) (V) trained for 2.5% of T; (W) (V)
  with (J)'s distillation (alpha 0.9, temperature 2), (T) that trained for 2.5% of T; (AA) and
  (AB) (V) with the KL weight moving linearly from 0.9 to 0.5 and to 0 over the run
  (`distill.alpha_end`). (R), (U)
  and (Z) are the MHA control at 2x lr, at half the batch, and with both (V's settings): the
  control's own response to the same settings. (AC) and (AD): (T) with the hidden-state term
  (`distill.hidden` = beta 1 and 10: every layer's output pulled to the source's, the mean
  over layers of ||h - h_source||^2 / ||h_source||^2, `skipv1/uptrain/distill.py`); (AE): (T) with the
  whole loss from the teacher (alpha 1, no next-token term); (AG): (AD) from (L)'s checkpoint
  (8x the calibration tokens, 300 attention-distillation steps): the best loss and the best
  conversion budget together.
- Conversion compute: an estimate of the conversion's FLOPs as a share of the source's
  pretraining FLOPs (`conversion_compute`: 2 x params per calibration token and stream, two
  streams for `reconstruct`, plus 8 x params per token of its attention distillation, 4
  sequences per step); it is not in the "reaches" column, which counts training tokens only.
- Training compute column: FLOPs of the arm's training (15% of T, or 2.5%) (6 x its parameters x tokens, plus
  2 x the teacher's parameters x tokens with distillation) as a share of the source's
  pretraining FLOPs. KV bytes/token: the formula of docs/design.md at 2 bytes per value.
- Wall time (s, mean per seed), on 2 CPU cores shared with other work:
  {", ".join(f"{k} {v:.0f}" for k, v in times.items())}.

## Results

Source validation perplexity: **{s["source_ppl"]:.3f}**. Cells: mean of the seeds
[min, max over seeds].

{chr(10).join(rows)}

![recovery curves]({report_stem(args)}.png)

## Uptraining options, paired on seed 0 (validation perplexity)

{chr(10).join(paired_rows(s))}
{scratch_section(s, pre_curve, command)}
## Goals (issue 12)

{chr(10).join(goals(s))}

## Curves (validation perplexity, mean of seeds)

{chr(10).join(curve_rows)}
"""
    out.mkdir(parents=True, exist_ok=True)
    stem = report_stem(args)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"scale": asdict(scale), **s}, indent=1))


def report_stem(args) -> str:
    """The issue's experiment is `recovery`; other scales and learning rates never overwrite it."""
    stem = "recovery" if args.scale == "converged" else f"recovery-{args.scale}"
    return stem if args.arm_lr is None else f"{stem}-lr{args.arm_lr:g}"


def arms_root(work: Path, args) -> Path:
    return work / ("arms" if args.arm_lr is None else f"arms-lr{args.arm_lr:g}")


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=SCALES, default="converged")
    p.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        help="run only these arms; the report carries the others from its last version "
        "(same scale and source); default: all",
    )
    p.add_argument("--corpus-dir", default=str(Path("..") / "shared" / "data" / "corpus"))
    p.add_argument("--work-dir", default=None, help="default: runs/recovery-SCALE")
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    p.add_argument(
        "--arm-lr",
        type=float,
        default=None,
        help="peak lr of every arm, for a sensitivity run (own arms dir and report); "
        "default: the scale's, 1.5x the end of pretraining",
    )
    p.add_argument(
        "--skipv1-from-scratch",
        action="store_true",
        help="also pretrain the SkipV1 architecture from the same random init for T tokens "
        "(as long as the source's pretraining): the architecture's own level",
    )
    p.add_argument(
        "--source-only",
        action="store_true",
        help="stop after pretraining the source (e.g. for bench/post_conversion.py --source)",
    )
    args = p.parse_args()
    scale = SCALES[args.scale]
    if args.arm_lr is not None:
        scale = replace(scale, arm_lr=args.arm_lr)
    corpus = Path(args.corpus_dir)
    if not (corpus / "kjv.txt").is_file() or not (corpus / "gcide.txt").is_file():
        sys.exit(f"--corpus-dir {corpus} must hold kjv.txt and gcide.txt")
    work = Path(args.work_dir or REPO / "runs" / f"recovery-{args.scale}").absolute()
    data, tok = work / "data", work / "tokenizer"
    init, source_dir = work / "init", work / "source"
    source = source_dir / "run" / "export"

    stage(data / "DONE", "split corpus", lambda: split_corpus(corpus, data, scale.train_chars))
    stage(tok / "DONE", "train tokenizer", lambda: train_tokenizer(data, tok, scale.vocab))
    stage(init / "DONE", "random init", lambda: random_init(scale, tok, init))
    stage(
        source_dir / "DONE",
        f"pretrain source for {scale.pretrain_tokens:,} tokens",
        lambda: uptrain(recipe(scale, init, data, pretrain=True, teacher=None), source_dir),
    )
    if args.source_only:
        print(f"source: {source}")
        return
    if args.skipv1_from_scratch:
        stage(
            work / "scratch" / "DONE",
            f"pretrain SkipV1 from scratch for {scale.pretrain_tokens:,} tokens",
            lambda: pretrain_skipv1(init, data, scale, work / "scratch"),
        )
    root = arms_root(work, args)
    only = set(args.arms or ARMS)
    for arm, spec in ARMS.items():
        if arm not in only:
            continue
        for k, out in enumerate(seed_dirs(root, arm)):

            def run_arm(arm=arm, spec=spec, k=k, out=out):
                model = arm_model(arm, source, data, scale, root / arm)
                teacher = source if spec.distill else None
                config = recipe(
                    scale,
                    model,
                    data,
                    pretrain=False,
                    teacher=teacher,
                    seed=k,
                    arm=spec,
                )
                uptrain(config, out)

            stage(out / "DONE", f"arm {arm} seed {k}: {spec.label}", run_arm)
    results = Path(args.out)
    last_path = results / f"{report_stem(args)}.json"
    last = json.loads(last_path.read_text()) if last_path.is_file() else {}
    if last.get("scale") != asdict(scale):
        last = {}  # arms of another scale or schedule are not comparable: carry none
    command = (".venv/bin/python bench/recovery.py " + shlex.join(sys.argv[1:])).strip()
    s = summarize(arms_root(work, args), scale, source, last, command, only)
    s["scratch"] = scratch_curve(work, scale, last, command, args.skipv1_from_scratch)
    s["skip_heads"], s["kv_heads"] = scale.heads // 2, scale.heads
    results.mkdir(parents=True, exist_ok=True)
    plot(s, args.scale, results / f"{report_stem(args)}.png")
    write_report(s, args, scale, work, results, command)
    print(f"wrote {results / report_stem(args)}.md")


if __name__ == "__main__":
    main()
