"""The GPT-NeoX family's own cases: its config refuses grouped KV heads; --init mean pools the
value rows interleaved per head in `query_key_value` (the calibrated inits, the default
included: test_fused_calibrated.py). What GPT-NeoX shares with GPT-2 and Phi-3 (s = 0 is the stock model with and without the
parallel residual, the cache paths and bytes, convert --init keep against a hand-computed
split, inspect) is in test_fused_families.py."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skipv1 import SkipV1GPTNeoXConfig
from tests.factories import make_checkpoint

SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=97,
    max_position_embeddings=128,
)


def test_config_refuses_grouped_kv_heads():
    with pytest.raises(Exception, match="multi-head attention only"):
        SkipV1GPTNeoXConfig(**SHAPE, num_key_value_heads=2)


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def neox_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(tmp_path / "src", arch="gpt_neox", tokenizer_dir=tokenizer_dir)


def test_convert_mean_pools_interleaved_value_rows(neox_src, tmp_path, cli):
    result = cli("convert", neox_src, tmp_path / "mean", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "mean")
    source = AutoModelForCausalLM.from_pretrained(neox_src)
    # own head j of a later layer = mean of source value heads (2j, 2j+1), by hand
    qkv = source.state_dict()["gpt_neox.layers.1.attention.query_key_value.weight"]
    heads = qkv.reshape(4, 3, 16, -1)
    values = heads[:, 2].reshape(2, 2, 16, -1).mean(1)
    got = model.state_dict()["gpt_neox.layers.1.attention.query_key_value.weight"]
    torch.testing.assert_close(got[:96].reshape(2, 3, 16, -1)[:, 2], values)
