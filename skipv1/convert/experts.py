"""A mixture-of-experts layer's tensors as the checkpoint holds them (one per expert, as on the
Hub; the plan copies them unchanged) and as transformers' modules hold them (stacked), for the
calibrated inits, which build the family's own layers from the checkpoint's tensors. The
stacking is the one transformers' weight conversion does on loading (gate and up concatenated,
gate first)."""

import torch

from ..families import SKIPV1_MODEL_TYPES
from .names import layer_index


def _layout(config):
    family = SKIPV1_MODEL_TYPES.get(config.model_type)
    return None if family is None else family.experts


def _expert_names(config, prefix: str, kinds: tuple[str, ...]) -> list[list[str]]:
    layout = _layout(config)
    count = config.num_local_experts  # both families' configs answer to this name
    base = f"{prefix}{layout.block}.experts."
    return [[f"{base}{e}.{getattr(layout, k)}.weight" for e in range(count)] for k in kinds]


def _split(name: str) -> tuple[str, str]:
    """model.layers.{i}.rest -> ("model.layers.{i}.", "rest"); ("", name) outside the layers."""
    i = layer_index(name)
    if i is None:
        return "", name
    prefix = f"model.layers.{i}."
    return prefix, name[len(prefix) :]


def checkpoint_names(config, names: list[str]) -> list[str]:
    """The checkpoint's tensors that make the module tensors `names` (full names)."""
    if _layout(config) is None:
        return list(names)
    out = []
    for name in names:
        prefix, rest = _split(name)
        if rest == "mlp.gate.weight":
            out.append(f"{prefix}{_layout(config).block}.gate.weight")
        elif rest == "mlp.experts.gate_up_proj":
            out.extend(n for group in _expert_names(config, prefix, ("gate", "up")) for n in group)
        elif rest == "mlp.experts.down_proj":
            out.extend(_expert_names(config, prefix, ("down",))[0])
        else:
            out.append(name)
    return out


def module_state(config, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint tensors -> module tensors (the experts of each layer stacked); the others
    keep their names."""
    layout = _layout(config)
    if layout is None:
        return dict(tensors)
    out, prefixes = {}, set()
    expert_part = f"{layout.block}.experts."
    for name, tensor in tensors.items():
        prefix, rest = _split(name)
        if rest.startswith(expert_part):
            prefixes.add(prefix)
        elif rest == f"{layout.block}.gate.weight":
            out[f"{prefix}mlp.gate.weight"] = tensor
        else:
            out[name] = tensor
    for prefix in sorted(prefixes):
        gates, ups = _expert_names(config, prefix, ("gate", "up"))
        (downs,) = _expert_names(config, prefix, ("down",))
        out[f"{prefix}mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([tensors[g], tensors[u]]) for g, u in zip(gates, ups, strict=True)]
        )
        out[f"{prefix}mlp.experts.down_proj"] = torch.stack([tensors[d] for d in downs])
    return out
