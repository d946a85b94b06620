"""`skipv1 inspect`: config-only description of source and converted checkpoints."""

import json

SMOLLM2_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}


def test_inspect_source_reports_plan_and_saving(tmp_path, cli):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_SHAPE))
    result = cli("inspect", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["skip_v_heads"] == 1 and not info["is_skipv1"]
    # bf16: 2 * 64 * (2*3 + 29*(2*3 - 0)) and 2 * 64 * (2*3 + 29*(2*3 - 1))
    assert info["kv_bytes_per_token_source_bf16"] == 23040
    assert info["kv_bytes_per_token_skipv1_bf16"] == 19328
    assert info["parameters"] == 134_515_008  # what transformers counts for SmolLM2-135M
    assert info["parameters"] - info["parameters_skipv1"] == 29 * 576 * 64


def test_inspect_converted_reads_skip_from_config(tmp_path, cli):
    config = dict(
        SMOLLM2_SHAPE,
        model_type="skipv1_llama",
        skip_v_heads=2,
        architectures=["SkipV1LlamaForCausalLM"],
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = json.loads(cli("inspect", tmp_path, "--json").stdout)
    assert info["is_skipv1"] and info["skip_v_heads"] == 2
    assert info["kv_bytes_per_token_skipv1_bf16"] == 2 * 64 * (6 + 29 * 4)
    assert info["parameters"] == info["parameters_skipv1"]


def test_inspect_table_output(tmp_path, cli):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_SHAPE))
    result = cli("inspect", tmp_path)
    assert result.exit_code == 0
    assert "19,328" in result.stdout and "16.1%" in result.stdout


def test_inspect_bad_inputs_exit_2_with_one_line(tmp_path, cli):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(
        json.dumps({"architectures": ["BertForMaskedLM"]})
    )
    cases = {
        tmp_path / "missing": "does not exist",
        tmp_path / "empty": "no config.json",
        tmp_path / "bad": "not valid JSON",
        tmp_path / "odd": "unsupported architecture BertForMaskedLM",
    }
    for path, message in cases.items():
        result = cli("inspect", path)
        assert result.exit_code == 2, (path, result.output)
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_inspect_config_fields_of_the_wrong_type_are_named(tmp_path, cli):
    cases = {
        "nested architectures": ({"architectures": [["LlamaForCausalLM"]]}, "'architectures'"),
        "string kv heads": ({"num_key_value_heads": "3"}, "'num_key_value_heads' is '3'"),
        "string skip": ({"skip_v_heads": "1"}, "'skip_v_heads' is '1'"),
        "negative head_dim": ({"head_dim": -64}, "'head_dim' is -64"),
        "float layers": ({"num_hidden_layers": 30.5}, "'num_hidden_layers'"),
        "bool hidden": ({"hidden_size": True}, "'hidden_size'"),
    }
    for name, (override, message) in cases.items():
        path = tmp_path / name.replace(" ", "-")
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**SMOLLM2_SHAPE, **override}))
        result = cli("inspect", path)
        assert result.exit_code == 2, (name, result.output)
        assert message in result.stderr, (name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, name


def test_inspect_skip_heads_out_of_range_is_refused(tmp_path, cli):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(SMOLLM2_SHAPE))
    for s in (3, 5, -1):
        result = cli("inspect", tmp_path / "m", "--skip-heads", s)
        assert result.exit_code == 2, (s, result.output)
        assert "out of range for 3 KV heads" in result.stderr, (s, result.stderr)


def test_inspect_reads_a_gguf_from_its_metadata(tmp_path, cli):
    """What convert takes, inspect takes: the real SmolLM2 GGUF (by path and by its built-in
    name) describes as its HF config does, without dequantizing; a damaged GGUF and an uncached
    Hub id offline are one-line errors."""
    from skipv1.smollm2 import smollm2_gguf_path

    expected = {"num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64}
    for source in (smollm2_gguf_path(), "builtin:smollm2"):
        result = cli("inspect", source, "--json")
        assert result.exit_code == 0, result.output
        info = json.loads(result.stdout)
        assert {k: info[k] for k in expected} == expected
        assert info["kv_bytes_per_token_skipv1_bf16"] == 19328
        assert info["parameters"] == 134_515_008
        assert info["path"] == str(source)
    (tmp_path / "damaged.gguf").write_bytes(b"not a gguf file")
    # the tests run with HF_HUB_OFFLINE=1 (conftest)
    cases = {
        tmp_path / "damaged.gguf": "could not be read by transformers' GGUF loader",
        "no-such-org/no-such-model": "could not be fetched from the Hub",
    }
    for source, message in cases.items():
        result = cli("inspect", source)
        assert result.exit_code == 2, (source, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
