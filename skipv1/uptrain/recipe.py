"""The uptraining recipe: a YAML file read into pydantic models and validated at load time.

Every section is a model whose fields are the allowed keys; the annotations are the schema
(`Literal[...]` lists the allowed values, `Field(gt=..)` the ranges, model validators the
combinations within the recipe). Unknown keys, wrong types and impossible combinations raise
SkipV1Error naming the key (recipe_errors.py turns pydantic's report into that line). Command-line
overrides are dotted `key=value` pairs whose value is parsed as YAML (`optim.lr=3e-4`,
`deepspeed.zero_stage=3`, `data.eval=null`).
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..convert.options import CONVERT_DEFAULTS as CONVERT
from ..convert.options import ConvertOptions
from ..errors import SkipV1Error
from .recipe_errors import one_line_error
from .teacher import SOURCE, check_teacher

DataSource = Any  # a data spec string or mapping, checked by skipv1.textdata


def _yaml_float(value: Any) -> Any:
    """Ints are floats here, and YAML 1.1 reads `1.5e-4` as a string: accept it as a number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _yaml_int(value: Any) -> Any:
    """`2e9` (a string in YAML 1.1, or a float) and `1_000` are ints when they are whole."""
    if isinstance(value, str):
        try:
            value = float(value.replace("_", ""))
        except ValueError:
            return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # True == 1 would otherwise pick a choice
        raise PydanticCustomError("literal_error", "a bool is not one of the choices")
    return value


# finite only: an inf lr or budget would start every rank and fail inside the optimizer
Float = Annotated[float, BeforeValidator(_yaml_float), AllowInfNan(False)]
Int = Annotated[int, BeforeValidator(_yaml_int)]


