"""Distillation in uptraining: the loss itself, the frozen teacher, recipe errors, and one real
2-rank DeepSpeed run with `distill.teacher` set (in test_uptrain_deepspeed.py)."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from factories import make_checkpoint, tiny_config
from test_uptrain_deepspeed import STEPS, finish, uptrain, workdir  # noqa: F401 (fixture)
from transformers import LlamaForCausalLM

from skipv1.errors import SkipV1Error
from skipv1.uptrain.distill import alpha_at, distillation_loss, hidden_state_loss
from skipv1.uptrain.engine import DistEnv
from skipv1.uptrain.metrics import read_metrics
from skipv1.uptrain.recipe import load_recipe
from skipv1.uptrain.teacher import resolve_teacher
from skipv1.uptrain.trainer import UptrainRecipe


def logits_and_ids(seed: int = 0, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 9, vocab, generator=g) * 3, torch.randint(0, vocab, (2, 9), generator=g)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_loss_is_zero_when_student_equals_teacher(temperature):
    logits, ids = logits_and_ids()
    out = distillation_loss(logits, logits.clone(), ids, alpha=1.0, temperature=temperature)
    # zero up to float32 rounding: the teacher's log-probs are x - logsumexp(x), the student's
    # log_softmax(x) (4e-8 of KL on this AMD CPU), and the loss is T^2 times the KL
    assert abs(out.kl.item()) < 1e-6 and abs(out.loss.item()) < temperature**2 * 1e-6


def test_alpha_0_is_exactly_cross_entropy():
    logits, ids = logits_and_ids()
    teacher, _ = logits_and_ids(seed=1)
    out = distillation_loss(logits, teacher, ids, alpha=0.0, temperature=1.0)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1))
    assert torch.equal(out.loss, expected) and out.kl > 0


def test_kl_term_matches_its_definition():
    s, ids = logits_and_ids()
    t, _ = logits_and_ids(seed=1)
    out = distillation_loss(s, t, ids, alpha=0.3, temperature=2.0)
    p = F.softmax(t[:, :-1] / 2, -1)
    kl = (p * (p.log() - F.log_softmax(s[:, :-1] / 2, -1))).sum(-1).mean()
    assert torch.allclose(out.kl, kl, atol=1e-6)
    assert torch.allclose(out.loss, 0.7 * out.ce + 0.3 * 4 * kl, atol=1e-6)


def micro_step_trainer(tmp_path, *overrides, student=None):
    """The trainer's own teacher loading and micro-step, with the engine replaced by the bare
    student (DeepSpeed's forward/backward do the same on one process)."""
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config()).save_pretrained(tmp_path / "teacher")
    recipe = load_recipe(
        None,
        [
            f"model.path={tmp_path}",
            "data.train=embedded",
            "data.seq_len=16",
            "budget.tokens=16",
            "batch.global_batch_tokens=16",
            f"distill.teacher={tmp_path / 'teacher'}",
            *overrides,
        ],
    )
    trainer = UptrainRecipe.__new__(UptrainRecipe)
    trainer.recipe, trainer.env = recipe, DistEnv(0, 1, 0, torch.device("cpu"))
    trainer.model_config = tiny_config().to_dict()
    trainer.run_dir = tmp_path
    trainer.teacher_dir = trainer._teacher_dir()
    trainer.teacher = trainer._load_teacher()
    student = (student or LlamaForCausalLM(tiny_config())).train()
    student.backward = lambda loss: loss.backward()  # what the engine's backward amounts to
    trainer.engine = student
    return trainer, student


def test_gradient_flows_only_to_the_student(tmp_path):
    trainer, student = micro_step_trainer(tmp_path)
    ids = torch.randint(0, 320, (2, 16))
    loss, kl = trainer._micro_step(ids)
    assert math.isfinite(loss.item()) and kl.item() > 0
    assert not trainer.teacher.training
    assert all(not p.requires_grad and p.grad is None for p in trainer.teacher.parameters())
    assert all(p.grad is not None for p in student.parameters())


def test_the_hidden_state_term_is_zero_for_the_teacher_and_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    teacher = tuple(torch.randn(2, 5, 8, generator=g) * (1 + k) for k in range(4))
    assert hidden_state_loss(tuple(t.clone() for t in teacher), teacher).item() == 0
    student = tuple(t + torch.randn(t.shape, generator=g) for t in teacher)
    pairs = list(zip(student, teacher, strict=True))[1:]  # the embeddings are not a layer's
    want = torch.stack([(((s - t) ** 2).sum(-1) / (t**2).sum(-1)).mean() for s, t in pairs]).mean()
    torch.testing.assert_close(hidden_state_loss(student, teacher), want)


