"""Tensor parallelism (`tp_plan="auto"`, 2 CPU ranks on gloo under torchrun) gives the
single-process logits and greedy tokens: Llama with MHA and GQA, with ranks that hold own and
borrowed value heads, borrowed heads only, or a mix, and every other family whose transformers
config has a tensor-parallel plan (GPT-2 has none: transformers refuses it). One torchrun spawn
loads every checkpoint (tests/tp_worker.py): starting the ranks is most of the time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import SKIPV1_FAMILIES, random_family_skipv1, random_skipv1, small_skipv1_config

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("tp_worker.py")
IDS = [[3, 9, 4, 7, 1, 8, 2, 6], [5, 5, 2, 9, 0, 1, 4, 3]]
LLAMA = {  # (heads, kv, s)
    "llama-gqa-mixed-ranks": (8, 4, 1),
    "llama-mha-one-rank-borrows-all": (8, 8, 4),
    "llama-mha-mixed-ranks": (4, 4, 1),
}
SHARDED = [*LLAMA, *(f for f in SKIPV1_FAMILIES if f != "gpt2")]


def build(case: str):
    if case in LLAMA:
        heads, kv, s = LLAMA[case]
        return random_skipv1(small_skipv1_config(heads=heads, kv=kv, s=s))
    return random_family_skipv1(case)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """{case: (the single-process model, logits, tokens), ...} and the ranks' results."""
    root = tmp_path_factory.mktemp("tp")
    ids = torch.tensor(IDS)
    expected = {}
    for case in [*SHARDED, "gpt2"]:
        model = build(case)
        model.save_pretrained(root / case)
        with torch.no_grad():
            logits = model(ids).logits
            tokens = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        expected[case] = (model, logits, tokens.tolist())
    (root / "ids.json").write_text(json.dumps(IDS))
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc-per-node", "2", str(WORKER), str(root / "ids.json")]
    cmd += [str(root / "out.json"), *(str(root / case) for case in expected)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((root / "out.json").read_text())
    return expected, {case: out[str(root / case)] for case in expected}


@pytest.mark.parametrize("case", SHARDED)
def test_tensor_parallel_matches_one_process(tp_run, case):
    expected, results = tp_run
    model, logits, tokens = expected[case]
    out = results[case]
    assert "error" not in out, out.get("error")
    # really sharded: rank 0 holds part of the parameters
    assert out["local_elements"] < sum(p.numel() for p in model.parameters())
    # a plan that shards the attention heads gives each attention module the value-heads style;
    # one that gathers q/k/v (Phi-3, OLMo-2, GPT-NeoX) computes every head on every rank
    splits_heads = "layers.*.self_attn" in model.config.base_model_tp_plan
    assert out["tp_sizes"] == [2 if splits_heads else 1]
    torch.testing.assert_close(torch.tensor(out["logits"]), logits, atol=1e-5, rtol=1e-5)
    assert out["tokens"] == tokens


def test_a_family_without_a_plan_is_refused_by_name(tp_run):
    _, results = tp_run
    assert "SkipV1GPT2ForCausalLM` has no `tp_plan`" in results["gpt2"].get("error", "")
