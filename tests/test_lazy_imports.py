"""`import skipv1` and `skipv1 convert --init keep/mean` of a safetensors source import neither
torch nor transformers, and the SkipV1 classes are still registered with transformers' Auto
classes whenever those are imported, before or after skipv1 (real child processes: what a
process has imported is only clean in a fresh one)."""

import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")

# Loads a converted checkpoint through the Auto classes alone (no trust_remote_code: only a
# registration makes this work) and checks the class is skipv1's own.
LOAD = """
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(DST)
model = AutoModelForCausalLM.from_pretrained(DST)
assert type(config).__name__ == "SkipV1LlamaConfig", type(config)
assert type(model).__module__ == "skipv1.modeling.modeling_skipv1_llama", type(model).__module__
print("LOADED")
"""


def child(script: str, cwd) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-2000:]
    return run.stdout


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory, tokenizer_dir):
    """A tiny Llama converted with `python -m skipv1 convert --init mean` in a child that then
    reports which heavy modules it imported, and loads the result through the Auto classes
    after `from transformers import LlamaForCausalLM`: modeling_llama imports the auto modules
    while it is itself half-imported (the registration must wait for it)."""
    from factories import make_checkpoint

    work = tmp_path_factory.mktemp("lazy")
    src = make_checkpoint(work / "src", tokenizer_dir=tokenizer_dir, num_key_value_heads=2)
    dst = work / "dst"
    script = f"""
import runpy, sys
DST = {str(dst)!r}
sys.argv = ["skipv1", "convert", {str(src)!r}, DST, "--init", "mean", "--quiet", "--json"]
try:
    runpy.run_module("skipv1", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
print("HEAVY", sorted({{m.split(".")[0] for m in sys.modules}} & {set(HEAVY)!r}))
from transformers import LlamaForCausalLM
{LOAD}
"""
    return dst, child(script, work)


def test_convert_mean_imports_neither_torch_nor_transformers(converted_dir):
    dst, out = converted_dir
    assert "HEAVY []" in out and (dst / "model.safetensors").is_file()


def test_import_skipv1_then_transformers_registers_the_auto_classes(converted_dir):
    assert "LOADED" in converted_dir[1]  # the same child, after the conversion


def test_transformers_imported_before_skipv1_registers_at_import_skipv1(converted_dir, tmp_path):
    dst, _ = converted_dir
    first = "import transformers.models.auto.modeling_auto\nimport skipv1"
    out = child(
        f"{first}\nDST = {str(dst)!r}\n{LOAD}\nfrom skipv1 import SkipV1LlamaForCausalLM\nassert type(model) is SkipV1LlamaForCausalLM",
        tmp_path,
    )
    assert "LOADED" in out


def test_import_skipv1_is_light_and_names_its_classes(tmp_path):
    out = child(
        "import sys, skipv1\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n"
        "print(sorted(skipv1.__all__))",
        tmp_path,
    )
    assert out.splitlines()[0] == "[]" and "SkipV1Qwen3ForCausalLM" in out
