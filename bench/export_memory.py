"""Peak resident memory of each rank during the ZeRO-3 export (2 CPU ranks), and of the offline
`skipv1 export RUN_DIR DST`, against the model size.

    .venv/bin/python bench/export_memory.py     # ~8 minutes on 2 CPU cores, ~12 GB of RAM

1. A child process saves a random SkipV1 Llama (fp32, ~165M parameters, ~660 MB), so that no
   process measured below inherits its memory high-water mark.
2. `torchrun --nproc-per-node 2` of this file in worker mode: each rank runs what `skipv1
   uptrain` runs (skipv1.uptrain.trainer.UptrainRecipe: setup, train, the last step's
   checkpoint; ZeRO-3, gloo, 2 steps of 32 tokens), then measures three phases, one after the
   other, on every rank:
     a. the live export, `UptrainRecipe.export(max_shard_bytes=--shard-mb)`: shards smaller
        than the model, so that rank 0's output shard is smaller than the model;
     b. the live export as `skipv1 uptrain` runs it (5 GiB shards: here the whole model is
        one shard, which rank 0 holds before writing it);
     c. the contrast: one gather of every parameter at once (`GatheredParameters(all)`), what
        the export did before commit a399587;
     d. a control: DeepSpeed's layer-by-layer `GatheredParameters` (an all-gather onto every
        rank, what the export did before it gathered onto rank 0 alone), nothing kept or
        written, and without a `trim_heap` after each layer.
   The run is made twice: with glibc malloc's defaults, and with `MALLOC_MMAP_THRESHOLD_=1 MiB`
   (every large tensor its own mapping, returned at free), to separate what the export holds
   from what the allocator keeps.
   Each phase: gc + malloc_trim, VmRSS before, then the kernel's peak is reset to the current
   RSS (`5` written to /proc/self/clear_refs) and read back as VmHWM after the phase. The
   peak is the kernel's own high-water mark: nothing is sampled, nothing is missed.
3. `skipv1 export RUN_DIR DST` of the first run's checkpoint in a child: peak RSS from wait4
   (ru_maxrss), the peaks of its anonymous and file-backed RSS (sampled every 10 ms from
   /proc/PID/status), and a child that only imports the same libraries, for what the
   interpreter and libraries take on their own.
Writes docs/results/export_memory.md and .json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrun_ranks import REPO, rank_env, run_ranks

SHAPE = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=10,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=64,
)
SKIP = 8  # value heads from layer 0
SEQ, BATCH_TOKENS, STEPS = 16, 32, 2
MIB = 2**20
# Working memory of an export beyond the weights (rank 0: the meta-device model, the tokenizer,
# Python objects), allowed on top of the bound; the table shows the growth itself.
ALLOWANCE = 32 * MIB


def build(root: Path) -> None:
    """The random SkipV1 model and its tokenizer (run in a child process)."""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from factories import build_tokenizer, make_skipv1_checkpoint, tiny_config

    tok = build_tokenizer(root / "tok")
    torch.set_num_threads(1)
    make_skipv1_checkpoint(root / "model", SKIP, tiny_config(**SHAPE), tokenizer_dir=tok)


def recipe(model: Path, run_dir: Path) -> dict:
    return {
        "model": {"path": str(model), "dtype": "float32"},
        "data": {
            "train": "embedded:train",
            "eval": None,
            "seq_len": SEQ,
            "cache_dir": str(run_dir.parent / "token-store"),
        },
        "budget": {"tokens": STEPS * BATCH_TOKENS},
        "batch": {"global_batch_tokens": BATCH_TOKENS, "micro_batch_size": 1},
        "deepspeed": {"zero_stage": 3},
        "checkpoint": {"resume": "never"},  # the last step is checkpointed (for phase 3)
        "log": {"progress": False, "tensorboard": False},
        "run_dir": str(run_dir),
    }


# ------------------------------------------------------------------------ memory of a process
def status_kib(key: str, pid: str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def settle() -> int:
    """Frees what can be freed (Python garbage, glibc's cached free pages); returns VmRSS."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return status_kib("VmRSS") * 1024


def measure_phase(fn) -> dict:
    """VmRSS before `fn`, and the kernel's peak RSS while it ran (VmHWM after a reset)."""
    before = settle()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
    started = time.perf_counter()
    fn()
    peak = status_kib("VmHWM") * 1024
    return {
        "before": before,
        "peak": peak,
        "growth": peak - before,
        "seconds": time.perf_counter() - started,
    }


def worker(recipe_file: Path, out: Path, shard_bytes: int) -> None:
    import deepspeed
    import torch.distributed as dist

    from skipv1.uptrain.export import layer_groups
    from skipv1.uptrain.recipe import load_recipe
    from skipv1.uptrain.trainer import UptrainRecipe

    trainer = UptrainRecipe(load_recipe(recipe_file))
    trainer.setup()
    trainer.train()  # ends with the last step's checkpoint
    rank, module = trainer.env.rank, trainer.engine.module
    result = {"rank": rank, "training_peak": status_kib("VmHWM") * 1024}

    def whole_model_gather():
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            pass

    def layer_gathers():
        for group in layer_groups(module):
            with deepspeed.zero.GatheredParameters([p for _, p in group], modifier_rank=None):
                pass

    phases = {
        "export_small_shards": lambda: trainer.export(max_shard_bytes=shard_bytes),
        "export_default": trainer.export,
        "whole_model_gather": whole_model_gather,
        "layer_gathers": layer_gathers,
    }
    for name, fn in phases.items():
        dist.barrier()
        result[name] = measure_phase(fn)
        if rank == 0 and name.startswith("export"):
            shards = sorted((trainer.run_dir / "export").glob("model*.safetensors"))
            result[name]["largest_shard"] = max(p.stat().st_size for p in shards)
            result[name]["shards"] = len(shards)
    params = list(module.named_parameters())
    result["model_bytes"] = sum(p.ds_numel * p.element_size() for _, p in params)
    result["largest_layer_bytes"] = max(
        sum(p.ds_numel * p.element_size() for _, p in group) for group in layer_groups(module)
    )
    result["largest_tensor_bytes"] = max(p.ds_numel * p.element_size() for _, p in params)
    result["parameters"] = sum(p.ds_numel for _, p in params)
    trainer.close()
    out.with_name(f"{out.stem}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# ------------------------------------------------------------------------ the benchmark
def peak_of_child(cmd: list[str], env: dict) -> dict:
    """Runs `cmd`; its peak RSS from wait4 (the bench process is small: nothing inherited)."""
    import threading

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampled = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample():  # the split of the peak into heap and mapped-file pages
        while not done.wait(0.01):
            try:
                for key in sampled:
                    sampled[key] = max(sampled[key], status_kib(key, str(proc.pid)) * 1024)
            except (OSError, KeyError):  # exited (or a zombie) between two samples
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = proc.stderr.read()
    done.set()
    sampler.join()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed:\n{err.decode()[-3000:]}")
    return {
        "peak": usage.ru_maxrss * 1024,
        "seconds": time.perf_counter() - started,
        "sampled_anon_peak": sampled["RssAnon"],
        "sampled_file_peak": sampled["RssFile"],
    }


ALLOCATORS = {"default": {}, "mmap-1MiB": {"MALLOC_MMAP_THRESHOLD_": str(MIB)}}
IMPORTS_ONLY = (
    "import torch, transformers, deepspeed; from deepspeed.utils import zero_to_fp32; "
    "import skipv1.cli, skipv1.uptrain.export"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--build", type=Path)
    p.add_argument("--recipe", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--shard-mb", type=int, default=128, help="shard size of phase a")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    args = p.parse_args()
    if args.build:
        return build(args.build)
    if args.worker:
        return worker(args.recipe, args.out, args.shard_mb * MIB)
    load_before = os.getloadavg()[0]
    env = rank_env()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, __file__, "--build", str(root)], check=True, env=env)
        runs = {}
        for allocator, extra in ALLOCATORS.items():
            run_dir = root / f"run-{allocator}"
            out = root / f"ranks-{allocator}.json"
            worker_args = ["--worker", "--out", str(out), "--shard-mb", str(args.shard_mb)]
            started = time.perf_counter()
            run_ranks(
                __file__,
                recipe(root / "model", run_dir),
                root / f"recipe-{allocator}.yaml",
                worker_args,
                {**env, **extra},
            )
            runs[allocator] = [
                json.loads(out.with_name(f"{out.stem}-{r}.json").read_text()) for r in (0, 1)
            ]
            print(f"2-rank run ({allocator}): {time.perf_counter() - started:.0f} s", flush=True)
        skipv1 = [sys.executable, "-m", "skipv1", "export", str(root / "run-default")]
        offline = peak_of_child([*skipv1, str(root / "offline")], env)
        imports = peak_of_child([sys.executable, "-c", IMPORTS_ONLY], env)
    result = {
        "args": {"shard_mb": args.shard_mb},
        "shape": SHAPE,
        "skip_v_heads": SKIP,
        "runs": runs,
        "offline": offline,
        "imports_only": imports,
        "load": [load_before, os.getloadavg()[0]],
    }
    write_report(result, args.results)


# ------------------------------------------------------------------------ the report
PHASES = {
    "export_small_shards": "a. live export, small shards",
    "export_default": "b. live export, 5 GiB shards",
    "whole_model_gather": "c. whole-model gather",
    "layer_gathers": "d. layer gathers alone, no heap trim",
}


def bound_of(runs: dict, phase: str, rank: int) -> int | None:
    """The design's bound on a rank's growth. Export (partitions gathered onto rank 0 one tensor
    at a time): on rank 0 the largest tensor twice (its gathered parts and their concatenation)
    plus the output shard it fills (the largest shard file it wrote); on the other ranks
    nothing beyond their own partition. The layer-gathers control: the largest layer."""
    r0 = runs["default"][0]
    if phase == "whole_model_gather":
        return None
    if phase == "layer_gathers":
        return r0["largest_layer_bytes"]
    if rank != 0:
        return 0
    return 2 * r0["largest_tensor_bytes"] + r0[phase]["largest_shard"]


def table(runs: dict) -> tuple[str, dict]:
    rows, holds = [], {}
    for phase in PHASES:
        for rank in (0, 1):
            default, mmap = runs["default"][rank][phase], runs["mmap-1MiB"][rank][phase]
            bound = bound_of(runs, phase, rank)
            if bound is None:
                bound_text, ok_text = "-", "-"
            else:
                oks = [m["growth"] <= bound + ALLOWANCE for m in (default, mmap)]
                if phase.startswith("export"):
                    holds[(phase, rank)] = oks
                bound_text = f"{bound / MIB:,.0f}"
                ok_text = " / ".join("yes" if ok else "no" for ok in oks)
            rows.append(
                f"| {PHASES[phase]} | {rank} | {default['before'] / MIB:,.0f} | "
                f"**{default['growth'] / MIB:,.0f}** | **{mmap['growth'] / MIB:,.0f}** | "
                f"{bound_text} | {ok_text} |"
            )
    return "\n".join(rows), holds


def write_report(result: dict, out: Path) -> None:
    runs = result["runs"]
    r0, r1 = runs["default"]
    model, layer = r0["model_bytes"], r0["largest_layer_bytes"]
    small, default = r0["export_small_shards"], r0["export_default"]
    rows, holds = table(runs)
    off, imp = result["offline"], result["imports_only"]
    gather = max(r["whole_model_gather"]["growth"] for r in runs["default"])
    s = result["shape"]
    text = f"""# Export memory: ZeRO-3 live export and offline `skipv1 export`

Generated by `bench/export_memory.py` (command: `.venv/bin/python bench/export_memory.py
--shard-mb {result["args"]["shard_mb"]}`). {os.cpu_count()} CPU cores,
load average {result["load"][0]:.2f} before and {result["load"][1]:.2f}
after (1-minute; memory peaks do not depend on the load).

Model: random SkipV1 Llama, hidden {s["hidden_size"]}, {s["num_hidden_layers"]} layers,
{s["num_attention_heads"]} heads (MHA, s = {result["skip_v_heads"]}), intermediate
{s["intermediate_size"]}, vocab 320: {r0["parameters"]:,} parameters, fp32: **{model / MIB:,.0f}
MiB** of weights; the largest decoder layer {layer / MIB:,.1f} MiB. The code of `skipv1
uptrain` (`UptrainRecipe`) on 2 CPU ranks (torchrun, gloo), ZeRO-3, {STEPS} steps of
{BATCH_TOKENS} tokens, the last step checkpointed; then the phases below, in this order.

## Live export (end of `skipv1 uptrain`), per rank

Peak = the kernel's VmHWM, reset to the current RSS (`echo 5 > /proc/self/clear_refs`) just
before the phase, after `gc.collect()` + `malloc_trim(0)`; growth = peak - RSS before. The RSS
before holds the rank's own ZeRO-3 shard (parameters, gradients, Adam state) and the libraries.
Bound of an export (each parameter's partitions gathered onto rank 0 alone, one tensor at a
time): on rank 0, twice the largest tensor ({r0["largest_tensor_bytes"] / MIB:,.1f} MiB: its
gathered parts and their concatenation) plus the output shard it fills before writing it (the
largest shard file: {small["largest_shard"] / MIB:,.0f} MiB in a,
{small["shards"]} shards; {default["largest_shard"] / MIB:,.0f} MiB in b, where the whole model
fits in one 5 GiB shard); on rank 1, nothing beyond its own partition. Bound of the
layer-gathers control d: the largest layer. Holds: growth <= bound + {
        ALLOWANCE // MIB
    } MiB (the export's own
working memory: meta-device model, tokenizer, Python objects). Two runs: glibc malloc as it is,
and with `MALLOC_MMAP_THRESHOLD_={MIB}` (large tensors are their own mappings, returned to the
system when freed; by default glibc raises that threshold up to 32 MiB as tensors are freed and
serves the smaller ones from its heap, where freed memory stays resident).

| phase | rank | RSS before (MiB) | growth (MiB), default malloc | growth (MiB), mmap threshold 1 MiB | bound (MiB) | holds (default / 1 MiB) |
|---|---|---|---|---|---|---|
{rows}

- Bound holds in every export row (a, b) with the default allocator:
  **{"yes" if all(ok[0] for ok in holds.values()) else "no"}**; with the 1 MiB mmap threshold:
  **{"yes" if all(ok[1] for ok in holds.values()) else "no"}**.
- Rank 1 (sends its partitions only) in the export with small shards: {
        r1["export_small_shards"]["growth"] / MIB:,.0f} MiB ({
        r1["export_small_shards"]["growth"] / model:.0%} of the model); the
  whole-model gather the export did before: {gather / MIB:,.0f} MiB ({gather / model:.0%}).
- Training peak (VmHWM over setup, training and checkpoint, before the phases), default malloc:
  rank 0 {r0["training_peak"] / MIB:,.0f} MiB, rank 1 {r1["training_peak"] / MIB:,.0f} MiB.

## Offline `skipv1 export RUN_DIR DST`

From the default run's ZeRO-3 checkpoint (DeepSpeed `zero_to_fp32`, lazy mode: the fp32
partitions are memory-mapped and each weight is merged when the writer reaches it), default
malloc, 5 GiB shards (the whole model is one shard here). Peak RSS of the child from wait4
(ru_maxrss, mapped checkpoint pages it touched included): **{off["peak"] / MIB:,.0f} MiB** in
{off["seconds"]:.0f} s; sampled every 10 ms: anonymous {off["sampled_anon_peak"] / MIB:,.0f}
MiB, file-backed {off["sampled_file_peak"] / MIB:,.0f} MiB at their peaks. A child that only
imports the same libraries: {imp["peak"] / MIB:,.0f} MiB; the export's peak is
{(off["peak"] - imp["peak"]) / MIB:,.0f} MiB above it ({(off["peak"] - imp["peak"]) / model:.2f}x
the model).
"""
    out.mkdir(parents=True, exist_ok=True)
    (out / "export_memory.md").write_text(text)
    (out / "export_memory.json").write_text(json.dumps(result, indent=1))
    print(text)


if __name__ == "__main__":
    main()
