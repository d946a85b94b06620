"""`skipv1 convert --calib-data sampled`: calibration text sampled from the source itself. The
samples are full blocks that start with the start token, reproducible from their seed, leave the
caller's RNG as it was, and a conversion on them is recorded and repeatable."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from skipv1.convert.sampled import sampled_token_blocks

ARGS = ["--calib-data", "sampled", "--calib-tokens", "1024", "--calib-seq-len", "64"]


@pytest.fixture
def source(checkpoint):
    return checkpoint("src", num_attention_heads=4, num_key_value_heads=2, hidden_size=32)


def blocks(source, seed=0, tokens=200, seq_len=16):
    tokenizer = AutoTokenizer.from_pretrained(source)
    return sampled_token_blocks(
        source, tokenizer, tokens, seq_len, trust_remote_code=False, device="cpu", seed=seed
    ), tokenizer


def test_samples_are_full_blocks_from_the_start_token(source):
    ids, tokenizer = blocks(source)
    assert ids.shape == (200 // 16, 16)
    assert (ids[:, 0] == tokenizer.bos_token_id).all()
    assert (ids[:, 1:] != tokenizer.eos_token_id).all()  # end of text suppressed: no padding
    assert len({tuple(row.tolist()) for row in ids}) == len(ids)  # sampled, not greedy


def test_samples_repeat_from_their_seed_and_leave_the_rng_alone(source):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first, _ = blocks(source, seed=0)
    assert torch.equal(torch.rand(3), expected_next)
    again, _ = blocks(source, seed=0)
    other, _ = blocks(source, seed=1)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.slow
def test_a_conversion_on_sampled_text_is_recorded_and_repeatable(source, tmp_path, cli):
    outs = []
    for name in ("a", "b"):
        dst = tmp_path / name
        result = cli("convert", source, dst, "--quiet", "--init", "calibrated", *ARGS)
        assert result.exit_code == 0, result.output
        outs.append(dst)
    record = json.loads((outs[0] / "skipv1_conversion.json").read_text())["calibration"]
    assert record["data"] == "sampled"
    assert record["tokens"] == 1024
    a, b = ((d / "model.safetensors").read_bytes() for d in outs)
    assert a == b
