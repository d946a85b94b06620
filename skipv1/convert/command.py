from ..errors import SkipV1Error


def convert() -> None:
    """Convert a source checkpoint to SkipV1 (in progress)."""
    raise SkipV1Error("convert is being written")
