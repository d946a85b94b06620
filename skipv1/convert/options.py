"""`ConvertOptions`: what `convert` is asked to do, declared once. The CLI's defaults, the
recipe's `model.*` convert keys and `convert_checkpoint`'s keywords are these fields; `check`
validates them before anything is read or written, naming each field as its caller spells it."""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import SkipV1Error
from ..units import DTYPE_NAMES, parse_bytes
from .inits import DEFAULT_INIT, get_init


def cli_flag(field: str) -> str:
    return "--" + field.replace("_", "-")


@dataclass(frozen=True)
class ConvertOptions:
    skip_heads: int | None = None  # value heads (in KV heads) later layers borrow; None: n_kv//2
    init: str = DEFAULT_INIT  # how the own value heads are made (convert/inits/)
    dtype: str = "auto"  # output dtype; auto: the source's
    shard_size: "str | int" = "5GB"  # largest output shard
    trust_remote_code: bool = False  # convert a source whose config names custom code
    # calibrated inits: calibration text (a data spec, or `sampled`: sampled from the source,
    # convert/sampled.py, the default: no domain to choose, and the best start measured out of
    # domain, docs/results/recovery_smollm2.md), its tokens, tokens per sequence
    calib_data: Any = "sampled"
    calib_tokens: int = 32768
    calib_seq_len: int = 256
    # reconstruct: steps (of 4 calibration sequences) of the final attention distillation
    calib_distill_steps: int = 30

    @property
    def max_shard_bytes(self) -> int:
        return parse_bytes(self.shard_size, "--shard-size")

    def check(self, name: Callable[[str], str] = cli_flag) -> "ConvertOptions":
        """Raises SkipV1Error on the first bad option; `name(field)` spells it for the user."""
        init = get_init(self.init, name("init"))
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise SkipV1Error(
                f"{name('dtype')} {self.dtype} is unknown: choose auto, {', '.join(DTYPE_NAMES)}"
            )
        self.max_shard_bytes  # noqa: B018  (raises on a bad size)
        if init.calibrated:
            self._check_calibration(name)
        return self

    def _check_calibration(self, name: Callable[[str], str]) -> None:
        from ..textdata import parse_data_spec
        from .sampled import is_sampled

        if not is_sampled(self.calib_data):
            parse_data_spec(self.calib_data)
        for field in ("calib_tokens", "calib_seq_len"):
            value = getattr(self, field)
            if not _is_int(value) or value <= 0:
                raise SkipV1Error(f"{name(field)} {value} must be a positive number of tokens")
        steps = self.calib_distill_steps
        if not _is_int(steps) or steps < 0:
            raise SkipV1Error(
                f"{name('calib_distill_steps')} {steps} must be 0 or a positive number of steps"
            )
        if self.calib_tokens < self.calib_seq_len:
            raise SkipV1Error(
                f"{name('calib_tokens')} {self.calib_tokens} is less than one sequence of "
                f"{name('calib_seq_len')} {self.calib_seq_len}: raise it"
            )

    def record(self) -> dict:
        """The options as skipv1_conversion.json records them: only those the init used."""
        init = get_init(self.init)
        record = asdict(self)
        if not init.calibrated:
            for field in ("calib_data", "calib_tokens", "calib_seq_len"):
                record.pop(field)
        if not init.uses_distill_steps:
            record.pop("calib_distill_steps")
        return record


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


CONVERT_DEFAULTS = ConvertOptions()
