"""Where decode time goes in a later SkipV1 layer: one decode step's attention, side by side:

    .venv/bin/python bench/attention_split.py        # SmolLM2-135M heads, ctx 512/4k/16k, batch 1/8

For one query token over `context` cached tokens (SmolLM2-135M's 9 heads, 3 KV heads, head dim
64; s = 1 borrowed KV head), through transformers' registered attention function (`--attn`,
default sdpa), three ways:
- source: one call over the layer's own 3 value heads (what the stock model does);
- split: what SkipV1 layers do (`skipv1.modeling.split_attention_skipv1`, the package's code),
  one call over the 2 own heads and one over the borrowed head (query heads sliced by group),
  outputs merged by head: no copy of the value cache;
- concat: torch.cat of the own and borrowed value heads, then one call (a copy per step).
The three alternate `--repeats` times (noise hits all alike); each time is the mean over
`--calls` calls; medians in microseconds. The split's extra time per decode step of the whole
model is (split - source) x the later layers (29). Writes docs/results/attention_split.md and .json.
"""

import argparse
import json
import os
import statistics
import time
import types
from pathlib import Path

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from skipv1.modeling.split_attention_skipv1 import attend_split

REPO = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM, OWN, LATER_LAYERS = 9, 3, 64, 2, 29
GROUPS = HEADS // KV_HEADS


def ways(attn: str, batch: int, ctx: int) -> dict:
    """The three ways to attend, as closures over one random cache (same result each)."""
    attend = ALL_ATTENTION_FUNCTIONS[attn]
    module = types.SimpleNamespace(num_key_value_groups=GROUPS, is_causal=True, training=False)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, HEADS, 1, HEAD_DIM, generator=gen)
    k = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, generator=gen)
    own = torch.randn(batch, OWN, ctx, HEAD_DIM, generator=gen)  # the layer's own value cache
    borrowed = torch.randn(batch, KV_HEADS - OWN, ctx, HEAD_DIM, generator=gen)  # layer 0's
    full = torch.cat([own, borrowed], dim=1)  # the source layer's cache: the same values

    def call(query, keys, values):
        return attend(module, query, keys, values, None, scaling=HEAD_DIM**-0.5)[0]

    def split():
        part = lambda *qkv: attend(module, *qkv, None, scaling=HEAD_DIM**-0.5)  # noqa: E731
        return attend_split(part, q, k, own, borrowed, GROUPS)[0]

    return {
        "source": lambda: call(q, k, full),
        "split": split,
        "concat": lambda: call(q, k, torch.cat([own, borrowed], dim=1)),
    }


def microseconds(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(attn: str, batch: int, ctx: int, calls: int, repeats: int) -> dict:
    fns = ways(attn, batch, ctx)
    reference = fns["source"]()
    for name, fn in fns.items():  # the ways must agree before their times mean anything
        torch.testing.assert_close(fn(), reference, msg=f"{name} differs from source")
        fn()  # warm-up
    runs = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(microseconds(fn, calls))
    return {name: statistics.median(times) for name, times in runs.items()} | {"runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 16384])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = p.parse_args()
    torch.set_grad_enabled(False)
    load_before = os.getloadavg()
    rows = []
    for ctx in args.contexts:
        for batch in args.batches:
            # long contexts: fewer calls, so that each cell takes seconds, not minutes
            calls = max(10, args.calls * 512 * 1 // (ctx * batch))
            row = {"context": ctx, "batch": batch, "calls": calls}
            row |= measure(args.attn, batch, ctx, calls, args.repeats)
            rows.append(row)
            print(
                f"ctx {ctx:>6} batch {batch}: source {row['source']:8.1f} us, split "
                f"{row['split']:8.1f} us, concat {row['concat']:8.1f} us",
                flush=True,
            )
    write_report(rows, args, load_before, os.getloadavg())


def write_report(rows, args, load_before, load_after) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = [
        "| context | batch | calls | source (us) | split (us) | concat (us) | split / source "
        "| concat / source | split's extra per model step (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        extra = (r["split"] - r["source"]) * LATER_LAYERS / 1000
        table.append(
            f"| {r['context']:,} | {r['batch']} | {r['calls']} | {r['source']:.1f} | "
            f"{r['split']:.1f} | {r['concat']:.1f} | {r['split'] / r['source']:.3f} | "
            f"{r['concat'] / r['source']:.3f} | {extra:+.2f} |"
        )
    text = f"""# One later layer's decode attention: split (SkipV1) vs one call (source) vs concatenation

Generated by `bench/attention_split.py` (command: `.venv/bin/python bench/attention_split.py
--contexts {" ".join(map(str, args.contexts))} --batches {" ".join(map(str, args.batches))}
--calls {args.calls} --repeats {args.repeats} --attn {args.attn}`).

- One query token, SmolLM2-135M's heads (9 query, 3 KV, head dim 64), float32, s = 1: the split
  (the package's `attend_split`) attends the 2 own value heads and the borrowed one in two
  calls of transformers' registered `{args.attn}` attention; concat copies the heads into one
  tensor first. Random values; all three give the same output (checked before timing).
- Each cell: the three alternated {args.repeats} times, each time the mean of `calls` calls;
  medians. Machine: {os.cpu_count()} CPU cores, load average {load_before[0]:.2f} before and
  {load_after[0]:.2f} after the run (1-minute).
- Last column: (split - source) x {LATER_LAYERS} later layers, the split's cost per decode step of
  the whole model, against the source's (negative: faster).

{chr(10).join(table)}
"""
    (out / "attention_split.md").write_text(text)
    (out / "attention_split.json").write_text(
        json.dumps({"args": vars(args), "rows": rows}, indent=1)
    )
    print(f"wrote {out / 'attention_split.md'}")


if __name__ == "__main__":
    main()
