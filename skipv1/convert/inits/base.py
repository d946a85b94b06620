"""What every init is: a class that says, for the plan, which tensors it rewrites and, for the
converter, how it makes a later layer's own value heads. Plain Python (no torch at import): the
CLI reads the registry at start-up."""

from typing import ClassVar

from ...errors import SkipV1Error


class Init:
    """One way to make the `n_kv - s` own value heads of a later layer from its source heads.

    A new init is one module in this package: a subclass with the class fields set, `value_rows`
    (an init that only reads v_proj) or `fit` (an init fitted on calibration text) implemented,
    and `@register` on it."""

    name: ClassVar[str]
    rule: ClassVar[str]  # the model card's "initialised as ..." ({groups}, {own_last} filled in)
    calibrated: ClassVar[bool] = False  # fitted on calibration text: needs the tokenizer
    uses_distill_steps: ClassVar[bool] = False  # takes --calib-distill-steps
    # `value_rows` also takes (and returns) an arrays.Array, a tensor as numpy bytes: convert
    # then reads a safetensors source without torch; otherwise it gets torch tensors
    takes_arrays: ClassVar[bool] = False

    def groups(self, num_kv_heads: int, skip_heads: int) -> tuple[tuple[int, ...], ...]:
        """Source value heads each own head is made from; () when chosen per layer by `fit`."""
        return value_head_groups(num_kv_heads, skip_heads)

    def rewrites(self, name: str) -> bool:
        """Tensors besides the later layers' v_proj that this init rewrites (same shape)."""
        return False

    def value_rows(self, tensor, num_kv_heads: int, skip_heads: int):
        """The own heads' rows of a later layer's v_proj weight `(n_kv * d, hidden)` or bias."""
        raise NotImplementedError(f"--init {self.name} is fitted: use `fit`")

    def fit(self, run):
        """A calibrated init's pass over the source (`run`: calibrate.CalibrationRun); returns
        an object with `transform(name, tensor)` and `summary()`."""
        raise NotImplementedError(f"--init {self.name} is not fitted: use `value_rows`")


INIT_REGISTRY: dict[str, Init] = {}


def register(cls: type[Init]) -> type[Init]:
    INIT_REGISTRY[cls.name] = cls()
    return cls


def get_init(name: str, flag: str = "--init") -> Init:
    try:
        return INIT_REGISTRY[name]
    except (KeyError, TypeError):
        raise SkipV1Error(
            f"{flag} {name} is unknown: choose one of {', '.join(INIT_REGISTRY)}"
        ) from None


def value_head_groups(num_kv_heads: int, skip_heads: int) -> tuple[tuple[int, ...], ...]:
    """Source heads 0..n_kv-1 split into n_kv - s contiguous groups as evenly as possible,
    larger groups first: (32, 16) -> (0,1),(2,3),...; (3, 1) -> (0,1),(2)."""
    own = num_kv_heads - skip_heads
    if not 0 < own <= num_kv_heads:
        raise ValueError(f"skip_heads={skip_heads} is out of range for {num_kv_heads} KV heads")
    base, extra = divmod(num_kv_heads, own)
    groups, start = [], 0
    for j in range(own):
        size = base + (1 if j < extra else 0)
        groups.append(tuple(range(start, start + size)))
        start += size
    return tuple(groups)


def split_heads(tensor, num_kv_heads: int):
    """`(n_kv * d, ...)` -> `(n_kv, d, ...)`."""
    if tensor.shape[0] % num_kv_heads:
        raise ValueError(f"{tuple(tensor.shape)} rows do not split into {num_kv_heads} heads")
    return tensor.reshape(num_kv_heads, tensor.shape[0] // num_kv_heads, *tensor.shape[1:])
