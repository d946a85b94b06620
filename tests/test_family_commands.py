"""Every command for every family, through the CLI, on a tiny random checkpoint of each (the
first source class of each `Family` row, so a new family is covered by adding its row):
`inspect` the source, `uptrain` it (1 rank, 2 steps, model.source converted on the fly), `export`
the run, `inspect` and `eval` the export (perplexity on a tiny local text, measured KV bytes);
the export loads with the Auto classes and gives finite logits."""

import json
import os

import pytest
import torch
import yaml
from factories import make_checkpoint, token_ids, write_corpus
from transformers import AutoModelForCausalLM

from skipv1.families import FAMILIES
from skipv1.uptrain.metrics import read_metrics

# uptrain runs DeepSpeed (in this process, one rank)
pytestmark = pytest.mark.distributed
# case -> (family, source kind, config fields): each family's first source class, and the Llama
# family's sliding window (a Mistral whose window is shorter than the sequences)
CASES = {f.name: (f.name, next(iter(f.sources.values())), {}) for f in FAMILIES}
CASES["mistral-window"] = ("llama", "mistral", {"sliding_window": 8})
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One tiny text for every family: training, the run's eval and `skipv1 eval`."""
    return write_corpus(tmp_path_factory.mktemp("family-text"), train=6, validation=2)


def _ok(result):
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.mark.parametrize("case", CASES)
def test_inspect_uptrain_export_and_eval_work_for_the_family(
    case, corpus, tmp_path, tokenizer_dir, cli
):
    family, kind, fields = CASES[case]
    if kind not in ("gpt_neox", "gpt2"):  # MHA only there
        fields = {"num_key_value_heads": 2, **fields}
    src = make_checkpoint(tmp_path / "src", arch=kind, tokenizer_dir=tokenizer_dir, **fields)
    info = json.loads(_ok(cli("inspect", src, "--json")).stdout)
    assert not info["is_skipv1"] and info["skip_v_heads"] == info["num_kv_heads"] // 2
    assert info["kv_bytes_per_token_skipv1_bf16"] < info["kv_bytes_per_token_source_bf16"]

    recipe = {
        # keep: the default init is refused for some families and costs a calibration pass
        "model": {"source": str(src), "init": "keep", "dtype": "float32"},
        "data": {
            "train": str(corpus / "train.jsonl"),
            "eval": str(corpus / "eval.jsonl"),
            "seq_len": 32,
        },
        "budget": {"tokens": 128},
        "batch": {"global_batch_tokens": 64, "micro_batch_size": 2},
        "deepspeed": {"zero_stage": 0},
        "eval": {"blocks": 2},
        "log": {"progress": False, "tensorboard": False},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run, export = tmp_path / "run", tmp_path / "export"
    before = {key: os.environ.get(key) for key in RENDEZVOUS}
    _ok(cli("uptrain", tmp_path / "recipe.yaml", "--run-dir", run, "--quiet"))
    # the run's 1-rank group set these in this process and unset them: processes started later
    # must not inherit its port (still bound)
    assert {key: os.environ.get(key) for key in RENDEZVOUS} == before
    losses = [r["loss"] for r in read_metrics(run) if "loss" in r]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses)
    _ok(cli("export", run, export))

    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == f"skipv1_{family}"
    if "sliding_window" in fields:  # kept, not clamped
        assert config["sliding_window"] == 8 and "sliding_attention" in config["layer_types"]
    info = json.loads(_ok(cli("inspect", export, "--json")).stdout)
    assert info["is_skipv1"] and info["skip_v_heads"] == info["num_kv_heads"] // 2
    args = ["--data", corpus / "eval.jsonl", "--max-tokens", "96", "--ctx", "32", "--no-speed"]
    report = json.loads(_ok(cli("eval", export, *args, "--quiet", "--json", "-")).stdout)
    (model,) = report["models"]
    assert 1 < model["perplexity"] < float("inf")
    assert model["kv_bytes_per_token"] == model["kv_bytes_per_token_formula"]

    loaded = AutoModelForCausalLM.from_pretrained(export).eval()
    assert type(loaded).__name__ == config["architectures"][0]
    with torch.no_grad():
        assert torch.isfinite(loaded(token_ids(vocab=320)).logits).all()
