"""Export: a consolidated checkpoint in the docs/design.md format (save_pretrained, so config with
`auto_map` and the modeling code next to the weights), the tokenizer, `skipv1_uptrain.json` and a
model card. Written through skipv1.atomic_dir: DST is the old export, the new one or absent, never half
written, and no temporary directory is left behind.

Weights come from the live engine at the end of a run (ZeRO-3 parameters gathered onto rank 0
one tensor at a time), or, for `skipv1 export RUN_DIR DST`, from a checkpoint on disk (ZeRO shards
merged one weight at a time by DeepSpeed's `zero_to_fp32` in lazy mode), without any process
group; either way they stream into safetensors shards written as they fill.
"""

import json
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

from .. import faults
from ..atomic_dir import (
    DISK_SLACK,
    atomic_workspace,
    check_room,
    remove_stale_workspaces,
    resolve_path,
)
from ..convert.writer import write_shards_as_they_fill
from ..errors import SkipV1Error
from .checkpointing import COMPLETE, check_plain_pickles, complete_checkpoints, read_state
from .gradual import BLEND_MARKER

UPTRAIN_FILE = "skipv1_uptrain.json"
SHARD_BYTES = 5 * 2**30  # transformers' default max_shard_size


def iter_live_weights(engine, rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) pairs of the engine's weights, yielded on rank 0. Under ZeRO-3 every
    rank must drain it: each parameter's partitions are gathered onto rank 0 alone, one tensor
    at a time, so rank 0 holds one gathered tensor beyond its own partition and the other ranks
    nothing beyond theirs (DeepSpeed's GatheredParameters all-gathers onto every rank)."""
    module = engine.module
    if engine.zero_optimization_stage() != 3:
        if rank == 0:
            for name, tensor in module.state_dict().items():
                yield name, tensor.detach().cpu()
        return
    for group in layer_groups(module):
        for name, param in group:
            full = gather_on_first_rank(param)
            if full is not None:
                yield name, full
            del full
        trim_heap()
    if rank == 0:  # persistent buffers are not partitioned
        params = {name for name, _ in module.named_parameters()}
        for name, tensor in module.state_dict(keep_vars=True).items():
            if name not in params:
                yield name, tensor.detach().cpu()


def gather_on_first_rank(param) -> torch.Tensor | None:
    """A ZeRO-3 parameter's full value as a CPU tensor on the first rank of its partition group,
    None on the others. Rank r holds elements [r*n, (r+1)*n) of the flattened parameter (`ds_tensor`,
    the last one padded): a gather of those, cut to `ds_numel`, is the parameter."""
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    group = param.ds_process_group
    on_gpu = dist.get_backend(group) != "gloo"  # NCCL gathers device tensors only
    device = get_accelerator().current_device_name() if on_gpu else "cpu"
    part = param.ds_tensor.detach().to(device)
    first = dist.get_rank(group) == 0
    parts = [torch.empty_like(part) for _ in range(dist.get_world_size(group))] if first else None
    dist.gather(part, parts, dst=dist.get_global_rank(group, 0), group=group)
    if not first:
        return None
    return torch.cat(parts)[: param.ds_numel].view(param.ds_shape).cpu()


def trim_heap() -> None:
    """Hands the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).
    glibc serves tensors under its mmap threshold (raised up to 32 MiB as tensors are freed)
    from its heap and keeps them resident once freed: without this, the freed buffers of one
    gathered layer after another pile up towards the whole model (bench/export_memory.py)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def layer_groups(module) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Parameters grouped by decoder layer (`...layers.N.`), the others one by one."""
    groups: dict[str, list] = {}
    for name, param in module.named_parameters():
        layer = re.match(r"(.*\.layers\.\d+)\.", name)
        groups.setdefault(layer.group(1) if layer else name, []).append((name, param))
    return list(groups.values())


def checkpoint_state_dict(ckpt: Path, trusted: bool = False):
    """Full fp32 (ZeRO >= 1, merged one weight at a time) or training-dtype (no ZeRO) weights
    from a checkpoint directory, as a dict or a stream of (name, tensor) pairs."""
    check_plain_pickles(ckpt, trusted)
    state = read_state(ckpt)
    if state.get("zero_stage", 0) == 0:
        files = sorted(ckpt.glob("mp_rank_*_model_states.pt"))
        if not files:
            raise SkipV1Error(f"{ckpt} holds no model states file: the checkpoint is damaged")
        return torch.load(files[0], map_location="cpu", weights_only=not trusted)["module"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # lazy: each weight is merged from the ZeRO shards when the export reaches it
    lazy = get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name, lazy_mode=True)
    return ((name, tensor.contiguous()) for name, tensor in lazy.items())


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of a run (its recipe may point the checkpoints elsewhere)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SkipV1Error(f"{run_dir} does not exist: give the --run-dir of an uptrain run")
    ckpt_dir = run_dir / "checkpoints"
    recipe_file = run_dir / "recipe.yaml"
    if recipe_file.is_file():
        import yaml

        custom = (yaml.safe_load(recipe_file.read_text()) or {}).get("checkpoint", {}).get("dir")
        ckpt_dir = Path(custom) if custom else ckpt_dir
    found = complete_checkpoints(ckpt_dir)
    if not found:
        raise SkipV1Error(
            f"{run_dir} has no complete checkpoint under {ckpt_dir}: "
            "run (or resume) `skipv1 uptrain` first"
        )
    return found[-1]


def write_export(
    weights: "Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]",
    model_dir: Path,
    dst: Path,
    info: dict,
    recipe_yaml: str,
    overwrite: bool = False,
    max_shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Writes the HF checkpoint for `weights` (a state dict or a stream of pairs, written into
    safetensors shards as they fill) with the config/tokenizer of `model_dir`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.dynamic_module_utils import custom_object_save

    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise SkipV1Error(f"{dst} already exists: pass --overwrite or choose another destination")
    trust = bool(info.get("trust_remote_code"))
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust)
    dtype = getattr(torch, info["dtype"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust)
    try:  # before any weight is consumed: a failure later would leave ranks in a gather
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"cannot load the tokenizer of {model_dir} ({str(err).splitlines()[0][:200]}): "
            "restore its tokenizer files and rerun; nothing was written"
        ) from None
    expected = set(model.state_dict())
    tied = {"lm_head.weight"} if config.get_text_config().tie_word_embeddings else set()
    weight_bytes = sum(
        t.numel() * t.element_size() for n, t in model.state_dict().items() if n not in tied
    )
    check_room(dst, weight_bytes + DISK_SLACK)
    pairs = weights.items() if isinstance(weights, Mapping) else weights
    seen: set[str] = set()

    def checked() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in pairs:
            if BLEND_MARKER in name or name in tied:
                continue
            if name not in expected:
                raise SkipV1Error(
                    f"the checkpoint's weights do not match the model in {model_dir} "
                    f"(unexpected {name})"
                )
            seen.add(name)
            faults.point("export-weight")
            yield name, tensor.to(dtype)

    remove_stale_workspaces(dst)
    with atomic_workspace(dst, overwrite) as work:
        out = work / "out"
        out.mkdir(exist_ok=True)
        write_shards_as_they_fill(out, checked(), max_shard_bytes)
        if missing := sorted(expected - seen - tied):
            raise SkipV1Error(
                f"the checkpoint's weights do not match the model in {model_dir} (missing "
                f"{missing[:3]})"
            )
        model.config.architectures = [type(model).__name__]
        model.config.dtype = dtype
        model.config.save_pretrained(out)
        if model.can_generate():
            model.generation_config.save_pretrained(out)
        if getattr(model, "_auto_class", None) is not None:  # the modeling code auto_map names
            custom_object_save(model, out, config=model.config)
        tokenizer.save_pretrained(out)
        provenance = Path(model_dir) / "skipv1_conversion.json"
        if provenance.is_file():
            shutil.copy(provenance, out / provenance.name)
        (out / UPTRAIN_FILE).write_text(json.dumps(info, indent=2) + "\n")
        (out / "README.md").write_text(model_card(info, recipe_yaml))
    return dst


def check_export_destination(dst: Path, run_dir: Path, ckpt: Path, overwrite: bool) -> None:
    """Before any merging: DST must not be, hold or lie inside the run or its checkpoints."""
    dst_r = resolve_path(dst, "DST")
    for protected in {resolve_path(run_dir, "RUN_DIR"), resolve_path(ckpt.parent, "checkpoints")}:
        if dst_r == protected or protected in dst_r.parents or dst_r in protected.parents:
            raise SkipV1Error(
                f"DST {dst} is, holds or lies inside the run's directory {protected}: exporting "
                "there would overwrite the run; choose a DST outside it"
            )
    if dst.exists() and not dst.is_dir():
        raise SkipV1Error(f"DST {dst} is a file: give a directory path")
    if dst.exists() and not overwrite:
        raise SkipV1Error(f"{dst} already exists: pass --overwrite or choose another destination")
    check_room(dst, 0)  # writable at all; the bytes are checked once the model is known


def model_card(info: dict, recipe_yaml: str) -> str:
    return f"""---
library_name: transformers
tags: [skipv1, skipv1former, uptrained]
---
# {Path(info["model"]).name} uptrained with skipv1

SkipV1Former checkpoint (layers >= 1 take {info.get("skip_v_heads", "?")} value heads from layer 0;
arXiv 2510.16807), continued-pretrained with `skipv1 uptrain`.

- starting model: `{info["model"]}`
- tokens trained: {info["tokens"]:,} ({info["steps"]} optimizer steps of {info["tokens_per_step"]:,} tokens)
- approximate training compute: {info["train_flops"]:.3g} FLOPs (6 x parameters x tokens)
- fraction of the source's pretraining compute: {_fraction(info.get("pretraining_fraction"))}
- final eval perplexity: {info.get("final_eval_ppl") or "not measured"}
- weights: {info["dtype"]}, exported from checkpoint step {info["steps"]}

Load with `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` (or `import skipv1`
first). Details in `{UPTRAIN_FILE}`.

## Recipe
```yaml
{recipe_yaml.rstrip()}
```
"""


def _fraction(value) -> str:
    return "unknown (budget.pretraining_tokens not set)" if value is None else f"{value * 100:.3g}%"


def export_run(
    run_dir: Path,
    dst: Path,
    checkpoint: Path | None = None,
    overwrite: bool = False,
    trusted: bool = False,
) -> Path:
    """`skipv1 export`: the latest (or given) complete checkpoint of a run as an HF checkpoint."""
    ckpt = Path(checkpoint) if checkpoint else latest_checkpoint(run_dir)
    if not ckpt.is_dir():
        raise SkipV1Error(
            f"--checkpoint {ckpt} is not a directory: give one of the run's checkpoints "
            f"({run_dir}/checkpoints/step_XXXXXXXX) or omit it for the latest complete one"
        )
    if not (ckpt / COMPLETE).is_file():
        raise SkipV1Error(
            f"{ckpt} is not a complete checkpoint (no `{COMPLETE}` marker): a run died while "
            "writing it; give another --checkpoint or omit it for the latest complete one"
        )
    check_export_destination(Path(dst), Path(run_dir), ckpt, overwrite)
    state = read_state(ckpt)
    if not (Path(state["model_dir"]) / "config.json").is_file():
        raise SkipV1Error(
            f"the run's model directory {state['model_dir']} is gone (export takes the config "
            "and tokenizer from it): restore it at that path and rerun"
        )
    info = dict(state["export_info"], steps=state["step"], tokens=state["tokens"])
    info["final_eval_ppl"] = state.get("last_eval_ppl")
    recipe_file = Path(run_dir) / "recipe.yaml"
    recipe_yaml = recipe_file.read_text() if recipe_file.is_file() else ""
    weights = checkpoint_state_dict(ckpt, trusted)
    return write_export(weights, Path(state["model_dir"]), dst, info, recipe_yaml, overwrite)
