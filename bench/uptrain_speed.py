"""Tokens/s of the uptrain loop: SkipV1 vs the source MHA model, and vs a bare
forward/backward/step loop on the same DeepSpeed engine, 2 CPU ranks, one run.

    .venv/bin/python bench/uptrain_speed.py            # writes docs/results/uptrain.md

Each measurement is a fresh `torchrun --nproc-per-node 2` of this file in worker mode; the
three are interleaved over `--rounds` rounds and the median is reported. The uptrain loop's speed is
wall-clock over the measured steps from metrics.jsonl timestamps (so data, loss all-reduce,
logging and the progress bar all count); the bare loop times the same steps with pre-built
tensors and nothing else.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torchrun_ranks import REPO, rank_env, run_ranks

SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
)
SEQ, BATCH_TOKENS, MICRO, WARMUP, STEPS = 128, 4096, 4, 3, 15


def build(root: Path) -> dict[str, Path]:
    """A random MHA Llama (the source) and the same shape as SkipV1 with s = n_kv / 2."""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from factories import build_tokenizer, make_checkpoint, tiny_config

    from skipv1 import SkipV1LlamaConfig, SkipV1LlamaForCausalLM

    tok = build_tokenizer(root / "tok")
    source = make_checkpoint(root / "source", tokenizer_dir=tok, **SHAPE)
    fields = tiny_config(**SHAPE).to_dict()
    for key in ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype"):
        fields.pop(key, None)
    torch.manual_seed(0)
    skip = root / "skipv1"
    SkipV1LlamaForCausalLM(SkipV1LlamaConfig(**fields, skip_v_heads=4)).save_pretrained(skip)
    for file in tok.iterdir():
        (skip / file.name).write_bytes(file.read_bytes())
    return {"source": source, "skipv1": skip}


def recipe(model: Path, run_dir: Path) -> dict:
    return {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {"train": "embedded:train", "seq_len": SEQ},
        "budget": {"tokens": STEPS * BATCH_TOKENS},
        "batch": {"global_batch_tokens": BATCH_TOKENS, "micro_batch_size": MICRO},
        "deepspeed": {"zero_stage": 2},
        "checkpoint": {"every": 0, "resume": "never"},
        "log": {"progress": True, "tensorboard": False},
        "export": False,
        "run_dir": str(run_dir),
    }


def worker(mode: str, recipe_file: Path, out: Path) -> None:
    """Runs on each rank under torchrun; rank 0 writes tokens/s to `out`."""
    import torch

    from skipv1.uptrain.data import rank_micro_batches
    from skipv1.uptrain.metrics import read_metrics
    from skipv1.uptrain.recipe import load_recipe
    from skipv1.uptrain.trainer import UptrainRecipe

    r = load_recipe(recipe_file)
    trainer = UptrainRecipe(r)
    trainer.setup()
    env = trainer.env
    if mode == "loop":
        trainer.train()
        steps = [m for m in read_metrics(r.run_dir) if "loss" in m]
        span = steps[-1]["time"] - steps[WARMUP - 1]["time"]
        tps = (len(steps) - WARMUP) * BATCH_TOKENS / span
    else:  # bare: the same engine and batches, nothing but forward/backward/step
        engine, batches = trainer.engine, trainer.train_data.batches(0)
        micro = [
            [torch.from_numpy(m) for m in rank_micro_batches(next(batches), env.rank, 2, MICRO)]
            for _ in range(STEPS)
        ]
        for step, micros in enumerate(micro):
            if step == WARMUP:
                torch.distributed.barrier()
                started = time.time()
            for ids in micros:
                engine.backward(engine(input_ids=ids, labels=ids, use_cache=False).loss)
                engine.step()
        torch.distributed.barrier()
        tps = (STEPS - WARMUP) * BATCH_TOKENS / (time.time() - started)
    trainer.close()
    if env.is_main:
        out.write_text(json.dumps({"tokens_per_s": tps}))


def measure(name: str, mode: str, model: Path, root: Path) -> float:
    run_dir = root / f"run-{name}-{mode}-{time.monotonic_ns()}"
    out = run_dir.with_suffix(".json")
    args = ["--worker", mode, "--out", str(out)]
    run_ranks(__file__, recipe(model, run_dir), run_dir.with_suffix(".yaml"), args, rank_env())
    return json.loads(out.read_text())["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--recipe", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report", type=Path, default=REPO / "docs/results/uptrain.md")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.recipe, args.out)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = build(root)
        cases = [("skipv1", "loop"), ("source", "loop"), ("skipv1", "bare")]
        results: dict = {case: [] for case in cases}
        for _ in range(args.rounds):
            for name, mode in cases:
                results[(name, mode)].append(measure(name, mode, models[name], root))
                print(name, mode, f"{results[(name, mode)][-1]:,.0f} tok/s", flush=True)
    median = {case: statistics.median(v) for case, v in results.items()}
    write_report(args.report, results, median, args.rounds)


def write_report(path: Path, results: dict, median: dict, rounds: int) -> None:
    skip, src, bare = median["skipv1", "loop"], median["source", "loop"], median["skipv1", "bare"]
    ratio, overhead = skip / src, 1 - skip / bare
    import platform

    import deepspeed
    import torch

    rows = "\n".join(
        f"| {name} | {mode} | {median[(name, mode)]:,.0f} | "
        + ", ".join(f"{v:,.0f}" for v in results[(name, mode)])
        + " |"
        for name, mode in results
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""# Uptrain loop speed

Command: `.venv/bin/python bench/uptrain_speed.py` (rounds={rounds}); {os.cpu_count()} CPU cores
({platform.processor() or platform.machine()}), torch {torch.__version__}, deepspeed
{deepspeed.__version__}; 2 ranks (torchrun, gloo, OMP_NUM_THREADS=1), ZeRO-2, fp32.

Model: random Llama shape hidden {SHAPE["hidden_size"]}, {SHAPE["num_hidden_layers"]} layers,
{SHAPE["num_attention_heads"]} heads (MHA), intermediate {SHAPE["intermediate_size"]}, vocab 320;
SkipV1 with s = 4 (half the value heads from layer 0). seq_len {SEQ}, {BATCH_TOKENS} tokens per
step (micro-batch {MICRO}, 4 accumulation steps per rank), {STEPS} steps of which the first
{WARMUP} are not timed. Median over rounds (the three cases interleaved).

| model | loop | tokens/s (median) | each round |
|---|---|---|---|
{rows}

- SkipV1 / source, same uptrain loop: **{ratio:.3f}x** (goal >= 1.0x)
- uptrain loop overhead vs the bare forward/backward/step loop: **{overhead:.1%}** (goal < 5%)

The uptrain loop's time is wall clock between step records in metrics.jsonl (data slicing, the
per-step loss all-reduce, metrics.jsonl, progress bar included); the bare loop runs the same
engine on pre-built tensors. The machine is shared with other work, so rounds vary by several
percent; read ratios near the goals with that in mind.
""")
    print(path.read_text())


if __name__ == "__main__":
    main()
