"""`--init reconstruct` (the default): layer-by-layer refit of attention on calibration text."""

import inspect
import json

import pytest
import torch
from factories import make_checkpoint, skipv1_config_of
from safetensors.torch import load_file
from test_calibrate import (
    KV,
    LAYERS,
    converted,
    logit_error,
    run_calibration,
    source_model,
    tokens,
)
from transformers import AutoModelForCausalLM

from skipv1.cli import demo
from skipv1.convert.command import convert as convert_command
from skipv1.convert.inits import DEFAULT_INIT
from skipv1.convert.options import ConvertOptions
from skipv1.convert.reconstruct import reconstruct
from skipv1.demo import DemoSettings
from skipv1.uptrain.recipe import ModelSection


def run_reconstruct(source, s, n=16):
    return run_calibration(source, s, n=n, fit=reconstruct)


@pytest.mark.slow
def test_reconstruct_beats_calibrated_on_held_out_inputs():
    source = source_model()
    held_out = tokens(8, seed=2)
    for s in (1, 2):
        calibrated = run_calibration(source, s, n=16)
        rebuilt = run_reconstruct(source, s, n=16)
        errors = {
            name: logit_error(converted(source, s, fit.transform), source, held_out)
            for name, fit in (("calibrated", calibrated), ("reconstruct", rebuilt))
        }
        assert errors["reconstruct"] < errors["calibrated"], (s, errors)
        for record in rebuilt.layers.values():
            assert sorted(record["order"]) == list(range(KV))
            assert record["error_out"] < 1.0


@pytest.mark.slow
def test_reconstruct_keeps_the_checkpoint_contract():
    source = source_model()
    rebuilt = run_reconstruct(source, 2)
    state = {k: rebuilt.transform(k, v) for k, v in source.state_dict().items()}
    src = source.state_dict()
    for name, tensor in state.items():
        if ".v_proj." in name and ".layers.0." not in name:
            assert tensor.shape[0] == src[name].shape[0] // KV * (KV - 2), name
        else:
            assert tensor.shape == src[name].shape, name
    # Layer 0, the norms, embeddings and the MLP's gate/up projections are the source's.
    for name in src:
        refitted = ".self_attn." in name or ".down_proj." in name
        if not refitted or ".layers.0." in name:
            assert torch.equal(state[name], src[name]), name
    model = converted(source, 2, rebuilt.transform)
    assert len(model.model.layers) == LAYERS


def test_the_default_init_is_the_same_everywhere():
    cli_default = inspect.signature(convert_command).parameters["init"].default
    api_default = ConvertOptions().init  # convert_checkpoint's options when none are given
    demo_default = inspect.signature(demo).parameters["init"].default
    assert DEFAULT_INIT == "reconstruct"
    assert {cli_default, api_default, demo_default, ModelSection().init} == {DEFAULT_INIT}
    assert (
        DemoSettings(
            out=".", tokens=1, skip_heads=1, nproc=1, seq_len=8, lr=1.0, eval_tokens=8
        ).init
        == DEFAULT_INIT
    )


@pytest.mark.slow
def test_convert_without_init_reconstructs_and_records_it(checkpoint, tmp_path, cli):
    src = checkpoint("src", num_attention_heads=8, num_key_value_heads=4, hidden_size=64)
    dst = tmp_path / "out"
    result = cli("convert", src, dst, "--quiet", "--calib-tokens", 2048, "--calib-seq-len", 64)
    assert result.exit_code == 0, result.output
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    assert record["init"] == "reconstruct"
    assert record["calibration"]["tokens"] == 2048
    layers = record["calibration"]["layers"]
    assert set(layers) == {"1", "2"} and all("error_out" in r for r in layers.values())
    assert record["calibration"]["method"].startswith("two-stream")
    out = load_file(dst / "model.safetensors")
    assert out["model.layers.1.self_attn.v_proj.weight"].shape == (2 * 8, 64)
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)
    assert model.config.skip_v_heads == 2


def test_default_init_without_a_tokenizer_is_refused_up_front(tmp_path, cli):
    src = make_checkpoint(tmp_path / "src")  # no tokenizer files
    dst = tmp_path / "out"
    result = cli("convert", src, dst, "--dry-run")
    assert result.exit_code == 2
    assert "needs the source's tokenizer" in result.stderr and "--init keep" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not dst.exists()


@pytest.mark.slow
def test_convert_records_the_distillation_and_changes_only_later_attention(
    checkpoint, tmp_path, cli
):
    src = checkpoint("src", num_attention_heads=8, num_key_value_heads=4, hidden_size=64)
    calib = ["--calib-tokens", "64", "--calib-seq-len", "64", "--quiet"]
    out = {}
    for steps in (0, 20):
        dst = tmp_path / f"steps{steps}"
        result = cli("convert", src, dst, "--calib-distill-steps", steps, *calib)
        assert result.exit_code == 0, result.output
        out[steps] = dst
    record = json.loads((out[20] / "skipv1_conversion.json").read_text())["calibration"]
    assert (
        "distill" not in json.loads((out[0] / "skipv1_conversion.json").read_text())["calibration"]
    )
    assert record["distill"]["steps"] == 20
    assert record["distill"]["held_out_kl"] <= record["distill"]["held_out_kl_before"]
    plain, distilled = (
        load_file(out[0] / "model.safetensors"),
        load_file(out[20] / "model.safetensors"),
    )
    for name in plain:  # only the later layers' attention may change
        if ".self_attn." not in name or ".layers.0." in name:
            assert torch.equal(plain[name], distilled[name]), name
    model = AutoModelForCausalLM.from_pretrained(out[20], trust_remote_code=True)
    assert model.config.skip_v_heads == 2


@pytest.mark.slow
def test_distillation_lowers_the_kl_it_scores():
    from test_calibrate import mean_transform

    from skipv1.convert.distill_attention import distill_attention

    source = source_model()
    ids = tokens(1, seed=1)  # one sequence: scored on itself, so the KL must fall
    tensors, record = distill_attention(
        skipv1_config_of(source.config, 0), source.state_dict(), mean_transform(2), ids, 2, steps=20
    )
    assert record["held_out_kl"] < 0.8 * record["held_out_kl_before"], record
    assert all(".self_attn." in n and ".layers.0." not in n for n in tensors)
    assert tensors["model.layers.1.self_attn.v_proj.weight"].shape[0] == (KV - 2) * 8


def test_bad_distill_steps_are_refused_before_anything_is_written(checkpoint, tmp_path, cli):
    src = checkpoint("src")
    result = cli("convert", src, tmp_path / "out", "--calib-distill-steps", "-1")
    assert result.exit_code == 2 and "--calib-distill-steps -1" in result.stderr
    assert not (tmp_path / "out").exists()
