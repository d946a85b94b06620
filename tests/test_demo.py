"""`skipv1 demo`: the recipe it writes is valid, its options are documented, and a rerun with
other settings refuses to reuse finished steps."""

import json

import yaml

from skipv1.demo import DemoSettings, demo_recipe
from skipv1.uptrain.recipe import load_recipe


def settings(tmp_path, **overrides) -> DemoSettings:
    fields = dict(
        out=tmp_path / "demo-out",
        tokens=16384,
        skip_heads=1,
        nproc=2,
        seq_len=256,
        lr=3e-4,
        eval_tokens=4096,
    )
    return DemoSettings(**{**fields, **overrides})


def test_demo_recipe_passes_the_uptrain_schema(tmp_path):
    for nproc in (1, 2):
        path = tmp_path / f"recipe{nproc}.yaml"
        teacher = tmp_path / "teacher"
        teacher.mkdir(exist_ok=True)
        (teacher / "config.json").write_text("{}")
        path.write_text(
            yaml.safe_dump(demo_recipe(settings(tmp_path, nproc=nproc), tmp_path, teacher))
        )
        recipe = load_recipe(path)
        assert recipe.budget.tokens == 16384
        assert recipe.distill.teacher == str(teacher)
        per_step = recipe.batch.micro_batch_size * nproc * recipe.data.seq_len
        assert recipe.batch.global_batch_tokens % per_step == 0


def test_demo_help_explains_each_option(cli):
    result = cli("demo", "--help")
    assert result.exit_code == 0
    for option in ("--out", "--tokens", "--skip-heads", "--nproc", "--init"):
        assert option in result.stdout


def test_rerun_with_other_settings_is_refused(tmp_path, cli):
    out = tmp_path / "demo-out"
    out.mkdir()
    first = settings(tmp_path)
    record = {k: v for k, v in first.__dict__.items() if k not in ("out", "quiet")}
    (out / "settings.json").write_text(json.dumps(record))
    result = cli("demo", "--out", out, "--tokens", "4096")
    assert result.exit_code == 2
    assert "holds a demo run with other settings" in result.stderr


def test_bad_options_are_refused_before_anything_is_written(tmp_path, cli):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        (["--nproc", "0"], "--nproc 0 must be at least 1"),
        (["--skip-heads", "3"], "SmolLM2 has 3 KV heads"),
        (["--tokens", "10"], "less than one step"),
        (["--lr", "nan"], "--lr nan must be a positive number"),
        (["--init", "nope"], "--init nope is unknown"),
    ]
    for args, message in cases:
        out = tmp_path / "demo-out"
        result = cli("demo", "--out", out, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not out.exists(), args
    result = cli("demo", "--out", a_file)
    assert result.exit_code == 2 and "is a file" in result.stderr
