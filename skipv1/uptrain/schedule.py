"""Learning-rate schedule: linear warmup, then cosine decay to `min_lr_ratio` of the peak."""

import math


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based). Warmup reaches the peak on
    its last step; the cosine reaches `min_lr_ratio` on the last training step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_steps(total_steps: int, warmup_fraction: float) -> int:
    return round(total_steps * warmup_fraction)


def make_scheduler(optimizer, total_steps: int, warmup_fraction: float, min_lr_ratio: float):
    """A LambdaLR: DeepSpeed steps it once per optimizer step and saves it in checkpoints."""
    from torch.optim.lr_scheduler import LambdaLR

    warmup = warmup_steps(total_steps, warmup_fraction)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, warmup, min_lr_ratio))
