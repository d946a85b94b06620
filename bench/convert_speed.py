"""Benchmark: `skipv1 convert` against `cp -r` of the same random Llama checkpoint.

Writes a random Llama checkpoint of at least 2 GB in 3+ safetensors shards (directly with
safetensors, no model is instantiated), then in one run times `cp -r` of it and `skipv1 convert`
of it (a subprocess each; peak RSS of the convert child from getrusage), and writes
docs/results/convert.md. Run from the repository root:

    .venv/bin/python bench/convert_speed.py [--workdir DIR] [--keep]
"""

import argparse
import json
import os
import platform
import resource
import shutil
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


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, seconds of the `sync` after it, stdout) of one subprocess: the sync
    makes both commands pay for getting their bytes to disk, not only into the page cache."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    wall = time.perf_counter() - start
    subprocess.run(["sync"], check=True)
    return wall, time.perf_counter() - start - wall, out


def peak_rss_of_children() -> int:
    """ru_maxrss of RUSAGE_CHILDREN: the largest child so far (convert, here), in bytes."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--shard-size", default="1GB")
    parser.add_argument("--keep", action="store_true", help="keep the 2 GB files")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="skipv1-bench-", dir=args.workdir))
    try:
        report = run(work, args.shard_size)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    out = ROOT / "docs" / "results" / "convert.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(report)


def run(work: Path, shard_size: str) -> str:
    from transformers.utils.hub import convert_file_size_to_int

    src = write_random_llama(work / "src")
    src_bytes = dir_bytes(src)
    shards = sorted(src.glob("*.safetensors"))
    largest_shard = max(p.stat().st_size for p in shards)
    skipv1 = str(Path(sys.executable).parent / "skipv1")
    convert_cmd = [skipv1, "convert", str(src), str(work / "dst"), "--json"]
    convert_cmd += ["--shard-size", shard_size]
    # Warm the page cache the same way for both: read the source once before timing.
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)
    cp_wall, cp_sync, _ = timed(["cp", "-r", str(src), str(work / "copy")])
    shutil.rmtree(work / "copy")
    conv_wall, conv_sync, out = timed(convert_cmd)
    conv_rss = peak_rss_of_children()
    inside = json.loads(out)["seconds"]
    dst_bytes = dir_bytes(work / "dst")
    bound = largest_shard + convert_file_size_to_int(shard_size) + 2**30
    cp_total, conv_total = cp_wall + cp_sync, conv_wall + conv_sync
    gb = 1e9
    rows = [
        (
            "source",
            f"{src_bytes / gb:.2f} GB in {len(shards)} shards (largest {largest_shard / gb:.2f} GB)",
        ),
        ("output", f"{dst_bytes / gb:.2f} GB"),
        ("`cp -r` + `sync`", f"{cp_wall:.2f} s + {cp_sync:.2f} s = {cp_total:.2f} s"),
        (
            "`skipv1 convert` + `sync`",
            f"{conv_wall:.2f} s + {conv_sync:.2f} s = {conv_total:.2f} s",
        ),
        ("of which the conversion itself (`seconds` in --json)", f"{inside:.2f} s"),
        ("ratio convert / cp, end to end", f"{conv_total / cp_total:.2f} (goal <= 1.5)"),
        ("ratio without interpreter start and imports", f"{(inside + conv_sync) / cp_total:.2f}"),
        ("convert peak RSS (getrusage of the child)", f"{conv_rss / gb:.2f} GB"),
        ("bound: largest source shard + output shard + 1 GB", f"{bound / gb:.2f} GB"),
        ("peak RSS within bound", "yes" if conv_rss <= bound else "NO"),
    ]
    lines = [
        "# `skipv1 convert` speed and memory",
        "",
        "Command: `.venv/bin/python bench/convert_speed.py` (from the repository root). It writes a "
        f"random Llama checkpoint (bf16, {SHAPE['layers']} layers, hidden {SHAPE['hidden']}, "
        f"{SHAPE['heads']} MHA heads, vocab {SHAPE['vocab']}), then times `cp -r SRC COPY` and "
        f"`skipv1 convert SRC DST --json --shard-size {shard_size}` (default s = 16, init mean) "
        "in the same run, each followed by `sync`, both from a page-cache-warm source.",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), shared with other jobs; "
        f"Python {platform.python_version()}, torch {torch.__version__}.",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
