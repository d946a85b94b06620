"""The fused-projection families (Phi-3, GPT-NeoX, GPT-2) converted by `skipv1 convert` load
with `trust_remote_code=True` in a process without skipv1, from the modeling files saved next to
their weights, and compute what skipv1's own classes compute. One child process for the three
(its start-up is most of the time); each family's layout is checked by hand in its own module."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.factories import assert_all_load_without_skipv1, make_checkpoint, token_ids

FAMILIES = {  # source arch -> (extra source fields, SkipV1 class)
    "phi3": ({"num_key_value_heads": 2}, "SkipV1Phi3ForCausalLM"),
    "gpt_neox": ({}, "SkipV1GPTNeoXForCausalLM"),
    "gpt2": ({}, "SkipV1GPT2ForCausalLM"),
}


@pytest.mark.slow
def test_converted_fused_families_load_without_skipv1(tmp_path, cli):
    x = token_ids(vocab=320)
    cases = []
    for arch, (extra, class_name) in FAMILIES.items():
        src = make_checkpoint(tmp_path / arch, arch=arch, **extra)
        dst = tmp_path / f"{arch}-skipv1"
        result = cli("convert", src, dst, "--init", "mean", "--skip-heads", "1", "--quiet")
        assert result.exit_code == 0, result.output
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        assert type(model).__name__ == class_name
        with torch.no_grad():
            cases.append((dst, x, model(x).logits, class_name))
    assert_all_load_without_skipv1(cases, tmp_path)
