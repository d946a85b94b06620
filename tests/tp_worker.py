"""Run by tests/test_tensor_parallel.py under torchrun: loads each checkpoint named on the command
line with tp_plan="auto" and writes rank 0's logits, greedy tokens and the parameter elements it
holds (JSON, keyed by checkpoint) for the test to compare with one process. One spawn serves
several checkpoints: starting the ranks is most of the time."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM

import skipv1  # noqa: F401  (registers the SkipV1 classes)

ids_file, out_file, *checkpoints = sys.argv[1:]
ids = torch.tensor(json.loads(open(ids_file).read()))
results = {}
for checkpoint in checkpoints:
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, tp_plan="auto").eval()
    except Exception as error:  # the test checks a refusal's message
        results[checkpoint] = {"error": f"{type(error).__name__}: {error}"}
        continue
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    tp_sizes = {m.tp_size for m in model.modules() if hasattr(m, "own_value_heads")}
    results[checkpoint] = {
        "logits": logits.tolist(),
        "tokens": tokens.tolist(),
        "local_elements": local,  # fewer than one process's: really sharded
        "tp_sizes": sorted(tp_sizes),  # the attention modules' view of the mesh
    }
if torch.distributed.get_rank() == 0:
    with open(out_file, "w") as f:
        json.dump(results, f)
torch.distributed.destroy_process_group()
