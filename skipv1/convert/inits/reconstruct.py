"""`--init reconstruct` (the default, the best measured: docs/results/post_conversion_smollm2.md):
calibrated's head choice, then o_proj and mlp.down_proj of every later layer refitted layer by
layer so that the converted hidden states follow the source's, then optionally a short
distillation of the later layers' attention (convert/reconstruct.py, distill_attention.py)."""

from ..names import is_later_down_proj
from .base import register
from .calibrated import Calibrated


@register
class Reconstruct(Calibrated):
    name = "reconstruct"
    rule = (
        "the source heads chosen per layer on calibration text; o_proj and mlp.down_proj "
        "of every later layer are refitted layer by layer so that the converted model's "
        "hidden states follow the source's"
    )
    uses_distill_steps = True

    def rewrites(self, name: str) -> bool:
        return super().rewrites(name) or is_later_down_proj(name)

    def layer_fit(self):
        from ..reconstruct import reconstruct

        return reconstruct

    def fit(self, run):
        result = super().fit(run)
        steps = run.options.calib_distill_steps
        if steps:
            from ..distill_attention import distill_attention

            task = run.progress.add_task(f"{self.name}: distilling attention", total=steps)
            tensors, result.distill = distill_attention(
                run.config,
                run.load(run.tensor_names),
                result.transform,
                run.ids,
                run.skip_heads,
                steps,
                device=run.device,
                on_step=lambda i: run.progress.advance(task),
            )
            result.tensors.update(tensors)
        return result
