"""Tensor parallelism (`tp_plan="auto"`, 2 CPU ranks on gloo under torchrun) gives the
single-process logits and greedy tokens: MHA and GQA, with ranks that hold own and borrowed
value heads, borrowed heads only, or a mix."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import random_skipv1, small_skipv1_config

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("tp_worker.py")
IDS = [[3, 9, 4, 7, 1, 8, 2, 6], [5, 5, 2, 9, 0, 1, 4, 3]]


@pytest.mark.parametrize(
    "heads,kv,s",
    [(8, 4, 1), (8, 8, 4), (4, 4, 1)],
    ids=["gqa-mixed-ranks", "mha-one-rank-borrows-all", "mha-mixed-ranks"],
)
def test_tensor_parallel_matches_one_process(tmp_path, heads, kv, s):
    model = random_skipv1(small_skipv1_config(heads=heads, kv=kv, s=s))
    model.save_pretrained(tmp_path / "model")
    ids = torch.tensor(IDS)
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
    (tmp_path / "ids.json").write_text(json.dumps(IDS))
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc-per-node", "2", str(WORKER), str(tmp_path / "model")]
    cmd += [str(tmp_path / "ids.json"), str(tmp_path / "out.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["tp_size"] == 2 and out["local_k_rows"] == kv // 2 * 8  # really sharded
    torch.testing.assert_close(torch.tensor(out["logits"]), logits, atol=1e-5, rtol=1e-5)
    assert out["tokens"] == tokens.tolist()
