"""Measured KV-cache bytes after generate() for a prompt, stock Llama vs SkipV1, on the
SmolLM2-135M shape (30 layers, 9 heads, 3 KV heads, head dim 64), bf16, random weights.

    python bench/kv_cache_bytes.py [--prompt-len 512] [--skip-heads 1]

Writes docs/results/kv_cache.md.
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from skipv1 import SkipV1LlamaConfig, SkipV1LlamaForCausalLM
from skipv1.modeling.layout import kv_layout

SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    tie_word_embeddings=True,
)


def cache_bytes(model, prompt_len: int) -> tuple[int, int]:
    prompt = torch.randint(0, SHAPE["vocab_size"], (1, prompt_len))
    out = model.generate(
        prompt, max_new_tokens=1, do_sample=False, pad_token_id=0, return_dict_in_generate=True
    )
    cache = out.cache
    return sum(
        layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
    ), cache.get_seq_length()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--skip-heads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, model in (
        ("LlamaForCausalLM (stock)", LlamaForCausalLM(LlamaConfig(**SHAPE))),
        (
            f"SkipV1LlamaForCausalLM s={args.skip_heads}",
            SkipV1LlamaForCausalLM(SkipV1LlamaConfig(skip_v_heads=args.skip_heads, **SHAPE)),
        ),
    ):
        model = model.to(torch.bfloat16).eval()
        measured, tokens = cache_bytes(model, args.prompt_len)
        formula = tokens * kv_layout(model.config).bytes_per_token(2)
        rows.append((name, tokens, measured, formula))
    base = rows[0][2]
    lines = [
        "# KV-cache bytes, measured after generate()",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        "SmolLM2-135M shape (30 layers, 9 heads, 3 KV heads, head dim 64), bf16, DynamicCache; "
        "bytes summed over `cache.layers[i].keys.nbytes + values.nbytes`.",
        "",
        "| model | cached tokens | measured bytes | formula bytes | vs stock |",
        "|---|---|---|---|---|",
    ]
    for name, tokens, measured, formula in rows:
        lines.append(f"| {name} | {tokens} | {measured:,} | {formula:,} | {measured / base:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path("docs/results/kv_cache.md").write_text(text)


if __name__ == "__main__":
    main()
