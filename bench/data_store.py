"""The token store (skipv1/uptrain/token_store.py): tokenization throughput, per-rank data
memory, and the cost of starting a run at step 0 against resuming at a late step.

    .venv/bin/python bench/data_store.py      # ~5 minutes on 2 CPU cores

1. Build the store of a KJV + GCIDE sample (from --corpus-dir, by path) with SmolLM2's tokenizer,
   with 1 and 2 tokenizer processes (`data.num_proc`), alternated `--repeats` times, medians.
2. Data memory of one rank: the resident-set growth of a fresh process that opens the data and
   reads one global batch, the store (memory-mapped) against the in-memory loader the store
   replaced (`load_blocks`: every block as int64).
3. Data cost of a start and of a resume: the time `make_train_batches` (what `skipv1 uptrain`
   runs before its first step) plus reading the first batch takes at step 0 and at step 2,000,
   with the store already built.
4. Data time per step in a real run: `skipv1 uptrain --nproc 2` of a small random Llama with
   SmolLM2's vocabulary from that store; metrics.jsonl's `data_s` (rank 0 reading its rows)
   against the wall-clock time between step records.
Writes docs/results/data_store.md and .json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 512
BATCH_TOKENS = 8 * SEQ_LEN


def write_corpus(corpus: Path, out: Path, chars: int) -> Path:
    """50-line documents from KJV and GCIDE, `chars` characters of each, as JSONL."""
    lines_out = []
    for name in ("kjv.txt", "gcide.txt"):
        text = (corpus / name).read_text(encoding="utf-8", errors="replace")[:chars]
        lines = text.splitlines()
        for i in range(0, len(lines), 50):
            doc = "\n".join(lines[i : i + 50])
            if doc.strip():
                lines_out.append(json.dumps({"text": doc}))
    path = out / "train.jsonl"
    path.write_text("\n".join(lines_out) + "\n")
    return path


def recipe_for(model_dir: Path, data: Path, cache: Path, num_proc: int, streaming=False):
    from skipv1.uptrain.recipe import load_recipe

    config = {
        "model": {"path": str(model_dir)},
        "data": {
            "train": str(data),
            "eval": None,
            "seq_len": SEQ_LEN,
            "cache_dir": str(cache),
            "num_proc": num_proc,
            "streaming": streaming,
        },
        "budget": {"tokens": 4000 * BATCH_TOKENS},
        "batch": {"global_batch_tokens": BATCH_TOKENS, "micro_batch_size": 1},
    }
    path = cache / f"recipe-{num_proc}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    path.write_text(yaml.safe_dump(config))
    return load_recipe(path, [])


def tokenizer_dir(work: Path) -> Path:
    """SmolLM2's tokenizer files (from the packaged GGUF), saved once."""
    from transformers import AutoTokenizer

    from skipv1.smollm2 import smollm2_gguf_path

    out = work / "tokenizer"
    if not (out / "tokenizer.json").is_file():
        gguf = smollm2_gguf_path()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def throughput(work: Path, data: Path, tok_dir: Path, repeats: int) -> dict:
    from transformers import AutoTokenizer

    from skipv1.uptrain.token_store import train_store

    tok = AutoTokenizer.from_pretrained(tok_dir)
    # untimed: datasets converts the JSONL to Arrow once and caches that; every timed build
    # below then reads the same Arrow file and tokenizes from scratch
    train_store(recipe_for(tok_dir, data, work / "warm-up", 1), tok, 0, 1, log=lambda _: None)
    runs = {1: [], 2: []}
    for k in range(repeats):
        for procs in (1, 2):
            cache = work / f"cache-{procs}-{k}"
            recipe = recipe_for(tok_dir, data, cache, procs)
            start = time.perf_counter()
            _, meta = train_store(recipe, tok, 0, procs, log=lambda _: None)
            runs[procs].append(meta["tokens"] / (time.perf_counter() - start))
            print(f"  build with {procs} process(es): {runs[procs][-1]:,.0f} tokens/s", flush=True)
    return {
        "tokens": meta["tokens"],
        "runs": runs,
        "median": {p: statistics.median(v) for p, v in runs.items()},
    }


