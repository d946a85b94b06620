"""Learning-rate schedule: linear warmup, then cosine decay to `min_lr_ratio` of the peak.

Ours, not transformers', because none of transformers' (5.24) cosine schedules gives these values
(tests/test_uptrain_recipe.py compares them step by step; T steps, W warmup, min ratio 0.1):
- `get_cosine_with_min_lr_schedule_with_warmup(W, T - 1, min_lr_rate)` has the same cosine (to
  1e-12), but its warmup is step / W: step 0 trains at lr 0 and every warmup step is 1/W lower
  (0.1 for W = 10), the peak coming one step late. With `num_training_steps=T` the cosine also
  ends above the minimum (0.10027 instead of 0.1 for T = 100, W = 10).
- `get_cosine_with_min_lr_schedule_with_warmup_lr_rate(W, T, min_lr_rate)` has our warmup
  ((step + 1) / W), but its cosine starts one step earlier: step W is already 0.99973 instead of
  1.0, and the curves differ by up to 0.0091 (step 41 for T = 100, W = 10).
Resumed runs also depend on the formula staying put: a LambdaLR checkpoint saves the step, not
the lambda, so a changed formula would move the learning rate of a run resumed mid-way.
"""

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


def make_scheduler(
    optimizer,
    total_steps: int,
    warmup_fraction: float,
    min_lr_ratio: float,
    attention_first_fraction: float = 0.0,
):
    """A LambdaLR: DeepSpeed steps it once per optimizer step and saves it in checkpoints. With
    `attention_first_fraction`, the groups after the first two (the attention parameters' decay
    and no-decay groups, see engine.make_optimizer) stay at lr 0 for that share of the steps;
    their Adam moments keep accumulating, so they join without a cold start."""
    from torch.optim.lr_scheduler import LambdaLR

    warmup = warmup_steps(total_steps, warmup_fraction)

    def schedule(step: int) -> float:
        return lr_multiplier(step, total_steps, warmup, min_lr_ratio)

    if not attention_first_fraction:
        return LambdaLR(optimizer, schedule)
    held = round(total_steps * attention_first_fraction)

    def held_schedule(step: int) -> float:
        return 0.0 if step < held else schedule(step)

    lambdas = [schedule, schedule] + [held_schedule] * (len(optimizer.param_groups) - 2)
    return LambdaLR(optimizer, lambdas)
