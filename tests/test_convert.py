"""`skipv1 convert` end to end on small random checkpoints: values follow --init, the output
loads with trust_remote_code, --init keep equals a hand-built SkipV1 model, and the output
directory has every file the format promises."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from skipv1 import SkipV1LlamaConfig, SkipV1LlamaForCausalLM


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (safetensors or .bin, single or sharded)."""
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    for file in sorted(path.glob("*.bin")):
        tensors.update(torch.load(file, weights_only=True))
    return tensors


def expected_v(source: torch.Tensor, groups, init: str, n_kv: int) -> torch.Tensor:
    """Written out independently of skipv1.convert.init: the rule of the issue."""
    heads = source.reshape(n_kv, -1, *source.shape[1:])
    if init == "keep":
        own = [heads[j] for j in range(len(groups))]
    else:
        own = [heads[list(g)].float().mean(0).to(source.dtype) for g in groups]
    return torch.cat(own)


def hand_built_skipv1(src: Path, s: int) -> SkipV1LlamaForCausalLM:
    """A SkipV1 model made from the source weights with later v_proj rows sliced by hand."""
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    c = source.config
    qwen2 = c.model_type == "qwen2"
    config = SkipV1LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters,
        tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=qwen2 or getattr(c, "attention_bias", False),
        o_proj_bias=False if qwen2 else getattr(c, "attention_bias", False),
        mlp_bias=getattr(c, "mlp_bias", False),
        skip_v_heads=s,
    )
    model = SkipV1LlamaForCausalLM(config).eval()
    head_dim = c.hidden_size // c.num_attention_heads
    own_rows = (c.num_key_value_heads - s) * head_dim
    state = source.state_dict()
    for i in range(1, c.num_hidden_layers):
        for kind in ("weight", "bias"):
            key = f"model.layers.{i}.self_attn.v_proj.{kind}"
            if key in state:
                state[key] = state[key][:own_rows]
    model.load_state_dict(state, strict=True)
    return model


