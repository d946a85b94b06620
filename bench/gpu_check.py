"""The GPU check (run by bench/gpu_check.sh on a CUDA machine with the project installed):

1. uptrain speed: SmolLM2-135M-Instruct (the packaged GGUF, as HF; or `--source DIR`, see
   below) and its SkipV1 conversion (`--init keep`: speed does not depend on the init),
   `--steps` steps each of the same bf16 recipe on one GPU (ZeRO-0, embedded CPython docs,
   sequences of 2,048); tokens/s and MFU from metrics.jsonl, medians over the steps after the
   first 5.
2. decode: bench/serving.py at `--contexts` (8k, 16k, 32k), batch 16, bf16, SDPA and (when
   installed) flash-attention, source and SkipV1 alternated 3 times.
3. continuous batching: bench/serving_cb.py's fixed workload through `generate_batch` on the
   GPU at a fixed KV budget (`--cb-budget-seqs` source sequences), alternated, medians.
4. capacity: the largest batch of 8k-token sequences a fixed KV budget holds, from
   transformers' paged cache for both models (bench/serving_cb.py's capacity()).

`--stages` picks and orders them (default: decode, cb, uptrain, capacity: the issue's goals
first). Each stage runs on its own: one that fails is reported with its error and the others
still run, and the report is rewritten after every stage.
`--source DIR` takes a model directory; one holding only a config and tokenizer (no weights)
gets seeded random weights of that config, for machines the 93 MB GGUF package cannot reach
(speed does not depend on the weights' values).
`--device cpu --steps 3 --contexts 256 --batch 2 --cb-requests 4` runs the same code on a CPU
(plumbing only). Writes docs/results/gpu.md and .json (`--report`, `--out`).
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


def models(work: Path, source_dir: str | None) -> dict[str, Path]:
    source = work / "source"
    if source_dir is None:
        from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

        export_gguf_as_hf(smollm2_gguf_path(), source)
    elif any(Path(source_dir).glob("*.safetensors")):
        source = Path(source_dir)
    else:
        random_weights(Path(source_dir), source)
    skipv1("convert", str(source), str(work / "skipv1"), "--init", "keep", "--quiet")
    return {"source": source, "skipv1": work / "skipv1"}


def random_weights(config_dir: Path, dst: Path) -> None:
    """A checkpoint of `config_dir`'s config with seeded random weights, and its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(dst)


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


def cb_workload(args, out: Path) -> dict:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    cmd = [sys.executable, str(REPO / "bench" / "serving_cb.py"), "--device", args.device]
    cmd += ["--dtype", dtype, "--skip-serve", "--repeats", "2", "--requests", str(args.cb_requests)]
    cmd += ["--prompt", "512", "--new", "64", "--budget-seqs", str(args.cb_budget_seqs)]
    cmd += ["--out", str(out), "--report", "cb"]
    subprocess.run(cmd, check=True)
    return json.loads((out / "cb.json").read_text())["workload"]


