"""Decode speed of a SkipV1 model against its source, side by side in one run:

    .venv/bin/python bench/serving.py                 # SmolLM2-135M shape, ctx 512/4k/16k, batch 1/8

Both models have the same shape (SmolLM2-135M by default: 30 layers, 9 heads, 3 KV heads, random
weights, since speed does not depend on their values); the SkipV1 one computes s = n_kv // 2 of
its value heads from layer 0. For each context length and batch size the cache is filled with
random keys and values of that length (no prefill: only decoding is measured), then `--steps`
greedy decode steps are timed through the model's forward with transformers' default
DynamicCache, alternating source and SkipV1 `--repeats` times. Tokens/s are medians; the ratio is
SkipV1 / source. Writes docs/results/serving.md and .json (`--report` for another name; `--device
cuda --dtype bfloat16 --attn flash_attention_2` on a GPU).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from skipv1 import SkipV1LlamaConfig, SkipV1LlamaForCausalLM
from skipv1.modeling.layout import kv_layout

sys.path.insert(0, str(Path(__file__).parent))
from kv_cache_bytes import SHAPE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# SmolLM2-135M's shape (bench/kv_cache_bytes.py), with room for the longest context measured
SMOLLM2 = dict(SHAPE, max_position_embeddings=32768, rope_theta=100000.0)


def models(dtype: torch.dtype, device: str = "cpu", attn: str = "sdpa"):
    torch.manual_seed(0)
    shape = dict(SMOLLM2, attn_implementation=attn)
    source = LlamaForCausalLM(LlamaConfig(**shape)).to(device, dtype).eval()
    skip = SMOLLM2["num_key_value_heads"] // 2
    skipv1 = SkipV1LlamaForCausalLM(SkipV1LlamaConfig(**shape, skip_v_heads=skip))
    return source, skipv1.to(device, dtype).eval()


def filled_cache(model, batch: int, ctx: int, dtype: torch.dtype) -> DynamicCache:
    """A DynamicCache holding `ctx` random tokens in every layer, shaped as the model's."""
    config = model.config
    cache = DynamicCache(config=config)
    # drawn on the model's device: a GPU fills a 32k x 16 cache in well under a second
    gen = torch.Generator(model.device).manual_seed(1)
    d = config.head_dim
    for i in range(config.num_hidden_layers):
        own = config.own_value_heads(i) if hasattr(config, "own_value_heads") else None
        kv = config.num_key_value_heads
        draw = dict(generator=gen, device=model.device, dtype=dtype)
        keys = torch.randn(batch, kv, ctx, d, **draw)
        values = torch.randn(batch, own or kv, ctx, d, **draw)
        cache.update(keys, values, i)
    return cache


@torch.no_grad()
def decode_tokens_per_s(
    model, batch: int, ctx: int, steps: int, dtype: torch.dtype, warmup: int = 4
) -> float:
    cache = filled_cache(model, batch, ctx, dtype)
    ids = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    mask = torch.ones(batch, ctx + warmup + steps, dtype=torch.long, device=model.device)

    def step(t: int) -> torch.Tensor:
        pos = torch.full((batch, 1), ctx + t, device=model.device)
        out = model(
            input_ids=ids,
            attention_mask=mask[:, : ctx + t + 1],
            position_ids=pos,
            cache=cache,
            use_cache=True,
        )
        return out.logits[:, -1].argmax(-1, keepdim=True)

    # warm-up steps, not timed: the first appends to a fresh cache page-fault their new buffers
    # in (glibc's malloc maps large blocks afresh until its mmap threshold has risen), several
    # times slower than the steady state
    for t in range(warmup):
        ids = step(t)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else lambda: None
    sync()
    start = time.perf_counter()
    for t in range(warmup, warmup + steps):
        ids = step(t)
    sync()
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 16384])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=4, help="untimed decode steps before the timed")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--attn", default="sdpa", help="attention implementation, e.g. flash_attention_2"
    )
    p.add_argument("--report", default="serving", help="report file stem in --out")
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    source, skipv1 = models(dtype, args.device, args.attn)
    layout = kv_layout(skipv1.config.to_dict())
    load_before = os.getloadavg()
    rows = []
    for ctx in args.contexts:
        for batch in args.batches:
            times = {"source": [], "skipv1": []}
            for _ in range(args.repeats):  # interleaved: noise hits both alike
                for name, model in (("source", source), ("skipv1", skipv1)):
                    times[name].append(
                        decode_tokens_per_s(model, batch, ctx, args.steps, dtype, args.warmup)
                    )
            src, sk = (statistics.median(times[k]) for k in ("source", "skipv1"))
            row = {
                "context": ctx,
                "batch": batch,
                "source_tokens_per_s": src,
                "skipv1_tokens_per_s": sk,
                "ratio": sk / src,
                "runs": times,
            }
            rows.append(row)
            print(
                f"ctx {ctx:>6} batch {batch}: source {src:8.1f} tok/s, SkipV1 {sk:8.1f} tok/s, "
                f"ratio {sk / src:.3f}",
                flush=True,
            )
    load_after = os.getloadavg()
    write_report(rows, args, layout, load_before, load_after)


def write_report(rows, args, layout, load_before, load_after) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = [
        "| context | batch | source tok/s | SkipV1 tok/s | ratio (SkipV1 / source) | runs (tok/s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = "; ".join(
            f"{k}: " + ", ".join(f"{v:.1f}" for v in vals) for k, vals in r["runs"].items()
        )
        table.append(
            f"| {r['context']:,} | {r['batch']} | {r['source_tokens_per_s']:.1f} | "
            f"{r['skipv1_tokens_per_s']:.1f} | {r['ratio']:.3f} | {runs} |"
        )
    kv_ratio = layout.bytes_per_token(2) / layout.with_skip(0).bytes_per_token(2)
    device = args.device
    if device.startswith("cuda"):
        device = f"{torch.cuda.get_device_name(torch.device(device))}, {args.attn}"
    command = " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()
        if k not in ("out", "report")
    )
    text = f"""# Decode speed: SkipV1 vs its source ({device})

Generated by `bench/serving.py` (command: `.venv/bin/python bench/serving.py
{command}`).

- Shape: SmolLM2-135M (30 layers, hidden 576, 9 heads, 3 KV heads, head dim 64), random weights,
  {args.dtype}; SkipV1 with s = 1 (KV bytes per token {kv_ratio:.3f}x the source's).
- Each cell: the cache filled with `context` random tokens (no prefill), then {args.steps} timed
  greedy decode steps after {args.warmup} untimed warm-up steps, through the model's forward
  with transformers' default DynamicCache; source and SkipV1 alternated {args.repeats} times; medians.
- Machine: {os.cpu_count()} CPU cores, load average {load_before[0]:.2f} before and
  {load_after[0]:.2f} after the run (1-minute).

{chr(10).join(table)}
"""
    (out / f"{args.report}.md").write_text(text)
    (out / f"{args.report}.json").write_text(
        json.dumps({"args": vars(args), "rows": rows}, indent=1)
    )
    print(f"wrote {out / args.report}.md")


if __name__ == "__main__":
    main()
