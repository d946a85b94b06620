"""Benchmark: `skipv1 convert` against `cp -r` of the same random Llama checkpoint.

Writes a random Llama checkpoint of at least 2 GB in 3+ safetensors shards (directly with
safetensors, no model is instantiated), then times `cp -r` of it and `skipv1 convert` of it,
interleaved and repeated (the machine may be shared: the spread is reported), each a subprocess
followed by `sync`; peak RSS and CPU seconds of each child from wait4 (the source is written by
another process, so that the children do not inherit its memory high-water mark). With
`--baseline DIR` a second convert runs in the same rounds with DIR first on PYTHONPATH (e.g.
`git archive` of an older commit), for a before/after on the same machine at the same time. Writes
docs/results/convert.md. Run from the repository root:

    .venv/bin/python bench/convert_speed.py [--workdir DIR] [--repeat N] [--baseline DIR] [--keep]
"""

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
# ~2.2 GB in bfloat16 (a slimmed Llama-2-7B shape: 8 layers, 32 MHA heads, 32k vocab).
SHAPE = dict(hidden=4096, intermediate=11008, layers=8, heads=32, kv_heads=32, vocab=32000)


def llama_tensor_shapes(hidden, intermediate, layers, heads, kv_heads, vocab) -> dict:
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        shapes[p + "mlp.gate_proj.weight"] = (intermediate, hidden)
        shapes[p + "mlp.up_proj.weight"] = (intermediate, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, intermediate)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def write_random_llama(
    path: Path, shards: int = 3, dtype: torch.dtype = torch.bfloat16, **shape
) -> Path:
    """A Llama checkpoint of random values written shard by shard (memory: one shard)."""
    shape = {**SHAPE, **shape}
    shapes = llama_tensor_shapes(**shape)
    names = list(shapes)
    per = -(-len(names) // shards)
    path.mkdir(parents=True)
    weight_map, total = {}, 0
    generator = torch.Generator().manual_seed(0)
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {}
        for name in names[i * per : (i + 1) * per]:
            part[name] = (torch.randn(shapes[name], generator=generator) * 0.02).to(dtype)
            weight_map[name] = file
            total += part[name].numel() * part[name].element_size()
        save_file(part, path / file, metadata={"format": "pt"})
        del part
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["intermediate"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "vocab_size": shape["vocab"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": str(dtype).removeprefix("torch."),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


# The init measured: `mean` rewrites only the v_proj of later layers, so the rest of the
# conversion is I/O; the default (reconstruct) calibrates on text and needs a tokenizer.
INIT = "mean"


def write_source(path: Path) -> Path:
    """write_random_llama in a fresh process: Linux starts a child's peak RSS at its parent's
    RSS at fork and keeps it across exec, so this process must stay small for the peak RSS of
    the commands it times to be theirs."""
    child = multiprocessing.get_context("spawn").Process(target=write_random_llama, args=(path,))
    child.start()
    child.join()
    if child.exitcode:
        raise RuntimeError(f"writing the source checkpoint failed (exit code {child.exitcode})")
    return path


def settle(shards: list[Path], env: dict | None = None) -> None:
    """The same page-cache state before every timed command: cached pages dropped where this
    process may (root: the kernel's copy speed depends on how much memory it must reclaim first,
    and `cp` ran 1.1 or 3 CPU seconds in rounds of one run without it), then the source and
    both programs' files read back in."""
    subprocess.run(["sync"], check=True)
    global DROPPED
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        DROPPED = False
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)
    # and both programs' own files (the interpreter's imports, cp's binary)
    subprocess.run([SKIPV1, "convert", "--help"], stdout=subprocess.DEVNULL, check=True, env=env)
    subprocess.run(["cp", "--version"], stdout=subprocess.DEVNULL, check=True)


SKIPV1 = str(Path(sys.executable).parent / "skipv1")
DROPPED = True  # whether settle could drop the page cache every time


def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Wall seconds of one subprocess, of the `sync` after it (both commands pay for getting
    their bytes to disk, not only into the page cache), its peak RSS and its stdout."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    subprocess.run(["sync"], check=True)
    sync = time.perf_counter() - start - wall
    return {
        "wall": wall,
        "sync": sync,
        "total": wall + sync,
        "rss": usage.ru_maxrss * 1024,
        "cpu": usage.ru_utime + usage.ru_stime,  # the child's own CPU seconds: less load-bound
        "out": out,
    }


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--shard-size", default="1GB")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--baseline", type=Path, default=None, help="an older skipv1 tree")
    parser.add_argument("--keep", action="store_true", help="keep the 2 GB files")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="skipv1-bench-", dir=args.workdir))
    load_before = os.getloadavg()[0]
    try:
        report = run(work, args.shard_size, args.repeat, args.baseline)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load = f"load average {load_before:.2f} before and {os.getloadavg()[0]:.2f} after (1-minute)"
    report = report.replace("LOAD", load)
    out = ROOT / "docs" / "results" / "convert.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(report)


def spread(values: list[float], unit: str = " s") -> str:
    return f"{statistics.median(values):.2f}{unit} (min {min(values):.2f}, max {max(values):.2f})"


