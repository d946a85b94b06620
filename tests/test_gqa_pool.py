"""Mean-pooled GQA (the recovery experiment's outside anchor): pooling into groups of one head
is the identity, and pooling averages adjacent K/V heads."""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gqa_pool import pool_kv_tensor, write_pooled_gqa  # noqa: E402


def test_pooling_into_groups_of_one_head_reproduces_the_source(checkpoint, tmp_path):
    src = checkpoint("src")  # MHA: 4 heads, 4 KV heads
    dst = write_pooled_gqa(src, tmp_path / "gqa", new_kv_heads=4)
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(0))
    a = AutoModelForCausalLM.from_pretrained(src).eval()(input_ids=ids).logits
    b = AutoModelForCausalLM.from_pretrained(dst).eval()(input_ids=ids).logits
    assert torch.equal(a, b)


def test_pooling_averages_adjacent_heads_and_halves_the_kv_heads(checkpoint, tmp_path):
    src = checkpoint("src")
    dst = write_pooled_gqa(src, tmp_path / "gqa", new_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(dst)
    assert model.config.num_key_value_heads == 2
    source = AutoModelForCausalLM.from_pretrained(src).state_dict()
    v = source["model.layers.1.self_attn.v_proj.weight"]  # 4 heads of 16 rows
    expected = torch.cat([(v[0:16] + v[16:32]) / 2, (v[32:48] + v[48:64]) / 2])
    got = model.state_dict()["model.layers.1.self_attn.v_proj.weight"]
    assert torch.allclose(got, expected, atol=1e-7)
    bias = torch.arange(8.0)
    assert torch.equal(pool_kv_tensor(bias, 4, 2), torch.tensor([1.0, 2.0, 5.0, 6.0]))
