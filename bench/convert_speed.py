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


def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of one subprocess. ru_maxrss of RUSAGE_CHILDREN is the
    largest of all children so far, so this is exact for the largest child (convert, here) and
    an upper bound for the others."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


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
    src = write_random_llama(work / "src")
    src_bytes = dir_bytes(src)
    largest_shard = max(p.stat().st_size for p in src.glob("*.safetensors"))
    skipv1 = str(Path(sys.executable).parent / "skipv1")
    convert_cmd = [skipv1, "convert", str(src), str(work / "dst"), "--quiet"]
    convert_cmd += ["--shard-size", shard_size]
    # Warm the page cache for both the same way: read the source once before timing.
    subprocess.run(["cat", *map(str, src.glob("*.safetensors"))], stdout=subprocess.DEVNULL)
    cp_wall, _ = timed(["cp", "-r", str(src), str(work / "copy")])
    shutil.rmtree(work / "copy")
    convert_wall, convert_rss = timed(convert_cmd)
    dst_bytes = dir_bytes(work / "dst")
    from transformers.utils.hub import convert_file_size_to_int

    bound = largest_shard + convert_file_size_to_int(shard_size) + 2**30
    ratio = convert_wall / cp_wall
    gb = 1e9
    lines = [
        "# `skipv1 convert` speed and memory",
        "",
        "Produced by `.venv/bin/python bench/convert_speed.py` (random Llama, bf16, "
        f"{SHAPE['layers']} layers, hidden {SHAPE['hidden']}, 32 MHA heads, default s = 16, "
        "init mean), on "
        f"{platform.node() or 'this machine'} ({os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}).",
        "",
        f"Command timed: `skipv1 convert SRC DST --quiet --shard-size {shard_size}`, "
        "against `cp -r SRC COPY`; both read a page-cache-warm source.",
        "",
        "| | value |",
        "|---|---|",
        f"| source | {src_bytes / gb:.2f} GB in {len(list(src.glob('*.safetensors')))} shards "
        f"(largest {largest_shard / gb:.2f} GB) |",
        f"| output | {dst_bytes / gb:.2f} GB |",
        f"| `cp -r` wall time | {cp_wall:.2f} s ({src_bytes / gb / cp_wall:.2f} GB/s) |",
        f"| `skipv1 convert` wall time | {convert_wall:.2f} s "
        f"({src_bytes / gb / convert_wall:.2f} GB/s read) |",
        f"| ratio convert / cp | {ratio:.2f} (goal <= 1.5) |",
        f"| convert peak RSS | {convert_rss / gb:.2f} GB |",
        f"| bound: largest source shard + output shard + 1 GB | {bound / gb:.2f} GB |",
        f"| within bound | {'yes' if convert_rss <= bound else 'NO'} |",
        "",
        "The convert wall time includes starting Python and importing torch and transformers "
        "(a few seconds on a small machine).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