class Section(BaseModel):
    """Unknown keys are errors, types are strict (no bool for an int), and an empty section
    (`optim:` with nothing under it) takes every default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_defaults(cls, raw: Any) -> Any:
        return {} if raw is None else raw


class ModelSection(Section):
    path: str | None = None  # an already converted SkipV1 checkpoint (or any supported source)
    source: str | None = None  # an MHA/GQA checkpoint, converted on the fly into the run dir
    # convert options for model.source (skipv1/convert/options.py says what each does and
    # checks them: ConvertOptions.check in check_recipe)
    skip_heads: Int | None = CONVERT.skip_heads
    init: str = CONVERT.init
    # null: the run's own `data.train`; calibrating on the text the run trains on measured
    # better on a third domain too (docs/results/recovery_smollm2_options.md)
    calib_data: DataSource = None
    # 4x convert's default: training text is rarely short, and on SmolLM2 131,072 tokens of it
    # started uptraining at 21.0 KJV perplexity against 23.6 from 32,768 (same recipe after
    # 32k training tokens: 19.6 vs 21.3; recovery_smollm2_options.md) for 2.1x the conversion
    # time; text shorter than this is used whole
    calib_tokens: Int = 4 * CONVERT.calib_tokens
    calib_seq_len: Int = CONVERT.calib_seq_len
    calib_distill_steps: Int = CONVERT.calib_distill_steps
    # > 0: gradual conversion over this fraction of the budget (skipv1/uptrain/gradual.py);
    # any init (the weights it changed are bridged back to the source's at the start); needs the
    # source's weights (model.source or distill.teacher)
    gradual_fraction: Float = Field(0.0, ge=0, le=1)
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


class DataSection(Section):
    train: DataSource = None
    eval: DataSource = None
    seq_len: Int = Field(1024, ge=2)
    seed: Int = 0
    streaming: bool = False  # stream the train data (corpora larger than memory)
    shuffle_buffer: Int = Field(10_000, ge=0)  # streaming only: shuffle buffer (0: file order)
    store: str | None = None  # a token store built by `skipv1 prepare-data` (checked)
    cache_dir: str | None = None  # where token stores live (default: $SKIPV1_CACHE_DIR or
    # ~/.cache/skipv1/token-store)
    num_proc: Int | None = Field(None, gt=0)  # tokenizer processes (default: CPU cores, <= 8)
    store_timeout: Float = Field(7200.0, gt=0)  # seconds other ranks wait for rank 0's build

    def resolved_num_proc(self) -> int:
        return self.num_proc or max(1, min(8, os.cpu_count() or 1))


class BudgetSection(Section):
    tokens: Int | None = Field(None, gt=0)  # absolute number of training tokens
    fraction: Float | None = Field(None, gt=0, le=1)  # ... or this fraction of pretraining_tokens
    pretraining_tokens: Int | None = Field(None, gt=0)  # the source model's pretraining tokens


class BatchSection(Section):
    global_batch_tokens: Int = Field(1_048_576, gt=0)
    micro_batch_size: Int = Field(1, gt=0)  # sequences per rank per forward/backward


class OptimSection(Section):
    lr: Float = Field(1.5e-4, gt=0)  # peak learning rate (paper: best of {0.8, 1, 1.5, 2}e-4)
    betas: list[Float] = [0.9, 0.95]
    eps: Float = Field(1e-8, gt=0)
    weight_decay: Float = Field(0.1, ge=0)  # on matrices only; biases, norms, embeddings get 0
    grad_clip: Float = Field(1.0, ge=0)  # 0 turns clipping off
    warmup_fraction: Float = Field(0.1, ge=0, lt=1)
    min_lr_ratio: Float = Field(0.1, ge=0, le=1)  # cosine decays to min_lr_ratio * lr
    # > 0: for this share of the steps only the attention modules train (every other parameter
    # at lr 0), then everything follows the schedule (engine.make_optimizer's groups)
    attention_first_fraction: Float = Field(0.0, ge=0, lt=1)
    # steps with a non-finite loss skipped (no optimizer update) before the run stops; 0: stop
    skip_nonfinite: Int = Field(0, ge=0)

    @field_validator("betas")
    @classmethod
    def _two_betas(cls, betas: list[float]) -> list[float]:
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"`optim.betas` is {betas}: give two numbers in [0, 1)")
        return betas


class DeepSpeedSection(Section):
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_not_bool)] = 2
    offload_optimizer: bool = False  # ZeRO >= 1: optimizer state in CPU memory (DeepSpeedCPUAdam)
    offload_params: bool = False  # ZeRO-3: parameters in CPU memory
    config: str | None = None  # a DeepSpeed JSON used as the base config
    timeout_s: Int = Field(600, gt=0)  # a collective waiting longer (a rank died) ends the run

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "DeepSpeedSection":
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(
                "`deepspeed.offload_params` needs `deepspeed.zero_stage: 3` "
                f"(it is {self.zero_stage})"
            )
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("`deepspeed.offload_optimizer` needs `deepspeed.zero_stage` 1, 2 or 3")
        return self


class EvalSection(Section):
    every: Int = Field(0, ge=0)  # steps between evaluations; 0: only at the start and the end
    blocks: Int = Field(64, ge=0)  # eval blocks of seq_len tokens (a multiple of the ranks)


class CheckpointSection(Section):
    every: Int = Field(0, ge=0)  # steps between checkpoints; 0: only at the end
    keep_last: Int = Field(2, gt=0)
    resume: str = "auto"  # auto | never | PATH to a checkpoint directory (checked in check_recipe)
    dir: str | None = None  # default: RUN_DIR/checkpoints
    # resume unpickles DeepSpeed state files only when they pass torch's weights-only
    # allow-list; true skips the check (a crafted file could then run code)
    trust_pickles: bool = False


class LogSection(Section):
    progress: bool = True  # rich progress bar on rank 0
    every: Int = Field(1, gt=0)  # steps between progress-bar refreshes and TensorBoard points
    tensorboard: bool = True  # when tensorboard is installed
    wandb_project: str | None = None  # W&B when set (needs `pip install wandb`)
    wandb_run_name: str | None = None


class DistillSection(Section):
    # frozen teacher checkpoint; `source`: the run's source model; null: no KL term
    teacher: str | None = None
    alpha: Float = Field(0.5, ge=0, le=1)  # loss = (1 - alpha) * CE + alpha * T^2 * KL(t || s)
    # alpha moves linearly from `alpha` (first step) to this (last step); null: constant
    alpha_end: Float | None = Field(None, ge=0, le=1)
    temperature: Float = Field(1.0, gt=0)  # T, applied to both logits
    # beta: weight of the hidden-state term (each layer's output pulled to the teacher's,
    # distill.hidden_state_loss) added to the loss; 0: none
    hidden: Float = Field(0.0, ge=0)


class Recipe(Section):
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    budget: BudgetSection = Field(default_factory=BudgetSection)
    batch: BatchSection = Field(default_factory=BatchSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    log: LogSection = Field(default_factory=LogSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    run_dir: str = "runs/uptrain"
    export: bool = True  # write RUN_DIR/export at the end

    @model_validator(mode="after")
    def _complete(self) -> "Recipe":
        """What every recipe must say (here, not in the sections: their defaults stay valid)."""
        if (self.model.path is None) == (self.model.source is None):
            raise ValueError(
                "set exactly one of `model.path` (a converted checkpoint) and `model.source` "
                "(a checkpoint to convert on the fly)"
            )
        if self.data.train is None:
            raise ValueError(
                "`data.train` is missing: give files, a glob, `embedded` or a Hub name"
            )
        if self.model.calib_data is None:
            self.model.calib_data = self.data.train
        if self.distill.hidden and self.distill.teacher is None:
            raise ValueError("`distill.hidden` needs `distill.teacher` (`source` or a directory)")
        b = self.budget
        if (b.tokens is None) == (b.fraction is None):
            raise ValueError("set exactly one of `budget.tokens` and `budget.fraction`")
        if b.fraction is not None and b.pretraining_tokens is None:
            raise ValueError("`budget.fraction` needs `budget.pretraining_tokens`")
        tokens, seq_len = self.batch.global_batch_tokens, self.data.seq_len
        if tokens % seq_len:
            raise ValueError(
                f"`batch.global_batch_tokens` ({tokens}) must be a multiple of "
                f"`data.seq_len` ({seq_len})"
            )
        if total_tokens(self) < tokens:
            raise ValueError(
                f"the budget ({total_tokens(self):,} tokens) is less than one step "
                f"(`batch.global_batch_tokens` = {tokens:,})"
            )
        return self

    def to_dict(self) -> dict:
        return self.model_dump()

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
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as err:
        raise SkipV1Error(one_line_error(Recipe, err)) from None
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


def check_recipe(r: Recipe) -> None:
    """The checks the schema cannot make: they read files or registries, each named by its key."""
    r.model.convert_options().check(name=lambda field: f"`model.{field}`")
    _check_gradual(r)
    ds = r.deepspeed
    if ds.config is not None and not Path(ds.config).is_file():
        raise SkipV1Error(f"`deepspeed.config` {ds.config} does not exist: give a DeepSpeed JSON")
    if r.distill.teacher not in (None, SOURCE):
        check_teacher(r.distill.teacher)
    resume = r.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise SkipV1Error(
            f"`checkpoint.resume` is {resume!r}: allowed values are auto, never or an existing "
            "checkpoint directory"
        )


def _check_gradual(r: Recipe) -> None:
    m = r.model
    if not m.gradual_fraction:
        return
    local_source = m.source is not None and (Path(m.source) / "config.json").is_file()
    if not local_source and r.distill.teacher is None:
        raise SkipV1Error(
            "`model.gradual_fraction` reads the source's later layers (value rows, changed "
            "weights): set `model.source` to a local checkpoint directory or `distill.teacher` to "
            "the source"
        )


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
