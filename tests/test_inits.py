"""The init registry: a new init is one class, and convert, the plan, the provenance and the
model card use it by name with no other change."""

import json

import pytest
import torch
from safetensors.torch import load_file

from skipv1.convert.api import convert_checkpoint
from skipv1.convert.inits import CALIBRATED_INITS, DEFAULT_INIT, INITS, get_init
from skipv1.convert.inits.base import INIT_REGISTRY, Init, register, split_heads
from skipv1.errors import SkipV1Error


@pytest.fixture
def last_heads_init():
    """An init written the way a contributor would add one: own heads = the source's last."""

    @register
    class LastHeads(Init):
        name = "last-heads"
        rule = "the source's last value heads"

        def groups(self, num_kv_heads, skip_heads):
            return tuple((j,) for j in range(skip_heads, num_kv_heads))

        def value_rows(self, tensor, num_kv_heads, skip_heads):
            d = split_heads(tensor, num_kv_heads).shape[1]
            return tensor[skip_heads * d :].contiguous()

    yield LastHeads
    INIT_REGISTRY.pop(LastHeads.name)


def test_a_new_init_is_one_class(checkpoint, tmp_path, last_heads_init):
    src = checkpoint("src", num_attention_heads=4, num_key_value_heads=4, hidden_size=32)
    dst = tmp_path / "out"
    summary = convert_checkpoint(src, dst, init="last-heads", skip_heads=1, quiet=True)
    assert summary["init"] == "last-heads" and summary["value_head_groups"] == [[1], [2], [3]]
    source, out = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    name = "model.layers.1.self_attn.v_proj.weight"
    d = source[name].shape[0] // 4
    assert torch.equal(out[name], source[name][d:])
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["options"]["init"] == "last-heads" and "calib_tokens" not in record["options"]
    assert "the source's last value heads" in (dst / "README.md").read_text()


def test_the_registry_lists_the_default_first_and_refuses_unknown_names():
    assert INITS[0] == DEFAULT_INIT and set(INITS) == {"reconstruct", "calibrated", "keep", "mean"}
    assert set(CALIBRATED_INITS) == {"reconstruct", "calibrated"}
    with pytest.raises(SkipV1Error, match="--init median is unknown: choose one of reconstruct,"):
        get_init("median")


@pytest.mark.parametrize(
    ("init", "rewritten"),
    [
        ("keep", set()),
        ("mean", set()),
        ("calibrated", {"q_proj", "k_proj", "v_proj", "o_proj"}),
        ("reconstruct", {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}),
    ],
)
def test_each_init_says_which_later_tensors_it_rewrites(init, rewritten):
    def name(layer: int, projection: str) -> str:
        module = "mlp" if projection in ("down_proj", "up_proj") else "self_attn"
        return f"model.layers.{layer}.{module}.{projection}.weight"

    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "up_proj")
    method = get_init(init)
    assert {p for p in projections if method.rewrites(name(3, p))} == rewritten
    assert not any(method.rewrites(name(0, p)) for p in projections)  # layer 0 stays
