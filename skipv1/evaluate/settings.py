"""What `eval` measures and how: one settings object, validated at the edge, identical for every
model in a run so that the side-by-side numbers compare like with like."""

import re
from dataclasses import asdict, dataclass, field

from ..errors import SkipV1Error

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class EvalSettings:
    data: str = "embedded:validation"
    ctx: int | None = None  # None: min(1024, the smallest max_position_embeddings of the models)
    stride: int | None = None  # None: ctx (non-overlapping windows)
    max_tokens: int = 65536  # 0: every token of the data
    ppl_batch: int = 4  # perplexity windows per forward pass
    prompt_len: int = 128
    new_tokens: int = 32
    batch: int = 1
    repeats: int = 3
    kv_budget: int = 16 * 2**30
    context_len: int = 4096
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    seed: int = 0
    skip_perplexity: bool = False
    skip_speed: bool = False
    tasks: list[str] = field(default_factory=list)
    tasks_dir: str | None = None  # extra lm-eval task YAMLs (include_path)
    lm_eval_limit: int | None = None
    lm_eval_batch: int = 1
    quiet: bool = False

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


def parse_bytes(text: "str | int") -> int:
    """`17179869184`, `16GiB`, `16G`, `500MB` -> bytes (KiB/MiB/GiB are powers of 2)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(i?)[bB]?\s*", str(text))
    if not match:
        raise SkipV1Error(f"cannot read {text!r} as a byte count: write e.g. 16GiB, 500MB or 1024")
    number, unit, binary = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    return int(float(number) * (1024 if binary else 1000) ** power)
