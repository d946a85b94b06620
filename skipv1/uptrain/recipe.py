"""The uptraining recipe: a YAML file read into dataclasses and validated at load time.

Every section is a dataclass whose fields are the allowed keys; the type hints are the schema
(`Literal[...]` lists the allowed values). Unknown keys, wrong types and impossible combinations
raise SkipV1Error naming the key. Command-line overrides are dotted `key=value` pairs whose value
is parsed as YAML (`optim.lr=3e-4`, `deepspeed.zero_stage=3`, `data.eval=null`).
"""

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..convert.inits import get_init
from ..convert.options import CONVERT_DEFAULTS as CONVERT
from ..convert.options import ConvertOptions
from ..errors import SkipV1Error

DataSource = Any  # a data spec string or mapping, checked by skipv1.textdata


@dataclass
class ModelSection:
    path: str | None = None  # an already converted SkipV1 checkpoint (or any supported source)
    source: str | None = None  # an MHA/GQA checkpoint, converted on the fly into the run dir
    # convert options for model.source (skipv1/convert/options.py says what each does)
    skip_heads: int | None = CONVERT.skip_heads
    init: str = CONVERT.init
    calib_data: DataSource = CONVERT.calib_data
    calib_tokens: int = CONVERT.calib_tokens
    calib_seq_len: int = CONVERT.calib_seq_len
    calib_distill_steps: int = CONVERT.calib_distill_steps
    # > 0: gradual conversion over this fraction of the budget (skipv1/uptrain/gradual.py);
    # needs `init: keep` and the source's weights (model.source or distill.teacher)
    gradual_fraction: float = 0.0
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"  # training precision
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False

    def convert_options(self) -> ConvertOptions:
        return ConvertOptions(
            skip_heads=self.skip_heads,
            init=self.init,
            trust_remote_code=self.trust_remote_code,
            calib_data=self.calib_data,
            calib_tokens=self.calib_tokens,
            calib_seq_len=self.calib_seq_len,
            calib_distill_steps=self.calib_distill_steps,
        )


@dataclass
class DataSection:
    train: DataSource = None
    eval: DataSource = None
    seq_len: int = 1024
    seed: int = 0
    streaming: bool = False  # stream the train data (corpora larger than memory)
    shuffle_buffer: int = 10_000  # streaming only: datasets' shuffle buffer (0: file order)
    store: str | None = None  # a token store built by `skipv1 prepare-data` (checked)
    cache_dir: str | None = None  # where token stores live (default: $SKIPV1_CACHE_DIR or
    # ~/.cache/skipv1/token-store)
    num_proc: int | None = None  # tokenizer processes (default: CPU cores, at most 8)
    store_timeout: float = 7200.0  # seconds other ranks wait for local rank 0's store build

    def resolved_num_proc(self) -> int:
        return self.num_proc or max(1, min(8, os.cpu_count() or 1))


@dataclass
class BudgetSection:
    tokens: int | None = None  # absolute number of training tokens
    fraction: float | None = None  # ... or this fraction of pretraining_tokens
    pretraining_tokens: int | None = None  # the source model's pretraining tokens


@dataclass
class BatchSection:
    global_batch_tokens: int = 1_048_576
    micro_batch_size: int = 1  # sequences per rank per forward/backward


@dataclass
class OptimSection:
    lr: float = 1.5e-4  # peak learning rate (paper: best of {0.8, 1, 1.5, 2}e-4)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices only; biases, norms and embeddings get 0
    grad_clip: float = 1.0  # 0 turns clipping off
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1  # cosine decays to min_lr_ratio * lr


@dataclass
class DeepSpeedSection:
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False  # ZeRO >= 1: optimizer state in CPU memory (DeepSpeedCPUAdam)
    offload_params: bool = False  # ZeRO-3: parameters in CPU memory
    config: str | None = None  # a DeepSpeed JSON used as the base config
    timeout_s: int = 600  # a collective waiting longer (a rank or node died) ends the run


@dataclass
class EvalSection:
    every: int = 0  # steps between evaluations; 0: only at the start and the end
    blocks: int = 64  # eval blocks of seq_len tokens (rounded down to a multiple of the ranks)


@dataclass
class CheckpointSection:
    every: int = 0  # steps between checkpoints; 0: only at the end
    keep_last: int = 2
    resume: str = "auto"  # auto | never | PATH to a checkpoint directory
    dir: str | None = None  # default: RUN_DIR/checkpoints
    # resume unpickles DeepSpeed state files only when they pass torch's weights-only
    # allow-list; true skips the check (a crafted file could then run code)
    trust_pickles: bool = False


@dataclass
class LogSection:
    progress: bool = True  # rich progress bar on rank 0
    every: int = 1  # steps between progress-bar refreshes and TensorBoard points
    tensorboard: bool = True  # when tensorboard is installed
    wandb_project: str | None = None  # W&B when set (needs `pip install wandb`)
    wandb_run_name: str | None = None


