"""Hub ids as sources, resolved offline through the real huggingface_hub client from a cache laid
out as a download leaves it: inspect, convert and eval take them as they take a directory, and
uptrain trains a converted checkpoint named by one."""

import json
import os

import pytest
import yaml
from factories import make_checkpoint, put_in_hub_cache, write_corpus
from huggingface_hub import constants

from skipv1.uptrain.metrics import read_metrics

REPO = "tiny-org/tiny-llama"


@pytest.fixture
def hub(tmp_path, tokenizer_dir, monkeypatch):
    """A tiny Llama as Hub id REPO in a fresh Hub cache (this process and its children)."""
    cache = tmp_path / "hub-cache"
    source = make_checkpoint(tmp_path / "src", tokenizer_dir=tokenizer_dir, num_key_value_heads=2)
    put_in_hub_cache(cache, REPO, source)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at each call
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return source


def test_inspect_convert_and_eval_take_a_cached_hub_id(hub, tmp_path, cli):
    by_id = json.loads(cli("inspect", REPO, "--json").stdout)
    by_dir = json.loads(cli("inspect", hub, "--json").stdout)
    assert by_id == {**by_dir, "path": REPO}
    result = cli("convert", REPO, tmp_path / "dst", "--init", "mean", "--quiet", "--json")
    assert result.exit_code == 0, result.output
    provenance = json.loads((tmp_path / "dst" / "skipv1_conversion.json").read_text())
    assert provenance["hub_id"] == REPO
    args = ["--max-tokens", "200", "--no-speed", "--json", "-", "--quiet"]
    result = cli("eval", REPO, hub, *args)
    assert result.exit_code == 0, result.output
    by_id, by_dir = json.loads(result.stdout)["models"]
    assert by_id["path"] == REPO and by_id["perplexity"] == by_dir["perplexity"]


@pytest.mark.distributed
def test_uptrain_trains_a_checkpoint_named_by_hub_id(hub, tmp_path, cli):
    """A conversion of REPO, itself on the Hub: `distill.teacher: source` finds REPO through
    the provenance in its snapshot."""
    result = cli("convert", REPO, tmp_path / "model", "--init", "mean", "--quiet")
    assert result.exit_code == 0, result.output
    cache = put_in_hub_cache(constants.HF_HUB_CACHE, "tiny-org/tiny-skipv1", tmp_path / "model")
    cache = cache.parents[2]
    corpus = write_corpus(tmp_path, train=6, validation=2)
    recipe = {
        "distill": {"teacher": "source"},
        "model": {"path": "tiny-org/tiny-skipv1", "dtype": "float32"},
        "data": {"train": str(corpus / "train.jsonl"), "eval": None, "seq_len": 32},
        "budget": {"tokens": 2 * 256},
        "batch": {"global_batch_tokens": 256, "micro_batch_size": 4},
        "deepspeed": {"zero_stage": 0},
        "checkpoint": {"every": 2},
        "log": {"progress": False},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = dict(os.environ, HF_HUB_CACHE=str(cache), PYTHONWARNINGS="ignore")
    run = tmp_path / "run"
    args = ("uptrain", tmp_path / "recipe.yaml", "--run-dir", run, "--quiet")
    result = cli.process(*args, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "export" / "config.json").is_file()
    assert any("distill_kl" in r for r in read_metrics(run))
    recipe["model"]["path"] = "tiny-org/not-in-the-cache"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = cli.process(*args[:2], "--run-dir", tmp_path / "run2", "--quiet", timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "tiny-org/not-in-the-cache is not a local path and could not be fetched" in result.stderr