def rounds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) + " s"


def run(work: Path, shard_size: str, repeat: int, baseline: Path | None) -> str:
    from transformers.utils.hub import convert_file_size_to_int

    src = write_source(work / "src")
    src_bytes = dir_bytes(src)
    shards = sorted(src.glob("*.safetensors"))
    largest_shard = max(p.stat().st_size for p in shards)
    convert_cmd = [SKIPV1, "convert", str(src), str(work / "dst"), "--json", "--init", INIT]
    convert_cmd += ["--shard-size", shard_size]
    runs: dict[str, list[dict]] = {"cp": [], "convert": [], "baseline": []}
    envs = {"convert": None}
    if baseline is not None:
        path = [str(baseline.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
        envs["baseline"] = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    for _ in range(repeat):
        settle(shards)
        runs["cp"].append(timed(["cp", "-r", str(src), str(work / "copy")]))
        shutil.rmtree(work / "copy")
        for kind, env in envs.items():
            settle(shards, env)
            runs[kind].append(timed(convert_cmd, env))
            dst_bytes = dir_bytes(work / "dst")
            shutil.rmtree(work / "dst")
    return report(runs, shard_size, src_bytes, len(shards), largest_shard, dst_bytes,
                  largest_shard + convert_file_size_to_int(shard_size) + 2**30)  # fmt: skip


def report(runs, shard_size, src_bytes, n_shards, largest_shard, dst_bytes, bound) -> str:
    gb = 1e9
    cp = [r["total"] for r in runs["cp"]]
    cp_cpu = [r["cpu"] for r in runs["cp"]]
    rows = [
        ("source", f"{src_bytes / gb:.2f} GB in {n_shards} shards (largest {largest_shard / gb:.2f} GB)"),
        ("output", f"{dst_bytes / gb:.2f} GB"),
        ("rounds (cp, then each convert, interleaved)", f"{len(cp)}"),
        ("`cp -r` + `sync`", spread(cp)),
        ("`cp -r` + `sync`, each round", rounds(cp)),
        ("`cp -r`, CPU seconds (user + sys, wait4)", spread(cp_cpu)),
    ]  # fmt: skip
    labels = {"convert": "this tree", "baseline": "baseline"}
    for kind in ("convert", "baseline"):
        if not runs[kind]:
            continue
        total = [r["total"] for r in runs[kind]]
        inside = [json.loads(r["out"])["seconds"] for r in runs[kind]]
        ratio = [t / c for t, c in zip(total, cp, strict=True)]
        cpu = [r["cpu"] for r in runs[kind]]
        cpu_ratio = [c / p for c, p in zip(cpu, cp_cpu, strict=True)]
        rss = max(r["rss"] for r in runs[kind])
        rows += [
            (f"`skipv1 convert` + `sync`, {labels[kind]}", spread(total)),
            (f"of which the conversion itself (`seconds` in --json), {labels[kind]}", spread(inside)),
            (f"`skipv1 convert` + `sync`, each round, {labels[kind]}", rounds(total)),
            (f"ratio convert / cp, end to end, {labels[kind]}", spread(ratio, "") + " (goal <= 1.5)"),
            (f"ratio convert / cp's fastest round, {labels[kind]}", f"{statistics.median(total) / min(cp):.2f}"),
            (f"convert CPU seconds (user + sys, wait4), {labels[kind]}", spread(cpu)),
            (f"ratio of CPU seconds convert / cp, {labels[kind]}", spread(cpu_ratio, "")),
            (f"interpreter start and imports, {labels[kind]}", spread([t - i - r["sync"] for t, i, r in zip(total, inside, runs[kind], strict=True)])),
            (f"convert peak RSS (wait4 of the child, largest round), {labels[kind]}", f"{rss / gb:.2f} GB"),
            (f"peak RSS within bound, {labels[kind]}", "yes" if rss <= bound else "NO"),
        ]  # fmt: skip
    rows.append(("bound: largest source shard + output shard + 1 GB", f"{bound / gb:.2f} GB"))
    lines = [
        "# `skipv1 convert` speed and memory",
        "",
        "Command: `.venv/bin/python bench/convert_speed.py` (from the repository root). It writes a "
        f"random Llama checkpoint (bf16, {SHAPE['layers']} layers, hidden {SHAPE['hidden']}, "
        f"{SHAPE['heads']} MHA heads, vocab {SHAPE['vocab']}), then times `cp -r SRC COPY` and "
        f"`skipv1 convert SRC DST --json --init {INIT} --shard-size {shard_size}` (default "
        "s = 16), interleaved, each followed by `sync`, each from a page-cache-warm source "
        + (
            "(the page cache dropped, then the source read back in, before every command). "
            if DROPPED
            else "(the source read back in before every command; the page cache "
            "could not be dropped: not root). "
        )
        + "Times are medians over the rounds, with the fastest and slowest round; CPU seconds are "
        "the child's own (start-up included, `sync` not), which another load on the machine "
        "changes less than wall time.",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), LOAD; "
        f"Python {platform.python_version()}, torch {torch.__version__}.",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
