"""The GPT-2 family's own cases, from a tiny random GPT2LMHeadModel: --init mean pools the value
columns of the Conv1D `c_attn` (the calibrated inits, the default included:
test_fused_calibrated.py); the Hub's original layout
(names without `transformer.`, saved causal masks). What GPT-2 shares with GPT-NeoX and Phi-3
(s = 0 is the stock model, the cache paths and bytes, convert --init keep, inspect) is in
test_fused_families.py."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.factories import make_checkpoint

# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def gpt2_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(tmp_path / "src", arch="gpt2", tokenizer_dir=tokenizer_dir)


def test_convert_mean_pools_value_columns(gpt2_src, tmp_path, cli):
    result = cli("convert", gpt2_src, tmp_path / "mean", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    source = AutoModelForCausalLM.from_pretrained(gpt2_src).state_dict()
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "mean").state_dict()
    weight = source["transformer.h.1.attn.c_attn.weight"]  # [64, 192]
    values = weight[:, 128:].reshape(64, 2, 2, 16).mean(2).reshape(64, 32)  # heads (0,1), (2,3)
    torch.testing.assert_close(got["transformer.h.1.attn.c_attn.weight"][:, 128:], values)
    assert torch.equal(got["transformer.h.1.attn.c_attn.weight"][:, :128], weight[:, :128])


def test_convert_reads_the_hubs_original_gpt2_layout(gpt2_src, tmp_path, cli):
    """The Hub's original GPT-2 checkpoints name tensors without `transformer.` and store each
    layer's causal mask (`h.{i}.attn.bias`): the masks are dropped, the names kept."""
    state = load_file(gpt2_src / "model.safetensors")
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    for i in range(3):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, 256, 256).tril()
    (gpt2_src / "model.safetensors").unlink()
    save_file(state, gpt2_src / "model.safetensors", metadata={"format": "pt"})
    dst = tmp_path / "dst"
    result = cli("convert", gpt2_src, dst, "--init", "keep", "--skip-heads", "2")
    assert result.exit_code == 0, result.output
    assert "dropped 3 recomputed buffer(s)" in result.output
    written = load_file(dst / "model.safetensors")
    assert written["h.1.attn.c_attn.weight"].shape == (64, 160)
    assert torch.equal(written["h.1.attn.c_attn.weight"], state["h.1.attn.c_attn.weight"][:, :160])
    assert not any(name.endswith(".attn.bias") for name in written)
    model = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert torch.equal(model.transformer.h[1].attn.c_attn.weight, written["h.1.attn.c_attn.weight"])