def logits(model, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(
        0, model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        return model(input_ids=ids).logits


CASES = {
    "llama-mha-untied-single": dict(arch="llama"),
    "llama-mha-tied-sharded": dict(arch="llama", shards=3, tie_word_embeddings=True),
    "llama-3kv-biases-uneven": dict(
        arch="llama",
        hidden_size=48,
        num_attention_heads=3,
        num_key_value_heads=3,
        attention_bias=True,
        mlp_bias=True,
    ),
    "mistral-gqa-sharded": dict(arch="mistral", num_key_value_heads=2, shards=2),
    "qwen2-bias-tied": dict(arch="qwen2", num_key_value_heads=2, tie_word_embeddings=True),
    "llama-bin-sharded": dict(arch="llama", fmt="bin", shards=2, num_key_value_heads=2),
    "llama-bin-single-tied": dict(arch="llama", fmt="bin", tie_word_embeddings=True),
}
GROUPS = {4: [(0, 1), (2, 3)], 3: [(0, 1), (2,)], 2: [(0, 1)]}  # default s = n_kv // 2


@pytest.mark.parametrize("init", ["mean", "keep"])
@pytest.mark.parametrize("case", list(CASES))
def test_converted_tensors_follow_init_and_model_loads(checkpoint, tmp_path, case, init, converted):
    kwargs = dict(CASES[case])
    src = checkpoint(**kwargs)
    dst = converted(src, tmp_path / "dst", "--init", init)
    n_kv = kwargs.get("num_key_value_heads", 4)
    groups = GROUPS[n_kv] if init == "mean" else [(j,) for j in range(n_kv - n_kv // 2)]
    before, after = load_tensors(src), load_tensors(dst)
    assert set(after) == set(before)
    for name, tensor in before.items():
        if ".v_proj." in name and not name.startswith("model.layers.0."):
            assert torch.equal(after[name], expected_v(tensor, groups, init, n_kv)), name
        else:
            assert torch.equal(after[name], tensor), name
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True).eval()
    assert type(model).__name__ == "SkipV1LlamaForCausalLM"
    assert model.config.skip_v_heads == n_kv // 2
    if init == "keep":
        torch.testing.assert_close(
            logits(model), logits(hand_built_skipv1(src, n_kv // 2)), rtol=0, atol=0
        )
    else:
        assert torch.isfinite(logits(model)).all()


@pytest.mark.parametrize(
    "case", ["llama-mha-untied-single", "qwen2-bias-tied", "llama-bin-sharded"]
)
def test_zero_skip_heads_reproduces_the_source_exactly(checkpoint, tmp_path, case, converted):
    src = checkpoint(**CASES[case])
    dst = converted(src, tmp_path / "dst", "--skip-heads", "0")
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True).eval()
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    torch.testing.assert_close(logits(model), logits(source), rtol=0, atol=0)


def test_output_has_config_tokenizer_code_provenance_and_card(checkpoint, tmp_path, converted):
    src = checkpoint(num_key_value_heads=2)
    dst = converted(src, tmp_path / "dst")
    config = json.loads((dst / "config.json").read_text())
    source_config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == "skipv1_llama"
    assert config["architectures"] == ["SkipV1LlamaForCausalLM"]
    assert config["skip_v_heads"] == 1
    assert config["auto_map"] == {
        "AutoConfig": "configuration_skipv1_llama.SkipV1LlamaConfig",
        "AutoModelForCausalLM": "modeling_skipv1_llama.SkipV1LlamaForCausalLM",
    }
    for key, value in source_config.items():
        if key not in ("architectures", "model_type"):
            assert config[key] == value, key
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    for name in ("configuration_skipv1_llama.py", "modeling_skipv1_llama.py"):
        assert (dst / name).read_text() == (Path("skipv1/modeling") / name).read_text()
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    import hashlib

    assert (
        record["source_config_sha256"]
        == hashlib.sha256((src / "config.json").read_bytes()).hexdigest()
    )
    assert record["options"]["init"] == "mean" and record["skip_heads"] == 1
    assert record["versions"]["transformers"] and record["versions"]["torch"]
    assert {t["name"] for t in record["tensors_changed"]} == {
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.2.self_attn.v_proj.weight",
    }
    kv = record["kv_bytes_per_token"]
    # float32, head_dim 16, n_kv 2, 3 layers: 4*16*(4 + 2*3) vs 4*16*(4 + 2*4)
    assert (kv["source"], kv["skipv1"]) == (768, 640)
    card = (dst / "README.md").read_text()
    assert "768" in card and "640" in card and "--init mean" in card
    assert not list(tmp_path.glob(".dst.skipv1-tmp-*"))


def test_tokenizer_of_the_output_encodes_like_the_source(checkpoint, tmp_path, converted):
    from transformers import AutoTokenizer

    src = checkpoint()
    dst = converted(src, tmp_path / "dst")
    text = "Convert the checkpoint, then uptrain it."
    assert (
        AutoTokenizer.from_pretrained(dst)(text)["input_ids"]
        == AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    )


def test_small_shard_size_writes_shards_and_an_index_with_exact_total_size(
    checkpoint, tmp_path, converted
):
    src = checkpoint(shards=2)
    dst = converted(src, tmp_path / "dst", "--shard-size", "100KB")
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and files == sorted(p.name for p in dst.glob("*.safetensors"))
    tensors = load_tensors(dst)
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in tensors.values()
    )
    for file in files:
        with safe_open(dst / file, "pt") as f:
            sizes = [f.get_tensor(k).numel() * 4 for k in f.keys()]
        assert sum(sizes) <= 100_000 or len(sizes) == 1, file
    AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)


def test_dtype_option_casts_every_tensor_and_the_config(checkpoint, tmp_path, converted):
    src = checkpoint()
    dst = converted(src, tmp_path / "dst", "--dtype", "bfloat16", "--init", "keep")
    tensors = load_tensors(dst)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    source = load_tensors(src)
    assert torch.equal(tensors["model.norm.weight"], source["model.norm.weight"].bfloat16())
    assert json.loads((dst / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True)
    assert model.dtype == torch.bfloat16


def test_dry_run_prints_the_plan_and_writes_nothing(checkpoint, tmp_path, cli):
    src = checkpoint(num_key_value_heads=2)
    dst = tmp_path / "out" / "dst"
    result = cli("convert", src, dst, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["dry_run"] is True and plan["skip_heads"] == 1
    assert plan["kv_bytes_per_token"]["saving"] == pytest.approx(1 - 640 / 768)
    # the default init rewrites q/k/v/o and mlp.down_proj of layers 1 and 2
    assert plan["tensors"] == {"total": 30, "copied": 20, "rewritten": 10, "dropped": []}
    assert plan["init"] == "reconstruct"
    assert not (tmp_path / "out").exists()
    human = cli("convert", src, dst, "--dry-run")
    assert (
        human.exit_code == 0
        and "nothing written" in human.stdout
        and "KV bytes/token" in human.stdout
    )


def test_overwrite_replaces_an_existing_destination(checkpoint, tmp_path, converted):
    src = checkpoint()
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    converted(src, dst, "--overwrite")
    assert not (dst / "old.txt").exists() and (dst / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_source_with_custom_code_converts_with_trust_remote_code(checkpoint, tmp_path, converted):
    src = checkpoint()
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "custom.MyLlama"}
    (src / "config.json").write_text(json.dumps(config))
    dst = converted(src, tmp_path / "dst", "--trust-remote-code")
    out = json.loads((dst / "config.json").read_text())
    assert out["auto_map"]["AutoModelForCausalLM"] == "modeling_skipv1_llama.SkipV1LlamaForCausalLM"


def test_python_api_returns_the_summary(checkpoint, tmp_path):
    from skipv1.convert import convert_checkpoint

    summary = convert_checkpoint(
        checkpoint(), tmp_path / "dst", skip_heads=1, init="keep", quiet=True
    )
    assert summary["skip_heads"] == 1 and summary["value_head_groups"] == [[0], [1], [2]]
    assert summary["total_size"] == summary["bytes_out"]
    assert (tmp_path / "dst" / "model.safetensors").exists()
