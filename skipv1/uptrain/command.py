from ..errors import SkipV1Error


def uptrain() -> None:
    """Uptrain a SkipV1 checkpoint (in progress)."""
    raise SkipV1Error("uptrain is being written")


def export() -> None:
    """Export a run's checkpoint (in progress)."""
    raise SkipV1Error("export is being written")
