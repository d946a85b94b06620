"""Gradual conversion: the model moves from the source's function to the converted one over the
first part of the uptraining budget, so the loss never jumps.

During the ramp, with m = min(1, steps done / ramp steps), each later layer computes
- for its borrowed heads j: v_j = (1 - m) * v_source_j(x) + m * v0_j, from the source's own value
  rows for those heads (frozen) and layer 0's values;
- for every linear the conversion changed (`reconstruct` refits o_proj and down_proj, and its
  attention distillation moves q/k/v/o): y = W x + (1 - m) * D x, where D is the source's weight
  in the converted head order minus W at the start (frozen), so the trained W carries on alone.

So at m = 0 the model computes exactly the source's function, whatever the init (the head order
the conversion chose is read from its skipv1_conversion.json; a wrong order would still start at
the source, by a longer path); from the end of the ramp on it computes exactly the SkipV1
function, and the frozen tensors are dropped from exports (`BLEND_MARKER`), so the export is the
plain SkipV1 checkpoint. Llama-named checkpoints only (the source's tensors are read by name).
"""

import contextlib
import json
from pathlib import Path

import torch
from torch import nn

from ..errors import SkipV1Error

BLEND_MODULE = "value_blend"  # the attribute SkipV1LlamaAttention reads (see the modeling file)
PROVENANCE = "skipv1_conversion.json"


class ValueBlend(nn.Module):
    """One later layer's frozen source tensors (its borrowed heads' value rows and the weight
    differences of changed linears) and the mix m."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, head_dim: int):
        super().__init__()
        self.proj = _frozen_linear(weight, bias)
        self.bridges = nn.ModuleDict()  # module path (dots as "__") -> source - converted
        self.bridged: set[str] = set()  # the module paths within the layer
        self.head_dim = head_dim
        self.mix = 1.0

    def forward(self, hidden_states: torch.Tensor, borrowed: torch.Tensor) -> torch.Tensor:
        if self.mix >= 1.0:
            return borrowed
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        own = self.proj(hidden_states.to(self.proj.weight.dtype)).view(shape).transpose(1, 2)
        return torch.lerp(own.to(borrowed.dtype), borrowed, self.mix)

    def bridge(self, module: nn.Linear, path: str, weight, bias) -> None:
        """From now on `module` outputs W x + (1 - m) D x while m < 1 (D: weight, bias)."""
        delta = _frozen_linear(weight, bias).to(module.weight.device)
        self.bridges[path.replace(".", "__")] = delta
        self.bridged.add(path)

        def add_difference(_module, inputs, output):
            if self.mix >= 1.0:
                return output
            return output + (1.0 - self.mix) * delta(inputs[0])

        module.register_forward_hook(add_difference)


class GradualConversion:
    """Attaches a ValueBlend to every later layer and sets their mix from the step."""

    def __init__(self, model: nn.Module, source_dir: Path, ramp_steps: int, model_dir=None):
        if ramp_steps < 1:
            raise SkipV1Error("gradual conversion needs a ramp of at least one step")
        self.ramp_steps = ramp_steps
        self.blends: list[ValueBlend] = []
        config = model.config
        orders = head_orders(model_dir)
        weights = source_weights(source_dir)
        for i, layer in enumerate(model.model.layers):
            if i == 0:
                continue
            if not hasattr(layer.self_attn, BLEND_MODULE):  # modeling code older than the hook
                raise SkipV1Error(
                    "gradual conversion needs skipv1's modeling code (load without "
                    "trust_remote_code, or convert again with this version)"
                )
            order = orders.get(i, list(range(config.num_key_value_heads)))
            ordered = _in_head_order(source_layer(weights, i), order, config)
            blend = self._attach(layer, ordered, config, i)
            self.blends.append(blend)
        self.set_step(0)

    @staticmethod
    def _attach(layer: nn.Module, source: dict, config, i: int) -> ValueBlend:
        d, own = config.head_dim, config.num_key_value_heads - config.skip_v_heads
        attn = layer.self_attn
        rows, bias = source["self_attn.v_proj.weight"], source.get("self_attn.v_proj.bias")
        if rows.shape[0] != config.num_key_value_heads * d:
            raise SkipV1Error(
                f"the source's layer {i} v_proj has {rows.shape[0]} rows, not num_key_value_heads "
                f"x head_dim = {config.num_key_value_heads * d}: it is not this model's source"
            )
        dtype, tail = attn.v_proj.weight.dtype, slice(own * d, None)
        blend = ValueBlend(rows[tail].to(dtype), None if bias is None else bias[tail].to(dtype), d)
        blend.to(attn.v_proj.weight.device)
        # the own heads' rows are compared with the layer's v_proj, the rest feed the blend
        source = source | {"self_attn.v_proj.weight": rows[: own * d]}
        if bias is not None:
            source["self_attn.v_proj.bias"] = bias[: own * d]
        with _gathered(layer):
            _bridge_changed_linears(layer, blend, source, i)
        setattr(attn, BLEND_MODULE, blend)
        return blend

    def mix_at(self, step: int) -> float:
        """m after `step` optimizer steps: 0 at the start, exactly 1 from the ramp's end on."""
        return min(1.0, step / self.ramp_steps)

    def set_step(self, step: int) -> float:
        mix = self.mix_at(step)
        for blend in self.blends:
            blend.mix = mix
        return mix


