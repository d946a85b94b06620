"""`--calib-data sampled`: calibration text sampled from the source model itself.

Why: the calibrated inits fit the converted model to the source on calibration text, and a fit
on one domain transfers poorly to others (SmolLM2, docs/results/recovery_smollm2.md: calibrated
on CPython docs, +110% perplexity on the King James Bible; on GCIDE, +60%). Text the source
writes itself, sampled at temperature 1 with no truncation, follows the source's own
distribution, so the fit covers what the source models without anyone choosing a dataset
(on SmolLM2 at equal tokens: +47% on the KJV). A user who knows what they will serve does better
still with text of that domain.

Each sample is the start token followed by `seq_len - 1` sampled tokens (end of text
suppressed, so none stops early), decoded to text; the calibration packs those documents as it
packs any text (packing.py). Not the raw token blocks: every one of those begins with the start
token, which real text at position 0 does not, and on SmolLM2 (131,072 tokens, s = 1) a
reconstruct fit on the raw blocks started uptraining at 35.2 KJV perplexity against 20.2 from the
same samples decoded and packed (docs/results/recovery_smollm2.md, arms H and I). Seeded, so a
conversion is reproducible; the global RNG is restored afterwards. The sampler is transformers'
own class for the source's model type, never code from the checkpoint (`--trust-remote-code`
lets convert read such a source, not run it).
"""

from pathlib import Path

import torch

from ..errors import SkipV1Error
from ..packing import encode_documents, eos_token_id

SAMPLED = "sampled"
BATCH = 32  # sequences per generate() call: on 2 CPU cores ~160 tokens/s at 135M parameters


def is_sampled(calib_data) -> bool:
    return isinstance(calib_data, str) and calib_data.strip() == SAMPLED


def sampled_documents(
    root: Path,
    tokenizer,
    tokens: int,
    seq_len: int,
    *,
    device: str,
    progress=None,
    seed: int = 0,
) -> list[str]:
    """Texts sampled from the model at `root`, each from `seq_len - 1` new tokens, until they
    pack into at least `tokens` tokens (packing.py: each document's ids and an EOS)."""
    start = tokenizer.bos_token_id
    if start is None:
        start = tokenizer.eos_token_id
    if start is None:
        raise SkipV1Error(
            f"--calib-data {SAMPLED} needs a start token, and the tokenizer at {root} has no BOS "
            "or EOS token: give calibration text instead (--calib-data FILE)"
        )
    eos = eos_token_id(tokenizer)
    model = _load_model(root, device)
    task = progress.add_task("sampling calibration text", total=tokens) if progress else None
    docs: list[str] = []
    packed = 0
    with torch.random.fork_rng(devices=[] if device == "cpu" else None), torch.no_grad():
        while packed < tokens:
            rows = min(BATCH, -(-(tokens - packed) // seq_len))
            torch.manual_seed(seed + len(docs))  # a batch's samples do not depend on BATCH's past
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
                pad_token_id=eos,
            )
            texts = tokenizer.batch_decode(out.cpu(), skip_special_tokens=True)
            added = sum(map(len, encode_documents(texts, tokenizer, eos)))
            docs += texts
            packed += added
            if task is not None:
                progress.advance(task, added)
    del model
    return docs


def _load_model(root: Path, device: str):
    from transformers import AutoModelForCausalLM

    try:  # in the checkpoint's own dtype: the memory serving it takes, not twice that
        model = AutoModelForCausalLM.from_pretrained(root, dtype="auto", trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise SkipV1Error(
            f"--calib-data {SAMPLED} samples from the source, which failed to load with "
            f"transformers from {root} ({str(err).splitlines()[0]}): give calibration text "
            "instead (--calib-data FILE)"
        ) from None
    return model.to(device).eval()
