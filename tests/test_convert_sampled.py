"""`skipv1 convert --calib-data sampled`: calibration text sampled from the source itself. The
samples are documents of text that pack into the tokens asked, reproducible from their seed,
leave the caller's RNG as it was, and a conversion on them (convert's default calibration) is
recorded and repeatable."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from skipv1.convert.sampled import sampled_documents
from skipv1.packing import token_stream

SMALL = ["--calib-tokens", "1024", "--calib-seq-len", "64"]


@pytest.fixture
def source(checkpoint):
    return checkpoint("src", num_attention_heads=4, num_key_value_heads=2, hidden_size=32)


def blocks(source, seed=0, tokens=200, seq_len=16):
    tokenizer = AutoTokenizer.from_pretrained(source)
    return sampled_documents(source, tokenizer, tokens, seq_len, device="cpu", seed=seed), tokenizer


def test_samples_are_texts_that_pack_into_the_tokens_asked(source):
    docs, tokenizer = blocks(source)
    assert all(isinstance(d, str) for d in docs)
    packed = token_stream(docs, tokenizer)
    assert len(packed) >= 200
    assert tokenizer.bos_token not in "".join(docs)  # decoded without special tokens
    assert len(set(docs)) == len(docs)  # sampled, not greedy


def test_samples_repeat_from_their_seed_and_leave_the_rng_alone(source):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first, _ = blocks(source, seed=0)
    assert torch.equal(torch.rand(3), expected_next)
    again, _ = blocks(source, seed=0)
    other, _ = blocks(source, seed=1)
    assert first == again
    assert first != other


@pytest.mark.slow
def test_by_default_a_conversion_calibrates_on_sampled_text_recorded_and_repeatable(
    source, tmp_path, cli
):
    outs = []
    for name, data in (("a", []), ("b", ["--calib-data", "sampled"])):
        dst = tmp_path / name
        result = cli("convert", source, dst, "--quiet", "--init", "calibrated", *SMALL, *data)
        assert result.exit_code == 0, result.output
        outs.append(dst)
    record = json.loads((outs[0] / "skipv1_conversion.json").read_text())["calibration"]
    assert record["data"] == "sampled"
    assert record["tokens"] == 1024
    a, b = ((d / "model.safetensors").read_bytes() for d in outs)
    assert a == b


def test_sampling_never_runs_the_checkpoints_code(source, tmp_path, cli):
    # --trust-remote-code lets convert read a source whose config names custom code; the default
    # calibration samples with transformers' own class for the model type, so the code never runs
    marker = tmp_path / "ran"
    (source / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((source / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "custom.MyLlama"}
    (source / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "dst"
    args = ["--init", "calibrated", "--trust-remote-code", "--calib-tokens", "256"]
    result = cli("convert", source, dst, "--quiet", *args, "--calib-seq-len", "32")
    assert result.exit_code == 0, result.output
    assert not marker.exists()
    record = json.loads((dst / "skipv1_conversion.json").read_text())["calibration"]
    assert record["data"] == "sampled"
