"""Gradual conversion: the borrowed value heads move from the layer's own source values to layer
0's over the first part of the uptraining budget, so the loss never jumps.

During the ramp each later layer uses, for its borrowed heads j >= n_kv - s,

    v_j = (1 - m) * v_source_j(x) + m * v0_j,        m = min(1, steps done / ramp steps),

where v_source_j are the source's own value rows for those heads (frozen, read from the source
checkpoint) and v0_j layer 0's values. At m = 0 a `--init keep` conversion computes exactly the
source's function; from the end of the ramp on it computes exactly the SkipV1 function, and the
frozen rows are dropped from exports (`BLEND_MARKER`), so the export is the plain
SkipV1 checkpoint.
"""

from pathlib import Path

import torch
from torch import nn

from ..errors import SkipV1Error

BLEND_MODULE = "value_blend"  # the attribute SkipV1LlamaAttention reads (see the modeling file)


class ValueBlend(nn.Module):
    """One later layer's frozen source value rows for its borrowed heads and the mix m."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, head_dim: int):
        super().__init__()
        self.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        self.proj.to(dtype=weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(weight)
            if bias is not None:
                self.proj.bias.copy_(bias)
        self.proj.requires_grad_(False)
        self.head_dim = head_dim
        self.mix = 1.0

    def forward(self, hidden_states: torch.Tensor, borrowed: torch.Tensor) -> torch.Tensor:
        if self.mix >= 1.0:
            return borrowed
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        own = self.proj(hidden_states.to(self.proj.weight.dtype)).view(shape).transpose(1, 2)
        return torch.lerp(own.to(borrowed.dtype), borrowed, self.mix)


class GradualConversion:
    """Attaches a ValueBlend to every later layer and sets their mix from the step."""

    def __init__(self, model: nn.Module, source_dir: Path, ramp_steps: int):
        if ramp_steps < 1:
            raise SkipV1Error("gradual conversion needs a ramp of at least one step")
        self.ramp_steps = ramp_steps
        self.blends: list[ValueBlend] = []
        config = model.config
        own = config.num_key_value_heads - config.skip_v_heads
        head_dim = config.head_dim
        rows = source_value_rows(source_dir, config.num_hidden_layers)
        for i, layer in enumerate(model.model.layers):
            if i == 0:
                continue
            weight, bias = rows[i]
            expected = config.num_key_value_heads * head_dim
            if weight.shape[0] != expected:
                raise SkipV1Error(
                    f"the source's layer {i} v_proj has {weight.shape[0]} rows, not "
                    f"num_key_value_heads x head_dim = {expected}: it is not this model's source"
                )
            if not hasattr(layer.self_attn, BLEND_MODULE):  # modeling code older than the hook
                raise SkipV1Error(
                    "gradual conversion needs skipv1's modeling code (load without "
                    "trust_remote_code, or convert again with this version)"
                )
            tail = slice(own * head_dim, None)
            blend = ValueBlend(
                weight[tail].to(layer.self_attn.v_proj.weight.dtype),
                None if bias is None else bias[tail].to(layer.self_attn.v_proj.weight.dtype),
                head_dim,
            )
            setattr(layer.self_attn, BLEND_MODULE, blend.to(layer.self_attn.v_proj.weight.device))
            self.blends.append(blend)
        self.set_step(0)

    def mix_at(self, step: int) -> float:
        """m after `step` optimizer steps: 0 at the start, exactly 1 from the ramp's end on."""
        return min(1.0, step / self.ramp_steps)

    def set_step(self, step: int) -> float:
        mix = self.mix_at(step)
        for blend in self.blends:
            blend.mix = mix
        return mix


def source_value_rows(source_dir: Path, layers: int) -> dict[int, tuple]:
    """{layer: (v_proj weight, bias or None)} of a local source checkpoint, layers >= 1."""
    from ..convert.reader import iter_tensors, scan_weights

    source_dir = Path(source_dir)
    if not (source_dir / "config.json").is_file():
        raise SkipV1Error(
            f"gradual conversion reads the source's value rows from {source_dir}, which is not a "
            "local checkpoint directory: set `model.source` (or `distill.teacher`) to one"
        )
    weights = scan_weights(source_dir)
    names = {
        f"model.layers.{i}.self_attn.v_proj.{kind}"
        for i in range(1, layers)
        for kind in ("weight", "bias")
    }
    found = dict(iter_tensors(weights, names))
    rows = {}
    for i in range(1, layers):
        weight = found.get(f"model.layers.{i}.self_attn.v_proj.weight")
        if weight is None:
            raise SkipV1Error(f"{source_dir} has no model.layers.{i}.self_attn.v_proj.weight")
        rows[i] = (weight, found.get(f"model.layers.{i}.self_attn.v_proj.bias"))
    return rows


BLEND_MARKER = f".{BLEND_MODULE}."  # in the names of the gradual-conversion rows, which the
# export drops (the plain SkipV1 checkpoint)
