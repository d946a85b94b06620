"""`--init calibrated`: the borrowed heads chosen per layer on calibration text, their o_proj
columns refitted by least squares (the tensor work: convert/calibrate.py)."""

from ..names import later_attention_projection
from .base import Init, register


@register
class Calibrated(Init):
    name = "calibrated"
    rule = (
        "the source heads chosen per layer on calibration text (the others read layer 0, "
        "with their o_proj columns refitted by least squares)"
    )
    calibrated = True

    def groups(self, num_kv_heads: int, skip_heads: int) -> tuple[tuple[int, ...], ...]:
        return ()  # chosen per layer: see the calibration record

    def rewrites(self, name: str) -> bool:
        # q/k/v rows and o_proj columns of later layers are permuted by head, o_proj refitted
        return later_attention_projection(name) is not None

    def layer_fit(self):
        """The layer-by-layer pass: fn(config, load, ids, s, on_layer=, device=)."""
        from ..calibrate import calibrate

        return calibrate

    def fit(self, run):
        result = self.layer_fit()(
            run.config,
            run.load,
            run.ids,
            run.skip_heads,
            on_layer=run.layer_progress(self.name),
            device=run.device,
        )
        return run.wrap(result)