def test_the_micro_step_adds_the_hidden_state_term_only_off_the_teacher(tmp_path):
    ids = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(3))
    trainer, student = micro_step_trainer(tmp_path, "distill.hidden=1", "distill.alpha=1")
    twin = copy.deepcopy(trainer.teacher).requires_grad_(True)  # its dtype (the recipe's)
    trainer.engine = twin.train()
    twin.backward = lambda loss: loss.backward()
    loss, kl = trainer._micro_step(ids)  # the student is the teacher: KL and hidden term 0
    assert abs(loss.item()) < 1e-6 and abs(kl.item()) < 1e-6
    trainer.engine = student
    with_hidden, kl = trainer._micro_step(ids)
    plain, _ = micro_step_trainer(tmp_path / "plain", "distill.alpha=1", student=student)
    without, _ = plain._micro_step(ids)
    assert with_hidden.item() > without.item() + 1e-3 and torch.allclose(kl, without)


@pytest.mark.parametrize(
    "override, message",
    [
        ("distill.alpha=1.5", "`distill.alpha` is 1.5: it must be in [0, 1]"),
        ("distill.temperature=0", "`distill.temperature` is 0.0: it must be positive"),
        ("distill.alpha_end=-1", "`distill.alpha_end` is -1: it must be in [0, 1]"),
        ("distill.teacher=/nonexistent/teacher", "`distill.teacher` /nonexistent/teacher is not"),
        ("distill.hidden=-1", "`distill.hidden` is -1"),
        ("distill.hidden=1", "`distill.hidden` needs `distill.teacher`"),
    ],
)
def test_bad_distill_settings_are_recipe_errors(workdir, override, message):  # noqa: F811
    with pytest.raises(SkipV1Error) as err:
        load_recipe(workdir / "recipe.yaml", [override])
    assert str(err.value).startswith(message)


@pytest.mark.smollm2  # dequantizes SmolLM2's GGUF (~20 s)
def test_a_teacher_is_named_as_convert_names_a_source(workdir, tmp_path):  # noqa: F811
    """`distill.teacher` takes a built-in name or a .gguf file (staged once into RUN_DIR/teacher,
    then reused) and a Hub id (offline and uncached: the Hub's one-line error)."""
    from skipv1.smollm2 import smollm2_gguf_path

    recipe = load_recipe(workdir / "recipe.yaml", ["distill.teacher=builtin:smollm2"])
    staged = resolve_teacher(recipe, tmp_path)
    assert staged == tmp_path / "teacher"
    assert json.loads((staged / "config.json").read_text())["num_hidden_layers"] == 30
    written = (staged / "config.json").stat().st_mtime_ns
    recipe = load_recipe(workdir / "recipe.yaml", [f"distill.teacher={smollm2_gguf_path()}"])
    assert resolve_teacher(recipe, tmp_path) == staged
    assert (staged / "config.json").stat().st_mtime_ns == written  # not staged again
    recipe = load_recipe(workdir / "recipe.yaml", ["distill.teacher=no-such-user/no-such-model"])
    with pytest.raises(SkipV1Error, match="could not be fetched from the Hub"):
        resolve_teacher(recipe, tmp_path / "other")


@pytest.mark.slow  # a child process: ~8 s of imports
def test_bad_distill_setting_exits_2_with_one_line(workdir, cli):  # noqa: F811
    result = cli.process("uptrain", workdir / "recipe.yaml", "distill.alpha=-0.1", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: `distill.alpha` is -0.1: it must be in [0, 1]"
    ]


# The real two-rank ZeRO-3 run with a teacher shares test_uptrain_deepspeed.py's ZeRO-3 run:
# test_zero3_run_with_a_teacher_logs_distill_kl.


def test_the_alpha_schedule_runs_from_alpha_to_alpha_end():
    steps = [alpha_at(0.9, 0.1, k, 5) for k in range(5)]
    assert steps[0] == 0.9 and steps[-1] == pytest.approx(0.1)
    assert steps == sorted(steps, reverse=True)
    assert steps[2] == pytest.approx(0.5)  # linear
    assert alpha_at(0.9, None, 3, 5) == 0.9  # no schedule: constant


@pytest.mark.slow  # a child process
@pytest.mark.distributed
def test_a_scheduled_run_trains_with_alpha_then_alpha_end(workdir, tokenizer_dir):  # noqa: F811
    """A real one-rank run with a teacher and alpha 1 -> 0: metrics.jsonl records each step's
    weight, 1 on the first step and 0 on the last, linear between."""
    teacher = make_checkpoint(workdir / "alpha-teacher", tokenizer_dir=tokenizer_dir)
    overrides = [f"distill.teacher={teacher}", "distill.alpha=1", "distill.alpha_end=0"]
    finish(uptrain(workdir, "alpha-run", *overrides, "deepspeed.zero_stage=0", nproc=1))
    records = [r for r in read_metrics(workdir / "alpha-run") if "loss" in r]
    alphas = [r["distill_alpha"] for r in records]
    assert alphas == pytest.approx([1 - k / (STEPS - 1) for k in range(STEPS)])
    assert all(r["distill_kl"] > 0 for r in records)
