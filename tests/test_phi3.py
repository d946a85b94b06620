"""The Phi-3 family's own cases, from a tiny random Phi3ForCausalLM with grouped KV heads: the
fused `qkv_proj` sized in KV heads, the Llama view the calibrated inits run (fused `qkv_proj`
[q | k | v] and `gate_up_proj` cut), every init. What Phi-3 shares with GPT-2 and GPT-NeoX (s = 0
is the stock model, the cache paths and bytes, convert --init keep against a hand-computed split,
inspect) is in test_fused_families.py; the calibrated inits on a partial-rotary Phi-3 in
test_fused_calibrated.py, its sliding window in test_family_windows.py."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skipv1 import SkipV1LlamaForCausalLM, SkipV1Phi3Config, SkipV1Phi3ForCausalLM
from skipv1.convert.fused import LlamaView
from skipv1.convert.plan import SourceModel
from tests.factories import make_checkpoint, token_ids

VOCAB = 97
# 4 query heads over 2 KV heads: s counts KV heads, so s = 1 takes one of two value heads
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=3,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    pad_token_id=0,
    eos_token_id=0,
    bos_token_id=0,
)
D = 8  # head_dim = 32 / 4


def skipv1_model(s: int, attn="sdpa") -> SkipV1Phi3ForCausalLM:
    torch.manual_seed(0)
    config = SkipV1Phi3Config(**SHAPE, skip_v_heads=s)
    config._attn_implementation = attn
    return SkipV1Phi3ForCausalLM(config).eval()


def test_gqa_head_counting_sizes_the_fused_projection_in_kv_heads():
    model = skipv1_model(1)
    rows = [layer.self_attn.qkv_proj.weight.shape[0] for layer in model.model.layers]
    # q: 4 heads, k: 2 KV heads, v: 2 in layer 0, 2 - s = 1 afterwards
    assert rows == [(4 + 2 + 2) * D, (4 + 2 + 1) * D, (4 + 2 + 1) * D]
    with pytest.raises(Exception, match="skip_v_heads=2 is out of range"):
        SkipV1Phi3Config(**SHAPE, skip_v_heads=2)


# --- convert ----------------------------------------------------------------------------------


@pytest.fixture
def phi3_src(tmp_path, tokenizer_dir) -> Path:
    return make_checkpoint(
        tmp_path / "src", arch="phi3", tokenizer_dir=tokenizer_dir, num_key_value_heads=2
    )


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            }
        },
    ],
    ids=["full-rotary", "partial-rotary"],
)
def test_llama_view_of_phi3_computes_the_same_function(fields, tmp_path):
    """The calibrated inits run the Llama a Phi-3 computes, from its fused tensors cut by hand:
    the q/k/v rows, the gate/up halves, RoPE over half of each head where Phi-3 rotates that
    (reconstruct's distillation runs this whole model); s = 0 must give the Phi-3's logits."""
    phi3_src = make_checkpoint(tmp_path / "src", arch="phi3", num_key_value_heads=2, **fields)
    source = AutoModelForCausalLM.from_pretrained(phi3_src).eval()
    state = source.state_dict()
    view = LlamaView(SourceModel.from_config(read_config(phi3_src)))
    names = view.names(list(state))
    tensors = view.loader(lambda wanted: {n: state[n] for n in wanted})(names)
    qkv = state["model.layers.1.self_attn.qkv_proj.weight"]  # 4 q, 2 kv heads of 16 rows
    assert torch.equal(tensors["model.layers.1.self_attn.q_proj.weight"], qkv[:64])
    assert torch.equal(tensors["model.layers.1.self_attn.k_proj.weight"], qkv[64:96])
    assert torch.equal(tensors["model.layers.1.self_attn.v_proj.weight"], qkv[96:])
    gate_up = state["model.layers.1.mlp.gate_up_proj.weight"]
    assert torch.equal(tensors["model.layers.1.mlp.up_proj.weight"], gate_up[128:])
    llama = SkipV1LlamaForCausalLM(view.config(read_config(phi3_src))).eval()
    llama.load_state_dict(tensors)
    x = token_ids(vocab=320)
    with torch.no_grad():
        torch.testing.assert_close(llama(x).logits, source(x).logits, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_every_init_converts_phi3_and_the_fitted_ones_are_closest(phi3_src, tmp_path, cli):
    """mean, calibrated and the default (reconstruct, here without its distillation stage, and
    with it for a few steps): the fitted inits follow the source more closely."""
    calib = ["--calib-data", "embedded:train", "--calib-tokens", "1024", "--calib-seq-len", "64"]
    tokens = token_ids(batch=4, length=48, seed=3, vocab=320)
    source = AutoModelForCausalLM.from_pretrained(phi3_src).eval()
    runs = {
        "mean": ["--init", "mean"],
        "calibrated": ["--init", "calibrated", *calib],
        "reconstruct": [*calib, "--calib-distill-steps", "0"],  # the default init
        "distilled": [*calib, "--calib-distill-steps", "4"],
    }
    errors = {}
    for label, args in runs.items():
        dst = tmp_path / label
        result = cli("convert", phi3_src, dst, "--skip-heads", "1", "--quiet", *args)
        assert result.exit_code == 0, result.output
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model) is SkipV1Phi3ForCausalLM
        with torch.no_grad():
            errors[label] = (model(tokens).logits - source(tokens).logits).pow(2).mean().item()
    record = json.loads((tmp_path / "distilled" / "skipv1_conversion.json").read_text())
    assert record["init"] == "reconstruct" and record["calibration"]["distill"]["steps"] == 4
    assert errors["distilled"] <= errors["reconstruct"] < errors["calibrated"] < errors["mean"]
