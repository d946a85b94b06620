"""The distributed side: process group, the DeepSpeed config built from the recipe, the
optimizer and `deepspeed.initialize`. DeepSpeed does ZeRO partitioning, mixed precision,
gradient accumulation and clipping; the loop in trainer.py stays ours and visible.

Optimizer choice: torch.optim.AdamW as DeepSpeed's client optimizer (no JIT-built op; `fused`
on CUDA), DeepSpeedCPUAdam when the optimizer state is offloaded to CPU (DeepSpeed requires it).
"""

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..errors import SkipV1Error
from .recipe import Recipe, gradient_accumulation


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_env() -> DistEnv:
    """RANK / WORLD_SIZE / LOCAL_RANK as set by torchrun, the DeepSpeed launcher or SLURM
    wrappers; a plain process is rank 0 of 1."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return DistEnv(rank, world, local, device)


STALE_BUILD_LOCK_S = 600  # the op builds in about a minute; an older lock was left by a kill


def shm_build_lock() -> Path:
    """Where torch's extension builder locks the build of DeepSpeed's CPU communication op."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("deepspeed_shm_comm", verbose=False)) / "lock"


def build_cpu_op() -> None:
    """DeepSpeed JIT-builds its CPU communication op on first use, under torch's lock: a plain
    file, which a run killed mid-build leaves behind, and on which every later run then waits
    forever without a word. So the op is built here first, under a lock the kernel releases when
    its holder dies (flock), beside a marker of our build in progress: a torch lock found with
    the marker is a killed skipv1 build's and is removed; one without it is another program's
    build, waited on until it is STALE_BUILD_LOCK_S old. DeepSpeed then loads the built op."""
    import fcntl

    from deepspeed.comm.torch import build_shm_op  # what DeepSpeed's init calls (cached once built)

    lock = shm_build_lock()
    lock.parent.mkdir(parents=True, exist_ok=True)
    ours = lock.with_name("skipv1-building")
    with open(lock.with_name("skipv1.flock"), "a") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another rank or run is building it: about a minute, once
            fcntl.flock(guard, fcntl.LOCK_EX)  # its death releases the lock
        if ours.exists():
            lock.unlink(missing_ok=True)
        _wait_for_foreign_build(lock)
        ours.touch()
        try:
            with _scripts_on_path():
                build_shm_op()
        except RuntimeError as err:  # no ninja, no compiler, a failed compile
            raise SkipV1Error(
                f"DeepSpeed could not build its CPU op ({_build_failure(err)}): CPU ranks need "
                "a C++ compiler (c++ on PATH) and ninja (`pip install ninja`)"
            ) from err
        finally:  # torch released its lock too (a kill skips both)
            ours.unlink(missing_ok=True)


def _build_failure(err: RuntimeError) -> str:
    """The compiler's own complaint out of torch's error, which repeats every command line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    commands = ("[", "FAILED", "Error building", "ninja: build stopped")
    said = (
        line
        for line in lines
        if ("error" in line.lower() or "not found" in line) and not line.startswith(commands)
    )
    return next(said, lines[0] if lines else type(err).__name__)[:300]


@contextlib.contextmanager
def _scripts_on_path():
    """The build runs `ninja` from PATH: the one pip installed with DeepSpeed sits beside this
    interpreter, which is not on PATH when a venv's `skipv1` runs without activating it."""
    scripts, path = str(Path(sys.executable).parent), os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([path, scripts]) if path else scripts
    try:
        yield
    finally:
        if path is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = path


def _wait_for_foreign_build(lock: Path) -> None:
    said = False
    while lock.exists():
        age = time.time() - lock.stat().st_mtime
        if age > STALE_BUILD_LOCK_S:
            raise SkipV1Error(
                f"DeepSpeed's build lock {lock} is {age / 60:.0f} minutes old: a killed run left "
                "it (a build takes about a minute); remove that file if no other uptrain is "
                "starting, then rerun"
            )
        if not said:
            from ..console import console

            console.print(
                f"waiting for another program building DeepSpeed's CPU op (lock {lock}); if none "
                "is, remove that file",
                highlight=False,
            )
            said = True
        time.sleep(1)


# The rendezvous variables init_distributed set for a run in this process (no launcher's):
# unset when the run ends, so that processes started afterwards (which inherit the environment)
# pick their own port instead of this process's, still bound.
_SET_VARIABLES: list[str] = []


def init_distributed(env: DistEnv, timeout_s: int = 600) -> None:
    """NCCL on GPUs, gloo on CPU; a single process still gets a (1-rank) group for DeepSpeed.
    A collective that waits `timeout_s` (a peer died) raises instead of hanging."""
    import deepspeed
    import torch.distributed as dist

    rendezvous = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29500 + os.getpid() % 1000),
        "RANK": str(env.rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_RANK": str(env.local_rank),
    }
    for key, value in rendezvous.items():  # a launcher's own settings win
        if key not in os.environ:
            os.environ[key] = value
            _SET_VARIABLES.append(key)
    if env.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        if "OMP_NUM_THREADS" not in os.environ:  # an explicit setting is the user's to make
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        build_cpu_op()
    timeout = timedelta(seconds=timeout_s)
    # DeepSpeed builds its data-parallel group with dist.new_group(ranks) and no timeout, which
    # takes torch's module default (30 min on gloo) at that call: the training collectives run
    # on it, so the default must be ours too, or a hung peer is waited on for half an hour.
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout
    if distributed_c10d.default_pg_nccl_timeout is not None:
        distributed_c10d.default_pg_nccl_timeout = timeout
    if not dist.is_initialized():
        backend = "nccl" if env.device.type == "cuda" else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)


