"""`distill.teacher: source`: the run's own source model as the distillation teacher, without the
user spelling out where a Hub download or a GGUF staging directory lives."""

import json
from pathlib import Path

from ..errors import SkipV1Error

SOURCE = "source"  # the recipe value that names the run's source model


def source_of(recipe) -> str | None:
    """`model.source`, or the source recorded in a converted `model.path`'s provenance."""
    if recipe.model.source:
        return recipe.model.source
    provenance = Path(recipe.model.path) / "skipv1_conversion.json"
    if provenance.is_file():
        return json.loads(provenance.read_text()).get("source")
    return None


def resolve_teacher(recipe, run_dir: Path) -> Path | None:
    """The teacher's checkpoint directory (rank 0 stages a GGUF source into RUN_DIR/teacher)."""
    teacher = recipe.distill.teacher
    if teacher is None:
        return None
    if teacher != SOURCE:
        return Path(teacher)
    from ..convert.api import locate_source, stage_gguf

    src = source_of(recipe)
    if src is None:
        raise SkipV1Error(
            "`distill.teacher: source` needs the run's source: set `model.source`, or give a "
            "`model.path` converted by skipv1 (its skipv1_conversion.json names the source)"
        )
    located = locate_source(src)
    if not located.is_gguf:
        return located.path
    staged = run_dir / "teacher"
    if not (staged / "config.json").is_file():
        stage_gguf(located.path, staged)
    return staged
