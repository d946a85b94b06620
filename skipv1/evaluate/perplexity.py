"""Token-weighted perplexity over one token stream (packing.token_stream), in windows of
`ctx` tokens. stride == ctx: non-overlapping windows. stride < ctx: the usual Hugging Face sliding
window, where each window scores only the tokens the previous one did not, so every token is
scored once, with up to ctx - stride tokens of extra context."""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import SkipV1Error


@dataclass(frozen=True)
class Window:
    begin: int  # first input position
    end: int  # one past the last input position
    first_target: int  # first scored position; targets are first_target..end-1

    @property
    def targets(self) -> int:
        return self.end - self.first_target


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    mean_nll: float
    tokens: int  # scored tokens


def windows(num_tokens: int, ctx: int, stride: int) -> list[Window]:
    """The windows that score tokens 1..num_tokens-1 (token 0 has no context) exactly once."""
    out, prev_end = [], 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + ctx, num_tokens)
        first = max(prev_end, begin + 1)
        if first < end:
            out.append(Window(begin, end, first))
        prev_end = end
        if end == num_tokens:
            break
    return out


@torch.inference_mode()
def window_nll(model: torch.nn.Module, ids: torch.Tensor, batch: list[Window]) -> float:
    """Summed NLL of the targets of windows of equal length, in one forward pass."""
    device = next(model.parameters()).device
    inputs = torch.stack([ids[w.begin : w.end] for w in batch]).to(device)
    # Targets are a suffix of each window: only the logits that predict them are computed.
    keep = max(w.targets for w in batch) + 1
    logits = model(input_ids=inputs, logits_to_keep=keep).logits[:, :-1].float()
    total = 0.0
    for row, w in enumerate(batch):
        predicted = logits[row, keep - 1 - w.targets :]
        labels = inputs[row, w.first_target - w.begin :]
        total += F.cross_entropy(predicted, labels, reduction="sum").item()
    return total


def perplexity(
    model: torch.nn.Module,
    ids: torch.Tensor,
    ctx: int,
    stride: int | None = None,
    batch_size: int = 4,
    on_window: Callable[[int], None] | None = None,
) -> PerplexityResult:
    """exp(mean NLL) over every scored token; `on_window(n)` reports progress."""
    if ids.numel() < 2:
        raise SkipV1Error(
            f"the evaluation text has {ids.numel()} token(s): perplexity needs at least 2; "
            "give a data spec with more text"
        )
    plan = windows(ids.numel(), ctx, stride or ctx)
    nll, tokens = 0.0, 0
    for group in _batches(plan, batch_size):
        nll += window_nll(model, ids, group)
        tokens += sum(w.targets for w in group)
        if on_window:
            on_window(len(group))
    mean = nll / tokens
    return PerplexityResult(math.exp(mean), mean, tokens)


def _batches(plan: list[Window], size: int) -> Iterable[list[Window]]:
    """Consecutive windows of equal length, at most `size` at a time."""
    group: list[Window] = []
    for w in plan:
        if group and (len(group) == size or w.end - w.begin != group[0].end - group[0].begin):
            yield group
            group = []
        group.append(w)
    if group:
        yield group