def has_flash_attention() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--source", default=None, help="model dir (default: the packaged GGUF)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--cb-requests", type=int, default=192)
    p.add_argument("--cb-budget-seqs", type=int, default=32)
    p.add_argument("--kv-budget-gib", type=float, default=8.0)
    p.add_argument("--stages", nargs="+", default=["decode", "cb", "uptrain", "capacity"])
    p.add_argument("--report", default="gpu")
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = p.parse_args()
    started = time.time()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu for a plumbing check")
    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    from skipv1.convert.provenance import library_versions

    result["versions"] = library_versions(("torch", "transformers", "deepspeed", "flash-attn"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        stages = {
            "uptrain": lambda: {
                name: uptrain_speed(path, work, args)
                for name, path in models(work, args.source).items()
            },
            "decode": lambda: {
                attn: decode(args, attn, work)
                for attn in ["sdpa"] + (["flash_attention_2"] if has_flash_attention() else [])
            },
            "cb": lambda: cb_workload(args, work),
            "capacity": lambda: capacity(args),
        }
        for name in args.stages:
            result[name] = run_stage(name, stages[name])
            result["seconds"] = round(time.time() - started)
            write_report(result, args)  # after every stage: a cut-off run keeps what it has


def run_stage(name: str, stage) -> dict:
    """The stage's result, or {"error": ...}: one failing stage does not stop the others."""
    start = time.time()
    try:
        out = stage()
    except Exception as e:  # reported in the results, with the stage's own output above it
        print(f"stage {name} failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    print(f"stage {name}: {time.time() - start:.0f} s", flush=True)
    return out


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
    text = f"""# GPU check: {r["device"]}

Generated by `bash bench/gpu_check.sh {" ".join(sys.argv[1:])}` (`bench/gpu_check.py`,
{r["seconds"]} s in all). Versions: {r["versions"]}.

## Uptrain speed, one device, same recipe ({args.steps} steps)

{section(r, "uptrain", uptrain_text)}

## Decode (random weights in SmolLM2's shape, filled DynamicCache, medians of 3)

{section(r, "decode", decode_text)}

## Continuous batching: a fixed workload at a fixed KV budget (`generate_batch`)

{section(r, "cb", cb_text)}

## Capacity at a {args.kv_budget_gib:g} GiB KV budget (bf16, sequences of 8,192 tokens)

{section(r, "capacity", capacity_text)}
"""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.report}.md").write_text(text)
    (out / f"{args.report}.json").write_text(json.dumps({"args": vars(args), **r}, indent=1))
    print(f"wrote {out / args.report}.md", flush=True)


def section(r: dict, name: str, render) -> str:
    if name not in r:
        return "Not run."
    if "error" in r[name]:
        return f"Failed: `{r[name]['error']}`."
    return render(r[name])


def uptrain_text(up: dict) -> str:
    rows = ["| model | tokens/s | TFLOP/s | MFU |", "|---|---|---|---|"]
    for name, u in up.items():
        mfu = f"{u['mfu']:.1%}" if "mfu" in u else "-"
        rows.append(f"| {name} | {u['tokens_per_s']:,.0f} | {u['tflops']:.1f} | {mfu} |")
    ratio = up["skipv1"]["tokens_per_s"] / up["source"]["tokens_per_s"]
    return "\n".join(rows) + f"\n\nSkipV1 / source tokens/s: **{ratio:.3f}**."


def decode_text(decode: dict) -> str:
    dec = ["| attention | context | batch | source tok/s | SkipV1 tok/s | ratio | runs (tok/s) |"]
    dec.append("|---|---|---|---|---|---|---|")
    for attn, cells in decode.items():
        for c in cells:
            runs = "; ".join(
                f"{k}: " + ", ".join(f"{v:,.0f}" for v in vals) for k, vals in c["runs"].items()
            )
            dec.append(
                f"| {attn} | {c['context']:,} | {c['batch']} | {c['source_tokens_per_s']:,.0f} | "
                f"{c['skipv1_tokens_per_s']:,.0f} | {c['ratio']:.3f} | {runs} |"
            )
    return "\n".join(dec)


def cb_text(w: dict) -> str:
    runs = "; ".join(f"{k}: " + ", ".join(f"{v:,.0f}" for v in vs) for k, vs in w["runs"].items())
    return (
        f"Generated tokens/s (medians): source {w['median']['source']:,.0f}, SkipV1 "
        f"{w['median']['skipv1']:,.0f}, ratio **{w['ratio']:.3f}**; whole sequences each cache "
        f"holds at once: {w['sequences_held']}. Runs: {runs}. (The workload: bench/serving_cb.py "
        "with the arguments in gpu.json's `args`: 512 prompt + 64 new tokens per request.)"
    )


def capacity_text(cap: dict) -> str:
    ratio = cap["skipv1"] / max(cap["source"], 1)
    return f"source {cap['source']}, SkipV1 {cap['skipv1']} ({ratio:.2f}x)."


if __name__ == "__main__":
    main()
