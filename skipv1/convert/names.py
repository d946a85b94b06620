"""Tensor names of the Llama-family checkpoint layout that the converter and the inits read."""

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def layer_index(name: str) -> int | None:
    """i for model.layers.{i}.*, None for any other tensor."""
    parts = name.split(".")
    ok = len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit()
    return int(parts[2]) if ok else None


def attention_projection(name: str) -> str | None:
    """ "q_proj" for model.layers.{i}.self_attn.q_proj.{weight,bias} (likewise k, v, o)."""
    parts = name.split(".")
    ok = len(parts) == 6 and layer_index(name) is not None and parts[3] == "self_attn"
    return parts[4] if ok and parts[4] in ATTENTION_PROJECTIONS else None


def later_attention_projection(name: str) -> str | None:
    """ "q_proj" for model.layers.{i}.self_attn.q_proj.{weight,bias} with i >= 1 (likewise k, v,
    o); None for any other tensor."""
    projection = attention_projection(name)
    return projection if projection and layer_index(name) >= 1 else None


def is_later_down_proj(name: str) -> bool:
    """model.layers.{i}.mlp.down_proj.weight with i >= 1."""
    i = layer_index(name)
    return i is not None and i >= 1 and name.endswith(".mlp.down_proj.weight")


def later_attention_norm(name: str) -> str | None:
    """ "q_norm" for model.layers.{i}.self_attn.q_norm.weight with i >= 1 (likewise k_norm)."""
    parts = name.split(".")
    i = layer_index(name)
    ok = len(parts) == 6 and i is not None and i >= 1 and parts[3] == "self_attn"
    return parts[4] if ok and parts[4] in ("q_norm", "k_norm") else None
