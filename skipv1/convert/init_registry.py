"""The inits `convert` knows, with what the converter must know of each (no torch here: the CLI
reads the default at start-up). The tensor work of each lives in its own module: init.py (keep,
mean), calibrate.py (calibrated), reconstruct.py (reconstruct)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class InitSpec:
    """What the converter must know about an init; the tensor work lives in its own module."""

    name: str
    calibrated: bool  # fitted on calibration text: needs its options and the tokenizer
    refits_mlp: bool  # also rewrites mlp.down_proj of layers >= 1
    rule: str  # how the own value heads are made, for the model card


INIT_SPECS = {
    spec.name: spec
    for spec in (
        InitSpec(
            "reconstruct",
            True,
            True,
            "the source heads chosen per layer on calibration text; o_proj and mlp.down_proj "
            "of every later layer are refitted layer by layer so that the converted model's "
            "hidden states follow the source's",
        ),
        InitSpec(
            "calibrated",
            True,
            False,
            "the source heads chosen per layer on calibration text (the others read layer 0, "
            "with their o_proj columns refitted by least squares)",
        ),
        InitSpec("keep", False, False, "source value heads 0..{own_last}"),
        InitSpec("mean", False, False, "the mean of source value heads in groups {groups}"),
    )
}
INITS = tuple(INIT_SPECS)
# The init that measures best (docs/results/post_conversion_smollm2.md); `mean` is the paper's.
DEFAULT_INIT = "reconstruct"
# reconstruct's last stage: steps of attention distillation (distill_attention.py).
DEFAULT_CALIB_DISTILL_STEPS = 30
CALIBRATED_INITS = tuple(name for name, spec in INIT_SPECS.items() if spec.calibrated)
