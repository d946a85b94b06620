"""The GPU check (run by bench/gpu_check.sh on a CUDA machine with the project installed):

1. uptrain speed: SmolLM2-135M-Instruct (the packaged GGUF, as HF) and its SkipV1 conversion
   (`--init keep`: speed does not depend on the init), `--steps` steps each of the same bf16
   recipe on one GPU (ZeRO-0, embedded CPython docs, sequences of 2,048); tokens/s and MFU
   from metrics.jsonl, medians over the steps after the first 5.
2. decode: bench/serving.py at 8k context, batch 16, bf16, SDPA and (when installed)
   flash-attention, source and SkipV1 alternated 3 times.
3. capacity: the largest batch of 8k-token sequences a fixed KV budget holds, from
   transformers' paged cache for both models (bench/serving_cb.py's capacity()).

`--device cpu --steps 3 --contexts 256 --batch 2` runs the same code on a CPU (plumbing only).
Writes docs/results/gpu.md (or `--report`).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def skipv1(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "skipv1", *args], check=True)


def models(work: Path) -> dict[str, Path]:
    from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

    source = export_gguf_as_hf(smollm2_gguf_path(), work / "source")
    skipv1("convert", str(source), str(work / "skipv1"), "--init", "keep", "--quiet")
    return {"source": source, "skipv1": work / "skipv1"}


def uptrain_speed(path: Path, work: Path, args) -> dict:
    seq = 2048 if args.device == "cuda" else 128
    recipe = {
        "model": {"path": str(path), "dtype": "bfloat16" if args.device == "cuda" else "float32"},
        "data": {"train": "embedded:train", "eval": None, "seq_len": seq},
        "budget": {"tokens": args.steps * 16 * seq},
        "batch": {
            "global_batch_tokens": 16 * seq,
            "micro_batch_size": 16 if args.device == "cuda" else 4,
        },
        "deepspeed": {"zero_stage": 0},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "tensorboard": False},
        "export": False,
    }
    file = work / f"{path.name}.yaml"
    file.write_text(yaml.safe_dump(recipe))
    run_dir = work / f"run-{path.name}"
    skipv1("uptrain", str(file), "--run-dir", str(run_dir), "--quiet")
    from skipv1.uptrain.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if "loss" in r][5:] or [
        r for r in read_metrics(run_dir) if "loss" in r
    ]
    out = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows)}
    out["tflops"] = statistics.median(r["tflops"] for r in rows)
    if all("mfu" in r for r in rows):
        out["mfu"] = statistics.median(r["mfu"] for r in rows)
    return out


def decode(args, attn: str, out: Path) -> dict:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    cmd = [sys.executable, str(REPO / "bench" / "serving.py"), "--device", args.device]
    cmd += ["--dtype", dtype, "--attn", attn, "--contexts", *map(str, args.contexts)]
    cmd += ["--batches", str(args.batch), "--repeats", "3", "--steps", "16"]
    cmd += ["--out", str(out), "--report", f"decode-{attn}"]
    subprocess.run(cmd, check=True)
    return json.loads((out / f"decode-{attn}.json").read_text())["rows"]


def has_flash_attention() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--contexts", type=int, nargs="+", default=[8192])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--kv-budget-gib", type=float, default=8.0)
    p.add_argument("--report", default="gpu")
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = p.parse_args()
    started = time.time()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu for a plumbing check")
    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dirs = models(work)
        result["uptrain"] = {name: uptrain_speed(path, work, args) for name, path in dirs.items()}
        attns = ["sdpa"] + (["flash_attention_2"] if has_flash_attention() else [])
        result["decode"] = {attn: decode(args, attn, work) for attn in attns}
    result["capacity"] = capacity(args)
    result["seconds"] = round(time.time() - started)
    write_report(result, args)


def capacity(args) -> dict:
    from serving_cb import SMOLLM2, cache_for, configs

    source, skip = configs(SMOLLM2, SMOLLM2["num_key_value_heads"] // 2)
    import torch

    from skipv1.paged_budget import source_block_bytes

    per_block = source_block_bytes(source, 16, torch.bfloat16)  # a source block of 16 tokens
    budget = int(args.kv_budget_gib * 2**30 // per_block) * per_block
    seqs = {}
    for name, config in (("source", source), ("skipv1", skip)):
        (allocator,) = cache_for(config, budget).cache_allocators.values()
        seqs[name] = allocator.num_blocks * allocator.tokens_per_page // 8192
    return seqs


def write_report(r: dict, args) -> None:
    up = r["uptrain"]
    rows = ["| model | tokens/s | TFLOP/s | MFU |", "|---|---|---|---|"]
    for name, u in up.items():
        mfu = f"{u['mfu']:.1%}" if "mfu" in u else "-"
        rows.append(f"| {name} | {u['tokens_per_s']:,.0f} | {u['tflops']:.1f} | {mfu} |")
    dec = ["| attention | context | batch | source tok/s | SkipV1 tok/s | ratio |"]
    dec.append("|---|---|---|---|---|---|")
    for attn, cells in r["decode"].items():
        for c in cells:
            dec.append(
                f"| {attn} | {c['context']:,} | {c['batch']} | {c['source_tokens_per_s']:,.0f} | "
                f"{c['skipv1_tokens_per_s']:,.0f} | {c['ratio']:.3f} |"
            )
    cap = r["capacity"]
    text = f"""# GPU check: {r["device"]}

Generated by `bash bench/gpu_check.sh` (`bench/gpu_check.py`, {r["seconds"]} s in all).

## Uptrain speed, one device, same recipe ({args.steps} steps)

{chr(10).join(rows)}

SkipV1 / source tokens/s: **{up["skipv1"]["tokens_per_s"] / up["source"]["tokens_per_s"]:.3f}**.

## Decode (random weights in SmolLM2's shape, filled DynamicCache, medians of 3)

{chr(10).join(dec)}

## Capacity at a {args.kv_budget_gib:g} GiB KV budget (bf16, sequences of 8,192 tokens)

source {cap["source"]}, SkipV1 {cap["skipv1"]} ({cap["skipv1"] / max(cap["source"], 1):.2f}x).
"""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.report}.md").write_text(text)
    (out / f"{args.report}.json").write_text(json.dumps({"args": vars(args), **r}, indent=1))
    print(f"wrote {out / args.report}.md")


if __name__ == "__main__":
    main()
