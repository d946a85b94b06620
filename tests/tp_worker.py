"""Run by tests/test_tensor_parallel.py under torchrun: loads a checkpoint with tp_plan="auto"
and writes rank 0's logits and greedy tokens (JSON) for the test to compare with one process."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM

import skipv1  # noqa: F401  (registers the SkipV1 classes)

checkpoint, ids_file, out_file = sys.argv[1:4]
ids = torch.tensor(json.loads(open(ids_file).read()))
model = AutoModelForCausalLM.from_pretrained(checkpoint, tp_plan="auto").eval()
with torch.no_grad():
    logits = model(ids).logits
    tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
attention = model.model.layers[1].self_attn
k_proj = attention.k_proj.weight
local_k_rows = (k_proj.to_local() if hasattr(k_proj, "to_local") else k_proj).shape[0]
if torch.distributed.get_rank() == 0:
    with open(out_file, "w") as f:
        result = {"logits": logits.tolist(), "tokens": tokens.tolist()}
        json.dump({**result, "tp_size": attention.tp_size, "local_k_rows": local_k_rows}, f)
torch.distributed.destroy_process_group()
