"""Calibrated conversion: head choice + least-squares refit of the borrowed heads' o_proj."""

import pytest
import torch
from factories import llama_config_of, skipv1_config_of, small_skipv1_config
from transformers import LlamaForCausalLM

from skipv1 import SkipV1LlamaForCausalLM
from skipv1.convert import calibrate as calibrate_module
from skipv1.convert.calibrate import Calibration, LayerFit, calibrate
from skipv1.convert.inits.mean import init_mean

HEADS, KV, D, LAYERS = 8, 4, 8, 3


def source_model(seed=0) -> LlamaForCausalLM:
    """A stock Llama of the SkipV1 model tests' shape (HEADS heads of D, KV KV heads)."""
    config = llama_config_of(
        small_skipv1_config(heads=HEADS, kv=KV, s=0, layers=LAYERS, head_dim=D)
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def converted(source, s, transform) -> SkipV1LlamaForCausalLM:
    model = SkipV1LlamaForCausalLM(skipv1_config_of(source.config, s)).eval()
    model.load_state_dict({k: transform(k, v) for k, v in source.state_dict().items()})
    return model


def tokens(n, seed):
    return torch.randint(0, 97, (n, 32), generator=torch.Generator().manual_seed(seed))


def run_calibration(source, s, n=16, fit=calibrate):
    """`fit` is any calibrated init's layer-by-layer pass (same signature)."""
    state = source.state_dict()
    return fit(
        skipv1_config_of(source.config, 0),
        lambda names: {k: state[k] for k in names},
        tokens(n, seed=1),
        skip_heads=s,
        batch_size=4,
    )


def mean_transform(s):
    def transform(name, tensor):
        if ".v_proj." in name and ".layers.0." not in name:
            return init_mean(tensor, KV, s)
        return tensor

    return transform


def logit_error(model, source, ids):
    with torch.no_grad():
        return (model(ids).logits - source(ids).logits).pow(2).mean().item()


@pytest.mark.slow
def test_calibrated_beats_mean_on_held_out_inputs():
    source = source_model()
    for s in (1, 2, 3):
        calibration = run_calibration(source, s)
        held_out = tokens(8, seed=2)
        calibrated = logit_error(converted(source, s, calibration.transform), source, held_out)
        mean = logit_error(converted(source, s, mean_transform(s)), source, held_out)
        assert calibrated < mean, (s, calibrated, mean)
        if s < KV // 2 + 1:  # with at least half the heads kept, the kept ones are exact
            assert calibrated < 0.5 * mean, (s, calibrated, mean)
        for fit in calibration.layers.values():
            assert sorted(fit.order) == list(range(KV))
            assert fit.error_fitted < fit.error_dropped


def test_calibrated_tensors_keep_the_checkpoint_contract():
    source = source_model()
    calibration = run_calibration(source, 2)
    state = {k: calibration.transform(k, v) for k, v in source.state_dict().items()}
    assert state["model.layers.0.self_attn.v_proj.weight"].shape == (KV * D, HEADS * D)
    for i in range(1, LAYERS):
        prefix = f"model.layers.{i}.self_attn."
        assert state[prefix + "v_proj.weight"].shape == ((KV - 2) * D, HEADS * D)
        assert state[prefix + "q_proj.weight"].shape == (HEADS * D, HEADS * D)
        assert state[prefix + "o_proj.weight"].shape == (HEADS * D, HEADS * D)
    # Kept heads carry their source value rows exactly.
    fit = calibration.layers[1]
    src_v = source.state_dict()["model.layers.1.self_attn.v_proj.weight"]
    for slot, head in enumerate(fit.order[: KV - 2]):
        new_v = state["model.layers.1.self_attn.v_proj.weight"]
        assert torch.equal(new_v[slot * D : (slot + 1) * D], src_v[head * D : (head + 1) * D])


def test_permuting_heads_before_the_drop_leaves_source_logits_unchanged():
    source = source_model()
    permuted = Calibration(HEADS, KV, D, skip_heads=0)
    rng = torch.Generator().manual_seed(3)
    for i in range(1, LAYERS):
        permuted.layers[i] = LayerFit(torch.randperm(KV, generator=rng).tolist(), {}, 0.0, 0.0)
    assert any(fit.order != list(range(KV)) for fit in permuted.layers.values())
    model = converted(source, 0, permuted.transform)
    ids = tokens(4, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, source(ids).logits, atol=1e-5, rtol=1e-5)


def test_cross_validated_ridge_generalises_better_on_little_calibration_data(monkeypatch):
    source = source_model()
    held_out = tokens(8, seed=2)
    few = run_calibration(source, 2, n=2)  # 64 tokens: an unregularised d x d fit overfits
    cross_validated = logit_error(converted(source, 2, few.transform), source, held_out)
    monkeypatch.setattr(calibrate_module, "RIDGE_GRID", (1e-6,))
    plain = run_calibration(source, 2, n=2)
    unregularised = logit_error(converted(source, 2, plain.transform), source, held_out)
    assert cross_validated < unregularised
    strengths = [r for fit in few.layers.values() for r in fit.ridge]
    assert len(strengths) == (LAYERS - 1) * 2 * (HEADS // KV) and max(strengths) > 1e-5
