"""What `eval` measures and how: one settings object, validated at the edge, identical for every
model in a run so that the side-by-side numbers compare like with like."""

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli_fields import cli
from ..errors import SkipV1Error
from ..units import DTYPE_NAMES, parse_bytes
from .lm_eval_runner import parse_tasks

DTYPES = ("auto", *DTYPE_NAMES)
DEVICES = ("auto", "cpu", "cuda")
PPL = "Perplexity"
KV = "KV cache and speed"
LM = "lm-evaluation-harness"


@dataclass
class EvalSettings:
    """Every `eval` option: the CLI is made from these fields (cli_fields.py)."""

    data: str = field(
        default="embedded:validation",
        metadata=cli(
            "Data spec: local .txt/.jsonl/.parquet files or glob; embedded, embedded:train or "
            "embedded:validation; or a Hub dataset NAME, NAME:CONFIG, NAME:CONFIG@SPLIT.",
            panel=PPL,
        ),
    )
    ctx: int | None = field(
        default=None,
        metadata=cli("Tokens per window (default: min(1024, max positions)).", panel=PPL),
    )
    stride: int | None = field(
        default=None,
        metadata=cli(
            "Window step; < ctx slides the window, each token scored once (default: ctx).",
            panel=PPL,
        ),
    )
    max_tokens: int = field(
        default=65536, metadata=cli("Tokens of the data to score; 0 for all.", panel=PPL)
    )
    ppl_batch: int = field(default=4, metadata=cli("Windows per forward pass.", panel=PPL))
    skip_perplexity: bool = field(
        default=False, metadata=cli("Skip perplexity.", panel=PPL, flag="--no-perplexity")
    )
    prompt_len: int = field(
        default=128, metadata=cli("Prompt tokens for the KV measure and speed.", panel=KV)
    )
    new_tokens: int = field(
        default=32, metadata=cli("Tokens generated per speed run (>= 2).", panel=KV)
    )
    batch: int = field(default=1, metadata=cli("Sequences per speed run.", panel=KV))
    repeats: int = field(
        default=3, metadata=cli("Timed speed runs; the median is reported.", panel=KV)
    )
    kv_budget: int = field(
        default=16 * 2**30,
        metadata=cli(
            "KV-cache memory for the max-batch column: bytes, or 16GiB, 500MB...",
            panel=KV,
            type=str,
            default="16GiB",
            parse=lambda text: parse_bytes(text, "--kv-budget"),
        ),
    )
    context_len: int = field(
        default=4096, metadata=cli("Tokens per sequence for the max-batch column.", panel=KV)
    )
    skip_speed: bool = field(
        default=False, metadata=cli("Skip the speed runs.", panel=KV, flag="--no-speed")
    )
    dtype: str = field(
        default="auto",
        metadata=cli("auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16."),
    )
    device: str = field(default="auto", metadata=cli("auto, cpu or cuda."))
    seed: int = field(default=0, metadata=cli("Seed of the speed/KV prompt."))
    tasks: list[str] = field(
        default_factory=list,
        metadata=cli(
            "Comma-separated lm-eval tasks, run on every model (needs the lm-eval extra).",
            panel=LM,
            type=str | None,
            parse=parse_tasks,
        ),
    )
    tasks_dir: str | None = field(  # extra lm-eval task YAMLs (include_path)
        default=None,
        metadata=cli(
            "Directory of extra lm-eval task YAMLs.",
            panel=LM,
            type=Path | None,
            parse=lambda path: str(path) if path else None,
        ),
    )
    lm_eval_limit: int | None = field(
        default=None, metadata=cli("Examples per lm-eval task.", panel=LM)
    )
    lm_eval_batch: int = field(default=1, metadata=cli("lm-eval batch size.", panel=LM))
    quiet: bool = field(default=False, metadata=cli("No progress output.", flag="--quiet"))

    def validate(self) -> "EvalSettings":
        """Raises SkipV1Error on the first bad number; run before loading anything slow."""
        positive = {
            "--max-tokens": (self.max_tokens, 0),
            "--ppl-batch": (self.ppl_batch, 1),
            "--prompt-len": (self.prompt_len, 1),
            "--new-tokens": (self.new_tokens, 2),
            "--batch": (self.batch, 1),
            "--repeats": (self.repeats, 1),
            "--kv-budget": (self.kv_budget, 1),
            "--context-len": (self.context_len, 1),
            "--lm-eval-batch": (self.lm_eval_batch, 1),
        }
        if self.ctx is not None:
            positive["--ctx"] = (self.ctx, 2)
        if self.stride is not None:
            positive["--stride"] = (self.stride, 1)
        if self.lm_eval_limit is not None:
            positive["--lm-eval-limit"] = (self.lm_eval_limit, 1)
        for name, (value, low) in positive.items():
            if value < low:
                raise SkipV1Error(f"{name} {value} is too small: give an integer >= {low}")
        if self.ctx is not None and self.stride is not None and self.stride > self.ctx:
            raise SkipV1Error(
                f"--stride {self.stride} is larger than --ctx {self.ctx}: tokens between windows "
                "would never be scored; use a stride <= ctx"
            )
        if self.dtype not in DTYPES:
            raise SkipV1Error(f"unknown --dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise SkipV1Error(f"unknown --device {self.device!r}: use one of {', '.join(DEVICES)}")
        return self

    def as_dict(self) -> dict:
        return asdict(self)