@dataclass
class DistillSection:
    # frozen teacher checkpoint; `source`: the run's source model; null: no KL term
    teacher: str | None = None
    alpha: float = 0.5  # loss = (1 - alpha) * CE + alpha * T^2 * KL(teacher || student)
    temperature: float = 1.0  # T, applied to both logits


@dataclass
class Recipe:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    budget: BudgetSection = field(default_factory=BudgetSection)
    batch: BatchSection = field(default_factory=BatchSection)
    optim: OptimSection = field(default_factory=OptimSection)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    distill: DistillSection = field(default_factory=DistillSection)
    run_dir: str = "runs/uptrain"
    export: bool = True  # write RUN_DIR/export at the end

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @property
    def blocks_per_step(self) -> int:
        return self.batch.global_batch_tokens // self.data.seq_len

    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir or Path(self.run_dir) / "checkpoints")


def load_recipe(path: "str | Path | None", overrides: list[str] = ()) -> Recipe:
    """Reads, overrides and validates a recipe; any problem raises SkipV1Error."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise SkipV1Error(f"recipe {path} does not exist: give a YAML file (see recipes/)")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise SkipV1Error(f"recipe {path} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise SkipV1Error(f"recipe {path} must be a YAML mapping of sections")
    for item in overrides:
        apply_override(raw, item)
    recipe = _build(Recipe, raw, "")
    check_recipe(recipe)
    return recipe


def apply_override(raw: dict, item: str) -> None:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise SkipV1Error(f"override {item!r} is not `dotted.key=value` (e.g. optim.lr=3e-4)")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    *parents, leaf = key.strip().split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SkipV1Error(f"override {item!r}: {part!r} is not a section")
    node[leaf] = parsed


def _build(cls, raw: Any, prefix: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SkipV1Error(f"`{prefix.rstrip('.') or 'recipe'}` must be a mapping of keys")
    hints = typing.get_type_hints(cls)
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise SkipV1Error(
            f"unknown recipe key `{prefix}{unknown[0]}`: allowed keys"
            f"{' in `' + prefix.rstrip('.') + '`' if prefix else ''} are {', '.join(allowed)}"
        )
    values = {}
    for name in allowed:
        if name not in raw:
            continue
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, raw[name], f"{prefix}{name}.")
        else:
            values[name] = _coerce(raw[name], hint, f"{prefix}{name}")
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Checks `value` against a type hint; ints are accepted where floats are expected."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise SkipV1Error(
                f"recipe key `{key}` is {value!r}: allowed values are "
                f"{', '.join(str(c) for c in choices)}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise SkipV1Error(f"recipe key `{key}` must be a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        try:  # YAML 1.1 reads `1.5e-4` as a string; accept it as a number
            return float(value)
        except ValueError:
            pass
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)  # `2e9` in YAML
    if hint is int and isinstance(value, str):
        try:
            return int(float(value.replace("_", "")))
        except ValueError:
            pass
    if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
        raise SkipV1Error(
            f"recipe key `{key}` must be {hint.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def check_recipe(r: Recipe) -> None:
    """Combinations that cannot work, each named by its keys."""
    if (r.model.path is None) == (r.model.source is None):
        raise SkipV1Error(
            "set exactly one of `model.path` (a converted checkpoint) and `model.source` "
            "(a checkpoint to convert on the fly)"
        )
    if r.data.train is None:
        raise SkipV1Error("`data.train` is missing: give files, a glob, `embedded` or a Hub name")
    r.model.convert_options().check(name=lambda field: f"`model.{field}`")
    _check_gradual(r)
    if r.data.seq_len < 2:
        raise SkipV1Error(f"`data.seq_len` is {r.data.seq_len}: it must be at least 2")
    _positive(r.batch.micro_batch_size, "batch.micro_batch_size")
    _positive(r.batch.global_batch_tokens, "batch.global_batch_tokens")
    if r.batch.global_batch_tokens % r.data.seq_len:
        raise SkipV1Error(
            f"`batch.global_batch_tokens` ({r.batch.global_batch_tokens}) must be a multiple of "
            f"`data.seq_len` ({r.data.seq_len})"
        )
    if (r.budget.tokens is None) == (r.budget.fraction is None):
        raise SkipV1Error("set exactly one of `budget.tokens` and `budget.fraction`")
    if r.budget.fraction is not None:
        if r.budget.pretraining_tokens is None:
            raise SkipV1Error("`budget.fraction` needs `budget.pretraining_tokens`")
        if not 0 < r.budget.fraction <= 1:
            raise SkipV1Error(f"`budget.fraction` is {r.budget.fraction}: it must be in (0, 1]")
    if total_tokens(r) < r.batch.global_batch_tokens:
        raise SkipV1Error(
            f"the budget ({total_tokens(r):,} tokens) is less than one step "
            f"(`batch.global_batch_tokens` = {r.batch.global_batch_tokens:,})"
        )
    o = r.optim
    if o.lr <= 0:
        raise SkipV1Error(f"`optim.lr` is {o.lr}: it must be positive")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise SkipV1Error(f"`optim.betas` is {o.betas}: give two numbers in [0, 1)")
    if not 0 <= o.warmup_fraction < 1:
        raise SkipV1Error(f"`optim.warmup_fraction` is {o.warmup_fraction}: use [0, 1)")
    if not 0 <= o.min_lr_ratio <= 1:
        raise SkipV1Error(f"`optim.min_lr_ratio` is {o.min_lr_ratio}: use [0, 1]")
    if o.weight_decay < 0 or o.grad_clip < 0:
        raise SkipV1Error("`optim.weight_decay` and `optim.grad_clip` must be >= 0")
    ds = r.deepspeed
    if ds.offload_params and ds.zero_stage != 3:
        raise SkipV1Error(
            f"`deepspeed.offload_params` needs `deepspeed.zero_stage: 3` (it is {ds.zero_stage})"
        )
    if ds.offload_optimizer and ds.zero_stage == 0:
        raise SkipV1Error("`deepspeed.offload_optimizer` needs `deepspeed.zero_stage` 1, 2 or 3")
    if ds.config is not None and not Path(ds.config).is_file():
        raise SkipV1Error(f"`deepspeed.config` {ds.config} does not exist: give a DeepSpeed JSON")
    for key, value in (
        ("eval.every", r.eval.every),
        ("checkpoint.every", r.checkpoint.every),
        ("eval.blocks", r.eval.blocks),
    ):
        if value < 0:
            raise SkipV1Error(f"`{key}` is {value}: it must be >= 0")
    _positive(r.checkpoint.keep_last, "checkpoint.keep_last")
    _positive(r.log.every, "log.every")
    _check_distill(r.distill)
    resume = r.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise SkipV1Error(
            f"`checkpoint.resume` is {resume!r}: allowed values are auto, never or an existing "
            "checkpoint directory"
        )


def _check_gradual(r: Recipe) -> None:
    m = r.model
    if not 0 <= m.gradual_fraction <= 1:
        raise SkipV1Error(
            f"`model.gradual_fraction` is {m.gradual_fraction}: use 0 (off) or a fraction in (0, 1]"
        )
    if not m.gradual_fraction:
        return
    if m.source is not None and not get_init(m.init).keeps_source_heads:
        raise SkipV1Error(
            f"`model.gradual_fraction` starts from the source's function only with `model.init: "
            f"keep` (own heads = source heads, o_proj unchanged); it is {m.init!r}"
        )
    local_source = m.source is not None and (Path(m.source) / "config.json").is_file()
    if not local_source and r.distill.teacher is None:
        raise SkipV1Error(
            "`model.gradual_fraction` reads the source's value rows: set `model.source` to a local "
            "checkpoint directory or `distill.teacher` to the source"
        )


def _check_distill(d: DistillSection) -> None:
    if not 0 <= d.alpha <= 1:
        raise SkipV1Error(f"`distill.alpha` is {d.alpha}: it must be in [0, 1]")
    if d.temperature <= 0:
        raise SkipV1Error(f"`distill.temperature` is {d.temperature}: it must be positive")
    if d.teacher not in (None, "source") and not (Path(d.teacher) / "config.json").is_file():
        raise SkipV1Error(
            f"`distill.teacher` {d.teacher} is not a checkpoint directory with a config.json: "
            "give the source model's directory, `source`, or null to train without distillation"
        )


def _positive(value: int, key: str) -> None:
    if value <= 0:
        raise SkipV1Error(f"`{key}` is {value}: it must be positive")


def total_tokens(r: Recipe) -> int:
    if r.budget.tokens is not None:
        return r.budget.tokens
    return int(r.budget.fraction * r.budget.pretraining_tokens)


def total_steps(r: Recipe) -> int:
    return total_tokens(r) // r.batch.global_batch_tokens


def gradient_accumulation(r: Recipe, world_size: int) -> int:
    """Micro-steps per optimizer step on each rank; the global batch must split exactly."""
    per_step = r.blocks_per_step
    per_pass = r.batch.micro_batch_size * world_size
    if per_step % per_pass:
        raise SkipV1Error(
            f"the global batch ({per_step} sequences = batch.global_batch_tokens / data.seq_len) "
            f"is not divisible by batch.micro_batch_size ({r.batch.micro_batch_size}) x "
            f"{world_size} ranks: change batch.global_batch_tokens or batch.micro_batch_size"
        )
    return per_step // per_pass
