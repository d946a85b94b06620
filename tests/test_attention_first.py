"""`optim.attention_first_fraction`: for the first share of the steps only the attention modules
train; afterwards every parameter follows the schedule."""

import pytest
import torch
from factories import random_skipv1, small_skipv1_config, token_ids

from skipv1.errors import SkipV1Error
from skipv1.uptrain.engine import make_optimizer
from skipv1.uptrain.recipe import load_recipe
from skipv1.uptrain.schedule import make_scheduler

BASE = ["model.path=x", "data.train=embedded", "budget.tokens=2000000", "optim.warmup_fraction=0"]


def _train(model, overrides: list[str], steps: int) -> list[dict]:
    """Plain optimizer steps (what the DeepSpeed engine calls); the weights after each."""
    o = load_recipe(None, BASE + overrides).optim
    optimizer = make_optimizer(
        model, load_recipe(None, BASE + overrides), torch.device("cpu"), False
    )
    scheduler = make_scheduler(
        optimizer, steps, o.warmup_fraction, o.min_lr_ratio, o.attention_first_fraction
    )
    ids = token_ids(2, 12)
    snapshots = []
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return snapshots


def _moved(before: dict, after: dict) -> set[str]:
    return {n for n in before if not torch.equal(before[n], after[n])}


def test_only_attention_trains_for_the_first_share_of_the_steps():
    model = random_skipv1(small_skipv1_config()).train()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    after = _train(model, ["optim.attention_first_fraction=0.5"], steps=4)
    attention = {n for n in start if ".self_attn." in n}
    assert attention and _moved(start, after[1]) == attention  # steps 0-1: attention only
    assert _moved(after[1], after[3]) == set(start)  # steps 2-3: everything


def test_without_it_every_parameter_trains_from_the_first_step():
    model = random_skipv1(small_skipv1_config()).train()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    after = _train(model, [], steps=1)
    assert _moved(start, after[0]) == set(start)


@pytest.mark.parametrize("value", ["1", "-0.1"])
def test_fraction_out_of_range_is_refused_by_name(value):
    with pytest.raises(SkipV1Error, match="optim.attention_first_fraction"):
        load_recipe(None, [*BASE, f"optim.attention_first_fraction={value}"])
