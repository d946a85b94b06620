"""`skipv1 convert --init calibrated` end to end: the recorded head order and the refitted
o_proj columns describe the output exactly, it loads with trust_remote_code, it is closer to the
source than `mean`, and bad calibration options fail before anything is written."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

CALIB = ["--calib-data", "embedded:train", "--calib-tokens", "2048", "--calib-seq-len", "64"]
KV, HEADS, D = 4, 8, 8


@pytest.fixture
def convert(cli):
    """`skipv1 convert SRC DST --quiet ARGS`, which must succeed; returns DST."""

    def _convert(src, dst, *args):
        result = cli("convert", src, dst, "--quiet", *args)
        assert result.exit_code == 0, result.output
        return dst

    return _convert


def heads(t, order, d=D, dim=0):
    return torch.cat([t.narrow(dim, h * d, d) for h in order], dim=dim)


@pytest.fixture
def source(checkpoint):
    return checkpoint(
        "src",
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        hidden_size=64,
        attention_bias=True,
    )


@pytest.mark.slow
def test_calibrated_output_follows_the_recorded_order(source, tmp_path, convert):
    dst = convert(source, tmp_path / "cal", "--skip-heads", 2, "--init", "calibrated", *CALIB)
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["calibration"]["tokens"] == 2048
    src, out = load_file(source / "model.safetensors"), load_file(dst / "model.safetensors")
    group = HEADS // KV
    for i in (1, 2):
        order = record["calibration"]["layers"][str(i)]["order"]
        assert sorted(order) == list(range(KV))
        p = f"model.layers.{i}.self_attn."
        q_order = [h * group + r for h in order for r in range(group)]
        assert torch.equal(out[p + "q_proj.weight"], heads(src[p + "q_proj.weight"], q_order))
        assert torch.equal(out[p + "k_proj.bias"], heads(src[p + "k_proj.bias"], order))
        assert torch.equal(out[p + "v_proj.weight"], heads(src[p + "v_proj.weight"], order[:2]))
        own_cols = q_order[: 2 * group]
        assert torch.equal(
            out[p + "o_proj.weight"][:, : 2 * group * D],
            heads(src[p + "o_proj.weight"], own_cols, dim=1),
        )
    # Layer 0 and everything outside attention are copied.
    assert torch.equal(
        out["model.layers.0.self_attn.v_proj.weight"], src["model.layers.0.self_attn.v_proj.weight"]
    )
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)
    assert model.model.layers[1].self_attn.v_proj.weight.shape == (2 * D, 64)


@pytest.mark.slow
def test_a_calibration_text_shorter_than_asked_is_used_whole_and_recorded_so(
    source, tmp_path, convert
):
    text = tmp_path / "short.jsonl"
    text.write_text("".join(f'{{"text": "Line {i} of a short text."}}\n' for i in range(40)))
    args = ["--calib-data", text, "--calib-tokens", "100000", "--calib-seq-len", "64"]
    dst = convert(source, tmp_path / "cal", "--skip-heads", 2, "--init", "calibrated", *args)
    record = json.loads((dst / "skipv1_conversion.json").read_text())["calibration"]
    assert record["tokens_asked"] == 100000
    assert 0 < record["tokens"] < 100000 and record["tokens"] % 64 == 0
    full = json.loads(
        (
            convert(source, tmp_path / "full", "--init", "calibrated", *CALIB)
            / "skipv1_conversion.json"
        ).read_text()
    )["calibration"]
    assert full["tokens"] == 2048 and "tokens_asked" not in full


@pytest.mark.slow
def test_calibrated_is_closer_to_the_source_than_mean(source, tmp_path, convert):
    ids = torch.randint(0, 320, (4, 48), generator=torch.Generator().manual_seed(0))
    src_model = AutoModelForCausalLM.from_pretrained(source).eval()
    errors = {}
    for init in ("mean", "calibrated"):
        dst = convert(source, tmp_path / init, "--skip-heads", 2, "--init", init, *CALIB)
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        with torch.no_grad():
            errors[init] = (model(ids).logits - src_model(ids).logits).pow(2).mean().item()
    assert errors["calibrated"] < errors["mean"], errors


@pytest.mark.parametrize(
    "args, message",
    [
        (["--calib-tokens", "0"], "--calib-tokens 0 must be a positive number"),
        (["--calib-tokens", "32", "--calib-seq-len", "64"], "less than one sequence"),
        (["--calib-data", "/nonexistent/*.txt"], "no data files match"),
    ],
)
def test_bad_calibration_options_exit_2_and_write_nothing(source, tmp_path, args, message, cli):
    dst = tmp_path / "out"
    result = cli("convert", source, dst, "--init", "calibrated", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not dst.exists()
