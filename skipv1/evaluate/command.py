from ..errors import SkipV1Error


def eval_command() -> None:
    """Evaluate checkpoints side by side (in progress)."""
    raise SkipV1Error("eval is being written")