def _bridge_changed_linears(layer, blend: ValueBlend, source: dict, i: int) -> None:
    """A bridge for every linear whose weight or bias differs from the source's (weight and bias
    together); any other changed tensor means the start could not be the source's function."""
    for name, param in layer.named_parameters():
        path = name.rpartition(".")[0]
        if path in blend.bridged:
            continue
        target = source.get(name)
        if target is None or target.shape != param.shape:
            raise SkipV1Error(
                f"layer {i}'s {name} has no counterpart of its shape in the source: gradual "
                "conversion cannot start from the source's function"
            )
        if torch.equal(target.to(param.dtype), param.detach().cpu()):
            continue
        module = layer.get_submodule(path)
        if not isinstance(module, nn.Linear):
            raise SkipV1Error(
                f"layer {i}'s {name} differs from the source's and is not a linear layer's: "
                "gradual conversion cannot start from the source's function"
            )
        differences = (_difference(source, path, module, kind) for kind in ("weight", "bias"))
        blend.bridge(module, path, *differences)


def _gathered(layer: nn.Module):
    """The layer's full parameters while reading them, also where ZeRO-3 partitioned them."""
    params = [p for p in layer.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


def _difference(source: dict, path: str, module: nn.Linear, kind: str):
    """Source minus converted for a linear's weight or bias (None where it has no bias)."""
    param = getattr(module, kind)
    if param is None:
        return None
    with torch.no_grad():
        delta = source[f"{path}.{kind}"].to(torch.float32) - param.detach().cpu().float()
    return delta.to(param.dtype)


def _frozen_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.to(dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear.requires_grad_(False)


def head_orders(model_dir) -> dict[int, list[int]]:
    """{layer: the source's KV heads in the converted layer's slot order} from the conversion's
    record (calibrated and reconstruct permute heads); empty when there is none (keep, mean)."""
    path = None if model_dir is None else Path(model_dir) / PROVENANCE
    if path is None or not path.is_file():
        return {}
    layers = (json.loads(path.read_text()).get("calibration") or {}).get("layers") or {}
    return {int(i): record["order"] for i, record in layers.items() if "order" in record}


def _in_head_order(tensors: dict, order: list[int], config) -> dict:
    """The source layer's tensors with their heads in the converted order (calibrate.py's rule);
    a per-head q/k norm (one head_dim weight shared by all heads) does not move."""
    from ..convert.calibrate import heads_in_order

    d, group = config.head_dim, config.num_attention_heads // config.num_key_value_heads
    out = {}
    for name, tensor in tensors.items():
        module, _, proj = name.rpartition(".")[0].partition(".")
        if module == "self_attn" and tensor.numel() > d:
            tensor = heads_in_order(proj, tensor, order, group, d)
        out[name] = tensor
    return out


def source_weights(source_dir: Path):
    """The local source checkpoint's index (read layer by layer: one layer in memory at a time)."""
    from ..convert.reader import scan_weights

    source_dir = Path(source_dir)
    if not (source_dir / "config.json").is_file():
        raise SkipV1Error(
            f"gradual conversion reads the source's later layers from {source_dir}, which is not "
            "a local checkpoint directory: set `model.source` (or `distill.teacher`) to one"
        )
    return scan_weights(source_dir)


def source_layer(weights, i: int) -> dict[str, torch.Tensor]:
    """{name within the layer: tensor} of the source's layer i."""
    from ..convert.reader import iter_tensors

    prefix = f"model.layers.{i}."
    names = {n for n in weights.refs if n.startswith(prefix)}
    tensors = {name[len(prefix) :]: t for name, t in iter_tensors(weights, names)}
    if "self_attn.v_proj.weight" not in tensors:
        raise SkipV1Error(f"{weights.root} has no {prefix}self_attn.v_proj.weight")
    return tensors


BLEND_MARKER = f".{BLEND_MODULE}."  # in the names of the gradual-conversion tensors, which the
# export drops (the plain SkipV1 checkpoint)
