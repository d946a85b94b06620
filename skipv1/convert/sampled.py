"""`--calib-data sampled`: calibration text sampled from the source model itself.

Why: the calibrated inits fit the converted model to the source on calibration text, and a fit
on one domain transfers poorly to others (SmolLM2, docs/results/recovery_smollm2.md: calibrated
on CPython docs, +110% perplexity on the King James Bible; on GCIDE, +60%). Text the source
writes itself, sampled at temperature 1 with no truncation, follows the source's own
distribution, so the fit covers what the source models without anyone choosing a dataset
(on SmolLM2 at equal tokens: +47% on the KJV). A user who knows what they will serve does better
still with text of that domain.

The samples stay token ids (no decode and re-encode): each block is the start token followed by
`seq_len - 1` sampled tokens, end-of-text suppressed so every block is full. Seeded, so a
conversion is reproducible; the global RNG is restored afterwards.
"""

from pathlib import Path

import torch

from ..errors import SkipV1Error

SAMPLED = "sampled"
BATCH = 32  # sequences per generate() call: on 2 CPU cores ~160 tokens/s at 135M parameters


def is_sampled(calib_data) -> bool:
    return isinstance(calib_data, str) and calib_data.strip() == SAMPLED


def sampled_token_blocks(
    root: Path,
    tokenizer,
    tokens: int,
    seq_len: int,
    *,
    trust_remote_code: bool,
    device: str,
    progress=None,
    seed: int = 0,
) -> torch.Tensor:
    """(N, seq_len) token ids sampled from the model at `root`, N = tokens // seq_len (>= 1)."""
    start = tokenizer.bos_token_id
    if start is None:
        start = tokenizer.eos_token_id
    if start is None:
        raise SkipV1Error(
            f"--calib-data {SAMPLED} needs a start token, and the tokenizer at {root} has no BOS "
            "or EOS token: give calibration text instead (--calib-data FILE)"
        )
    model = _load_model(root, trust_remote_code, device)
    n = max(1, tokens // seq_len)
    task = progress.add_task("sampling calibration text", total=n) if progress else None
    blocks = []
    with torch.random.fork_rng(devices=[] if device == "cpu" else None), torch.no_grad():
        for first in range(0, n, BATCH):
            rows = min(BATCH, n - first)
            torch.manual_seed(seed + first)  # a batch's samples do not depend on BATCH's past
            ids = torch.full((rows, 1), start, dtype=torch.long, device=device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=seq_len - 1,
                min_new_tokens=seq_len - 1,
                pad_token_id=tokenizer.eos_token_id
                if tokenizer.eos_token_id is not None
                else start,
            )
            blocks.append(out.cpu())
            if task is not None:
                progress.advance(task, rows)
    del model
    return torch.cat(blocks)


def _load_model(root: Path, trust_remote_code: bool, device: str):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            root, dtype=torch.float32, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"--calib-data {SAMPLED} samples from the source, which failed to load with "
            f"transformers from {root} ({str(err).splitlines()[0]}): give calibration text "
            "instead (--calib-data FILE)"
        ) from None
    return model.to(device).eval()
