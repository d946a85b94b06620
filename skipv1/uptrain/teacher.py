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
    from ..convert.api import locate_source

    provenance = locate_source(recipe.model.path).path / "skipv1_conversion.json"
    if provenance.is_file():
        return json.loads(provenance.read_text()).get("source")
    return None


def resolve_teacher(recipe, run_dir: Path) -> Path | None:
    """The teacher's checkpoint directory: `source` or a source as convert takes one (a directory,
    a .gguf file, builtin:smollm2, a Hub id); rank 0 stages a GGUF into RUN_DIR/teacher."""
    teacher = recipe.distill.teacher
    if teacher is None:
        return None
    from ..convert.api import locate_source, stage_gguf

    src = source_of(recipe) if teacher == SOURCE else teacher
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


def check_teacher(teacher: str) -> None:
    """A `distill.teacher` other than `source` names a source convert could read (checked
    without downloading or loading anything)."""
    from ..convert.api import source_kind

    if source_kind(teacher) is not None:
        return
    raise SkipV1Error(
        f"`distill.teacher` {teacher} is not a checkpoint directory with a config.json, a .gguf "
        "file, builtin:smollm2 or a Hub id: give the source model, `source`, or null to train "
        "without distillation"
    )