def release_distributed() -> None:
    """Ends the process group through DeepSpeed, which then forgets the groups it built on it (a
    second run in the same process, a notebook or a test, would otherwise reuse destroyed ones),
    and unsets the variables init_distributed set."""
    import torch.distributed as dist
    from deepspeed.comm import comm as ds_comm

    if dist.is_initialized():
        if ds_comm.cdb is not None:
            ds_comm.destroy_process_group()
        else:
            dist.destroy_process_group()
    while _SET_VARIABLES:
        os.environ.pop(_SET_VARIABLES.pop(), None)


def deepspeed_config(recipe: Recipe, world_size: int, load_universal: bool = False) -> dict:
    """The DeepSpeed config: a user JSON as the base (if given), with the batch geometry,
    precision and clipping always taken from the recipe so the two cannot disagree."""
    ds = recipe.deepspeed
    config: dict = {}
    if ds.config:
        try:
            config = json.loads(Path(ds.config).read_text())
        except json.JSONDecodeError as err:
            raise SkipV1Error(f"`deepspeed.config` {ds.config} is not valid JSON: {err}") from None
    for section in ("optimizer", "scheduler"):  # the recipe's `optim` section owns these
        config.pop(section, None)
    gas = gradient_accumulation(recipe, world_size)
    config.update(
        train_batch_size=recipe.blocks_per_step,
        train_micro_batch_size_per_gpu=recipe.batch.micro_batch_size,
        gradient_accumulation_steps=gas,
        gradient_clipping=recipe.optim.grad_clip,
        steps_per_print=10**12,
        wall_clock_breakdown=False,
        zero_allow_untested_optimizer=True,
    )
    if not ds.config or "zero_optimization" not in config:
        zero: dict = {"stage": ds.zero_stage}
        if ds.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        if ds.zero_stage == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = False
        config["zero_optimization"] = zero
    dtype = recipe.model.dtype
    config["bf16"] = {"enabled": dtype == "bfloat16"}
    config["fp16"] = {"enabled": dtype == "float16", "loss_scale": 0, "initial_scale_power": 16}
    if load_universal:
        config.setdefault("checkpoint", {})["load_universal"] = True
    return config


def zero_stage(config: dict) -> int:
    return int(config.get("zero_optimization", {}).get("stage", 0))


def offloads_optimizer(config: dict) -> bool:
    offload = config.get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device", "none") == "cpu"


def make_optimizer(model: torch.nn.Module, recipe: Recipe, device: torch.device, offload: bool):
    """AdamW with weight decay on matrices only (not on biases, norms or embeddings). With
    `optim.attention_first_fraction`, the attention parameters are groups of their own (first),
    so that the schedule can hold every other group at lr 0 for a while."""
    o = recipe.optim
    groups = []
    for params in parameter_sets(model, split_attention=o.attention_first_fraction > 0):
        decay = [p for name, p in params if p.ndim >= 2 and "embed" not in name]
        no_decay = [p for name, p in params if not (p.ndim >= 2 and "embed" not in name)]
        groups += [
            {"params": decay, "weight_decay": o.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
    kwargs = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return _skippable(DeepSpeedCPUAdam)(groups, adamw_mode=True, **kwargs)
    return _skippable(torch.optim.AdamW)(groups, fused=device.type == "cuda", **kwargs)


def _skippable(optimizer_class: type) -> type:
    """The optimizer with `skip_next`: while it is set, step() changes nothing (a step whose
    loss is not finite, see optim.skip_nonfinite). It is the base optimizer under every ZeRO
    stage, so DeepSpeed still does its bookkeeping (zeroing gradients, copying the unchanged
    fp32 partitions back) and its step counters stay in line."""

    class Skippable(optimizer_class):
        skip_next = False

        def step(self, *args, **kwargs):
            if self.skip_next:
                return None
            return super().step(*args, **kwargs)

    Skippable.__name__ = Skippable.__qualname__ = optimizer_class.__name__
    return Skippable


def peer_failure(err: BaseException) -> bool:
    """A collective that failed because another rank died or stopped answering: torch's
    distributed errors (NCCL), or gloo's transport errors (reset connection, timeout), which
    reach Python as plain RuntimeErrors naming gloo's source."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    return isinstance(err, RuntimeError) and "/gloo/" in str(err)


def parameter_sets(model: torch.nn.Module, split_attention: bool) -> list[list]:
    """The trainable (name, parameter) pairs: one set, or [attention modules', the rest]. An
    attention module is one whose class name ends in "Attention" (transformers' convention for
    every family: LlamaAttention, Qwen3Attention, GPT2Attention, ...)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not split_attention:
        return [trainable]
    attention = {
        id(p)
        for m in model.modules()
        if type(m).__name__.endswith("Attention")
        for p in m.parameters()
    }
    if not attention:
        raise SkipV1Error(
            "`optim.attention_first_fraction` is set but the model has no attention modules "
            "(no module class ends in 'Attention'): set it to 0"
        )
    return [
        [(n, p) for n, p in trainable if id(p) in attention],
        [(n, p) for n, p in trainable if id(p) not in attention],
    ]


def initialize(model, optimizer, scheduler_fn, config: dict):
    import deepspeed

    engine, _, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler_fn, config=config
    )
    return engine, scheduler
