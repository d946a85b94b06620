"""The README's examples: those marked `readme-test: run` run offline on the real SmolLM2; every
`skipv1` command line parses against the real CLI; every `make` target exists."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from skipv1.cli import app

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(<!-- readme-test: run -->\n)?```(bash|python)\n(.*?)```", re.S)


def blocks() -> list[tuple[bool, str, str]]:
    text = (ROOT / "README.md").read_text()
    return [(bool(m.group(1)), m.group(2), m.group(3)) for m in FENCE.finditer(text)]


def shell_lines(lang: str, body: str) -> list[list[str]]:
    if lang != "bash":
        return []
    return [shlex.split(line, comments=True) for line in body.splitlines() if line.strip()]


def test_readme_has_runnable_examples():
    assert sum(run for run, _, _ in blocks()) >= 3


def test_every_skipv1_example_parses():
    group = typer.main.get_command(app)
    count = 0
    for _, lang, body in blocks():
        for argv in shell_lines(lang, body):
            if argv and argv[0] == "skipv1":
                command = group.get_command(None, argv[1])
                assert command is not None, argv
                command.make_context(argv[1], argv[2:])  # raises on unknown options or types
                count += 1
    assert count >= 6


def test_every_make_example_is_a_target():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    for _, lang, body in blocks():
        for argv in shell_lines(lang, body):
            if argv and argv[0] == "make":
                assert set(argv[1:]) <= targets, argv


@pytest.mark.smollm2
def test_offline_examples_run(smollm2_dir, tmp_path):
    (tmp_path / "demo-out").mkdir()
    (tmp_path / "demo-out" / "source").symlink_to(smollm2_dir)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for run, lang, body in blocks():
        if not run:
            continue
        cmd = (
            ["bash", "-euo", "pipefail", "-c", body]
            if lang == "bash"
            else [sys.executable, "-c", body]
        )
        result = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, (body, result.stderr[-3000:])
    assert (tmp_path / "eval.json").is_file() and (tmp_path / "eval.png").is_file()


def test_make_test_runs_everything_and_test_fast_leaves_out_every_marker():
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([a-z][a-z-]*):.*\n\t(.*)", makefile, re.M))
    assert recipes["test"] == "$(PY) -m pytest -q"  # what CI (.ci/run) runs
    declared = re.findall(r'^    "([a-z0-9_]+): ', (ROOT / "pyproject.toml").read_text(), re.M)
    assert set(declared) == {"slow", "smollm2", "distributed"}
    expression = re.search(r'-m "(.*)"', recipes["test-fast"]).group(1)
    assert expression == " and ".join(f"not {m}" for m in ("slow", "smollm2", "distributed"))
