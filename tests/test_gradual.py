"""Gradual conversion (model.gradual_fraction): starts exactly at the source's function, ends
exactly at the SkipV1 function, and the export is the plain SkipV1 checkpoint."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from factories import write_corpus
from transformers import AutoModelForCausalLM, AutoTokenizer

import skipv1  # noqa: F401  (registers the SkipV1 classes)
from skipv1.convert.api import convert_checkpoint
from skipv1.errors import SkipV1Error
from skipv1.uptrain.data import load_blocks
from skipv1.uptrain.gradual import GradualConversion
from skipv1.uptrain.metrics import read_metrics
from skipv1.uptrain.recipe import load_recipe


@pytest.fixture
def source_and_keep(checkpoint, tmp_path):
    src = checkpoint("src", num_key_value_heads=4)
    dst = tmp_path / "keep"
    convert_checkpoint(src, dst, skip_heads=2, init="keep", quiet=True)
    return src, dst


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("init", ["keep", "reconstruct"])
def test_mix_goes_from_the_source_function_to_the_skipv1_function(checkpoint, tmp_path, init):
    """keep changes only the borrowed values; reconstruct also permutes heads and refits o_proj
    and down_proj (and distils q/k/v/o), which the bridges undo at the start."""
    src = checkpoint("src", num_key_value_heads=4)
    converted = tmp_path / init
    convert_checkpoint(src, converted, skip_heads=2, init=init, quiet=True)
    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    student = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    gradual = GradualConversion(student, src, ramp_steps=4, model_dir=converted)
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(0))

    assert gradual.mix_at(0) == 0 and gradual.mix_at(2) == 0.5 and gradual.mix_at(9) == 1
    gradual.set_step(0)
    torch.testing.assert_close(logits(student, ids), logits(source, ids), rtol=0, atol=1e-5)
    assert not torch.allclose(logits(plain, ids), logits(source, ids), atol=1e-3)
    gradual.set_step(2)
    half = logits(student, ids)
    assert not torch.allclose(half, logits(source, ids), atol=1e-4)
    assert not torch.allclose(half, logits(plain, ids), atol=1e-4)
    gradual.set_step(4)
    assert torch.equal(logits(student, ids), logits(plain, ids))


def test_reconstruct_start_needs_its_head_order(checkpoint, tmp_path):
    """Without the conversion's record the bridges still start at the source, by larger
    differences (every permuted head's q/k rows); with it, q/k/v are not bridged at all."""
    src = checkpoint("src", num_key_value_heads=4)
    converted = tmp_path / "rec"
    convert_checkpoint(
        src, converted, skip_heads=2, init="reconstruct", calib_distill_steps=0, quiet=True
    )

    def bridged(model_dir):
        student = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
        gradual = GradualConversion(student, src, ramp_steps=2, model_dir=model_dir)
        return [sorted(blend.bridged) for blend in gradual.blends]

    assert set(map(tuple, bridged(converted))) == {("mlp.down_proj", "self_attn.o_proj")}
    assert any("self_attn.k_proj" in layer for layer in bridged(None))


def test_blend_rows_are_frozen_and_not_part_of_the_skipv1_weights(source_and_keep):
    src, keep = source_and_keep
    student = AutoModelForCausalLM.from_pretrained(keep, dtype=torch.float32)
    GradualConversion(student, src, ramp_steps=2)
    blend = [n for n, p in student.named_parameters() if ".value_blend." in n]
    assert blend and all(not p.requires_grad for n, p in student.named_parameters() if n in blend)
    # layers >= 1 only, the s = 2 borrowed heads' rows of the source's v_proj
    assert len(blend) == student.config.num_hidden_layers - 1
    head_dim = student.config.head_dim
    weight = dict(student.named_parameters())[blend[0]]
    assert weight.shape == (2 * head_dim, student.config.hidden_size)


@pytest.mark.distributed  # a DeepSpeed run in a child process
@pytest.mark.parametrize(
    "init, zero, ranks",
    [("keep", 0, 1), ("reconstruct", 3, 2)],  # ZeRO-3: the bridges read partitioned weights
)
def test_uptrain_with_gradual_conversion_exports_the_trained_skipv1_function(
    checkpoint, tmp_path, cli, init, zero, ranks
):
    src = checkpoint("src", num_key_value_heads=4)
    corpus = write_corpus(tmp_path)
    recipe = {
        "model": {
            "source": str(src),
            "init": init,
            "skip_heads": 2,
            "dtype": "float32",
            "gradual_fraction": 0.5,
        },
        "data": {
            "train": str(corpus / "train.jsonl"),
            "eval": str(corpus / "eval.jsonl"),
            "seq_len": 64,
        },
        "budget": {"tokens": 4 * 512},
        "batch": {"global_batch_tokens": 512, "micro_batch_size": 4},
        "optim": {"lr": 3e-3, "warmup_fraction": 0.0},
        "deepspeed": {"zero_stage": zero},
        "eval": {"every": 1, "blocks": 4},
        "log": {"progress": False, "tensorboard": False},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = cli.process(
        "uptrain", tmp_path / "r.yaml", "--run-dir", run, "--nproc", ranks, "--quiet", timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]

    records = read_metrics(run)
    assert [r["value_mix"] for r in records if "value_mix" in r] == [0, 0.5, 1, 1]
    evals = {r["step"]: r["eval_ppl"] for r in records if "eval_ppl" in r}
    tok = AutoTokenizer.from_pretrained(src)
    blocks = torch.from_numpy(load_blocks(str(corpus / "eval.jsonl"), tok, 64, "eval", 4))

    def ppl(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            return math.exp(model(input_ids=blocks, labels=blocks).loss.item())

    assert evals[0] == pytest.approx(ppl(src), rel=1e-5)  # step 0: the source's function
    export = run / "export"
    names = (
        json.loads((export / "model.safetensors.index.json").read_text())["weight_map"]
        if (export / "model.safetensors.index.json").is_file()
        else None
    )
    assert names is None or not any("value_blend" in n for n in names)
    assert json.loads((export / "config.json").read_text())["skip_v_heads"] == 2
    assert evals[4] == pytest.approx(ppl(export), rel=1e-5)  # the last step's function


def _recipe(tmp_path, **model) -> Path:
    raw = {"model": model, "data": {"train": "embedded"}, "budget": {"tokens": 10**7}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_recipe_refuses_gradual_conversion_it_cannot_start_from_the_source(checkpoint, tmp_path):
    src = str(checkpoint("src"))
    with pytest.raises(SkipV1Error, match="value rows"):
        load_recipe(_recipe(tmp_path, path=src, gradual_fraction=0.3))
    with pytest.raises(SkipV1Error, match="gradual_fraction` is 1.5"):
        load_recipe(_recipe(tmp_path, source=src, init="keep", gradual_fraction=1.5))
    assert load_recipe(_recipe(tmp_path, source=src, init="keep", gradual_fraction=0.3))
    assert load_recipe(_recipe(tmp_path, source=src, gradual_fraction=0.3))  # default init


def test_recipe_defaults_are_the_measured_best(tmp_path):
    """docs/results/recovery.md: reconstruct without gradual conversion; distillation is not
    worth its compute there, so no teacher unless the recipe names one."""
    recipe = load_recipe(_recipe(tmp_path, source="x"))
    assert recipe.model.init == "reconstruct"
    assert recipe.model.gradual_fraction == 0
    assert recipe.distill.teacher is None