MEMORY_PROBE = """
import json, resource, sys
from pathlib import Path
from transformers import AutoTokenizer
from skipv1.uptrain.data import load_blocks, make_train_batches
from skipv1.uptrain.recipe import load_recipe
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
recipe = load_recipe(Path(sys.argv[1]), [])
tok = AutoTokenizer.from_pretrained(recipe.model.path)
before = rss()
if sys.argv[2] == "store":
    batches = make_train_batches(recipe, tok, log=lambda _: None)
    next(batches.batches(0))
else:
    blocks = load_blocks(recipe.data.train, tok, recipe.data.seq_len, "train")
print(json.dumps({"rss_growth": rss() - before}))
"""


def memory(work: Path, data: Path, tok_dir: Path) -> dict:
    recipe_path = work / "cache-1-0" / "recipe-1.yaml"  # its store exists (stage 1)
    out = {}
    for kind in ("store", "in-memory"):
        run = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, str(recipe_path), kind],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
        )
        out[kind] = json.loads(run.stdout.strip().splitlines()[-1])["rss_growth"]
        print(f"  {kind}: RSS +{out[kind] / 2**20:.1f} MiB", flush=True)
    return out


def start_cost(work: Path, data: Path, tok_dir: Path, repeats: int) -> dict:
    from transformers import AutoTokenizer

    from skipv1.uptrain.data import make_train_batches

    tok = AutoTokenizer.from_pretrained(tok_dir)
    recipe = recipe_for(tok_dir, data, work / "cache-1-0", 1)
    runs = {0: [], 2000: []}
    for _ in range(repeats):
        for step in (0, 2000):
            start = time.perf_counter()
            batches = make_train_batches(recipe, tok, log=lambda _: None)
            next(batches.batches(step))
            runs[step].append(time.perf_counter() - start)
    med = {s: statistics.median(v) for s, v in runs.items()}
    print(f"  start {med[0] * 1e3:.1f} ms, resume at 2,000 {med[2000] * 1e3:.1f} ms", flush=True)
    return {"runs": runs, "median": med, "ratio": med[2000] / med[0]}


RUN_SHAPE = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=4, max_position_embeddings=SEQ_LEN
)
RUN_STEPS, RUN_WARMUP = 12, 2


def data_time(work: Path, data: Path, tok_dir: Path) -> dict:
    """`skipv1 uptrain` on 2 ranks from the store of stage 1: data_s against the step time."""
    import shutil

    import yaml
    from transformers import AutoTokenizer

    sys.path.insert(0, str(REPO / "tests"))
    from factories import make_checkpoint

    from skipv1.uptrain.metrics import read_metrics

    vocab = len(AutoTokenizer.from_pretrained(tok_dir))
    model = make_checkpoint(work / "model", vocab_size=vocab, **RUN_SHAPE)
    for file in tok_dir.iterdir():  # the same tokenizer: the store of stage 1 is reused
        if file.is_file():
            shutil.copy(file, model / file.name)
    run_dir = work / "run"
    recipe = {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {
            "train": str(data),
            "eval": None,
            "seq_len": SEQ_LEN,
            "cache_dir": str(work / "cache-1-0"),
        },
        "budget": {"tokens": RUN_STEPS * BATCH_TOKENS},
        "batch": {"global_batch_tokens": BATCH_TOKENS, "micro_batch_size": 1},
        "deepspeed": {"zero_stage": 2},
        "checkpoint": {"every": 0, "resume": "never"},
        "log": {"progress": False, "tensorboard": False},
        "export": False,
    }
    recipe_file = work / "data-time.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "skipv1", "uptrain", str(recipe_file), "--run-dir", str(run_dir)]
    cmd += ["--nproc", "2", "--quiet"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    stores = sorted((work / "cache-1-0").iterdir())
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the uptrain run failed:\n{run.stderr[-3000:]}")
    if sorted((work / "cache-1-0").iterdir()) != stores:
        sys.exit("the run built another store instead of reusing stage 1's")
    steps = [m for m in read_metrics(run_dir) if "loss" in m][RUN_WARMUP:]
    data_s = [m["data_s"] for m in steps[1:]]
    step_s = [b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)]
    fraction = sum(data_s) / sum(step_s)
    print(f"  data {statistics.median(data_s) * 1e6:.0f} us/step, {fraction:.4%} of the step")
    return {
        "data_s": data_s,
        "step_s": step_s,
        "fraction": fraction,
        "median_data_s": statistics.median(data_s),
        "median_step_s": statistics.median(step_s),
        "max_data_s": max(data_s),
        "vocab": vocab,
        "shape": RUN_SHAPE,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus-dir", default=str(Path("..") / "shared" / "data" / "corpus"))
    p.add_argument("--chars", type=int, default=4_000_000, help="characters of each file")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = p.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = write_corpus(Path(args.corpus_dir), work, args.chars)
        tok_dir = tokenizer_dir(work)
        result = {
            "throughput": throughput(work, data, tok_dir, args.repeats),
            "memory": memory(work, data, tok_dir),
            "start": start_cost(work, data, tok_dir, args.repeats),
            "data_time": data_time(work, data, tok_dir),
        }
    result["load"] = [load_before, os.getloadavg()[0]]
    write_report(result, args)


def write_report(r: dict, args) -> None:
    t, m, s, d = r["throughput"], r["memory"], r["start"], r["data_time"]
    each = lambda v: ", ".join(f"{x:,.0f}" for x in v)  # noqa: E731
    text = f"""# Token store: tokenization, data memory, start vs resume

Generated by `bench/data_store.py` (command: `.venv/bin/python bench/data_store.py --chars
{args.chars} --repeats {args.repeats}`). {os.cpu_count()} CPU cores, load average
{r["load"][0]:.2f} before and {r["load"][1]:.2f} after (1-minute).

Data: the first {args.chars:,} characters of `kjv.txt` and of `gcide.txt` as 50-line JSONL
documents, {t["tokens"]:,} SmolLM2 tokens; `data.seq_len` {SEQ_LEN}.

## Building the store (tokenize + pack + write)

From the Arrow file datasets made of the JSONL in an untimed warm-up build.

| tokenizer processes | tokens/s (median) | runs |
|---|---|---|
| 1 | {t["median"][1]:,.0f} | {each(t["runs"][1])} |
| 2 | {t["median"][2]:,.0f} | {each(t["runs"][2])} |

2 processes / 1: **{t["median"][2] / t["median"][1]:.2f}x**.

## Data memory of one rank

Resident-set growth of a fresh process that opens the train data and reads one global batch:
store (memory-mapped, uint16) **{m["store"] / 2**20:.1f} MiB**; the in-memory loader it replaced
(every block as int64) **{m["in-memory"] / 2**20:.1f} MiB**.

## Start vs resume

What `skipv1 uptrain` does with the data before its first step (open the store, read the first
global batch), store already built: step 0 **{s["median"][0] * 1e3:.1f} ms**, resuming at step
2,000 **{s["median"][2000] * 1e3:.1f} ms** (ratio {s["ratio"]:.2f}; goal <= 1.1). Before the
store, every start tokenized the whole train set on every rank, and a streamed run resuming at
step k re-read and re-tokenized k global batches first.

## Data time per step

A real run from that store: `skipv1 uptrain RECIPE --nproc 2 --quiet` (torchrun, gloo,
OMP_NUM_THREADS=1, ZeRO-2, fp32), a random Llama with SmolLM2's vocabulary ({d["vocab"]:,}),
hidden {d["shape"]["hidden_size"]}, {d["shape"]["num_hidden_layers"]} layers, intermediate
{d["shape"]["intermediate_size"]}; {BATCH_TOKENS:,} tokens per step (micro-batch 1, 4 blocks
per rank), {RUN_STEPS} steps of which the first {RUN_WARMUP} are left out. `data_s`
(metrics.jsonl: rank 0 reading its rows of the global batch from the memory-mapped store)
against the wall-clock time between consecutive step records:

- data time per step: median **{d["median_data_s"] * 1e6:,.0f} us** (max {
        d["max_data_s"] * 1e6:,.0f} us); step time: median {d["median_step_s"]:.2f} s
- data time / step time over the measured steps: **{d["fraction"]:.4%}** (goal < 1%)

The data time does not depend on the model: a larger model's (or a GPU's) step only changes
the denominator; at this {d["median_data_s"] * 1e6:,.0f} us a step would have to take under
{d["median_data_s"] * 100 * 1e3:.1f} ms for the data to reach 1%.
"""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_store.md").write_text(text)
    (out / "data_store.json").write_text(json.dumps({"args": vars(args), **r}, indent=1))
    print(f"wrote {out / 'data_store.md'}")


if __name__ == "__main__":
    main()
