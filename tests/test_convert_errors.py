"""Every bad input to `skipv1 convert`: exit code 2, one line naming the problem and the fix,
and nothing written (no DST, no temporary directory)."""

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from factories import make_checkpoint

from skipv1.checkpoint_info import check_supported
from skipv1.errors import SkipV1Error
from skipv1.families import FAMILIES


@pytest.fixture
def assert_refused(cli):
    """assert_refused(SRC, DST, *ARGS, match=...): `skipv1 convert` exits 2 with one line that
    contains `match`, and writes nothing; returns the line."""

    def _refused(src, dst: Path, *args, match: str) -> str:
        result = cli("convert", src, dst, "--quiet", *args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        assert match.lower() in lines[0].lower(), lines[0]
        assert not dst.exists()
        assert not list(dst.parent.glob(f".{dst.name}.skipv1-tmp-*"))
        return lines[0]

    return _refused


def shard_files(src: Path) -> list[str]:
    index = json.loads((src / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_missing_source(tmp_path, assert_refused):
    assert_refused(tmp_path / "nope", tmp_path / "dst", match="does not exist")


def test_source_that_is_not_a_model_directory(tmp_path, assert_refused):
    (tmp_path / "empty").mkdir()
    assert_refused(tmp_path / "empty", tmp_path / "dst", match="not a model directory")
    (tmp_path / "file.txt").write_text("x")
    assert_refused(tmp_path / "file.txt", tmp_path / "dst", match="not a directory")


def test_config_that_is_not_valid_json(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    (src / "config.json").write_text("{not json")
    assert_refused(src, tmp_path / "dst", match="is not valid JSON")


def test_unsupported_architecture_lists_the_supported_ones(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    edit_json(src / "config.json", architectures=["BertForMaskedLM"], model_type="bert")
    line = assert_refused(src, tmp_path / "dst", match="unsupported architecture BertForMaskedLM")
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert arch in line


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_source_without_architectures_is_recognised_by_model_type(tmp_path, converted, fmt):
    """Older and hand-written configs lack `architectures` (issue 17): model_type says it."""
    src = make_checkpoint(tmp_path / "src", fmt=fmt)
    config = json.loads((src / "config.json").read_text())
    del config["architectures"]
    (src / "config.json").write_text(json.dumps(config))
    dst = converted(src, tmp_path / "dst", "--init", "keep", "--skip-heads", "1")
    out = json.loads((dst / "config.json").read_text())
    assert out["architectures"] == ["SkipV1LlamaForCausalLM"] and out["skip_v_heads"] == 1
    unknown = {k: v for k, v in config.items() if k != "model_type"}
    (src / "config.json").write_text(json.dumps({**unknown, "model_type": "bert"}))
    with pytest.raises(SkipV1Error, match="unsupported architecture <bert>"):
        check_supported(json.loads((src / "config.json").read_text()))


@pytest.mark.slow  # the default init's calibration: over a minute
def test_source_that_is_already_skipv1(checkpoint, tmp_path, assert_refused, cli):
    src = checkpoint()
    first = tmp_path / "first"
    assert cli("convert", src, first, "--init", "keep", "--quiet").exit_code == 0  # any init
    assert_refused(first, tmp_path / "dst", match="already a SkipV1 checkpoint")


def test_missing_shard(checkpoint, tmp_path, assert_refused):
    src = checkpoint(shards=3)
    missing = shard_files(src)[1]
    (src / missing).unlink()
    assert_refused(src, tmp_path / "dst", match=f"shard {missing} is missing")


def test_missing_bin_shard(checkpoint, tmp_path, assert_refused):
    src = checkpoint(shards=2, fmt="bin")
    (src / "pytorch_model-00001-of-00002.bin").unlink()
    assert_refused(src, tmp_path / "dst", match="is missing")


def test_truncated_shard(checkpoint, tmp_path, assert_refused):
    src = checkpoint(shards=3)
    shard = src / shard_files(src)[-1]
    size = shard.stat().st_size
    os.truncate(shard, size - 1000)
    line = assert_refused(src, tmp_path / "dst", match="is truncated")
    assert f"the file has {size - 1000}" in line and "re-download" in line


def test_truncated_bin_shard(checkpoint, tmp_path, assert_refused):
    src = checkpoint(fmt="bin")
    shard = src / "pytorch_model.bin"
    os.truncate(shard, shard.stat().st_size // 2)
    assert_refused(src, tmp_path / "dst", match="cannot be read safely")


def test_corrupt_shard_header(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    shard = src / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:16] = b"#garbage"
    shard.write_bytes(bytes(data))
    assert_refused(src, tmp_path / "dst", match="corrupt safetensors header")


def test_index_naming_a_tensor_no_shard_has(checkpoint, tmp_path, assert_refused):
    src = checkpoint(shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = shard_files(src)[0]
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(src, tmp_path / "dst", match="names tensor model.layers.9.mlp.up_proj.weight")


def test_shards_without_an_index(checkpoint, tmp_path, assert_refused):
    src = checkpoint(shards=2)
    (src / "model.safetensors.index.json").unlink()
    assert_refused(src, tmp_path / "dst", match="no model.safetensors.index.json")


def test_tensor_shape_that_disagrees_with_the_config(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    edit_json(src / "config.json", intermediate_size=96)
    assert_refused(
        src, tmp_path / "dst", match="has shape [64, 128] but config.json implies [64, 96]"
    )


def test_tensor_the_config_implies_but_the_weights_lack(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    edit_json(src / "config.json", num_hidden_layers=4)
    assert_refused(src, tmp_path / "dst", match="the weights lack")


@pytest.mark.parametrize("s", ["4", "-1", "9"])
def test_skip_heads_out_of_range(checkpoint, tmp_path, s, assert_refused):
    src = checkpoint()
    assert_refused(src, tmp_path / "dst", "--skip-heads", s, match="0 <= N <= 3")


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("--init", "svd", "--init svd is unknown"),
        ("--dtype", "int8", "--dtype int8 is unknown"),
        ("--shard-size", "lots", "--shard-size lots is not a size"),
    ],
)
def test_unknown_option_values(checkpoint, tmp_path, option, value, match, assert_refused):
    assert_refused(checkpoint(), tmp_path / "dst", option, value, match=match)


def test_destination_that_exists_is_left_alone(checkpoint, tmp_path, cli):
    src = checkpoint()
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "mine.txt").write_text("keep me")
    result = cli("convert", src, dst, "--quiet")
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"error: DST {dst} already exists: pass --overwrite or choose another DST"
    )
    assert [p.name for p in dst.iterdir()] == ["mine.txt"]


def test_destination_inside_source(checkpoint, assert_refused, cli):
    src = checkpoint()
    assert_refused(src, src / "converted", match="is inside SRC")
    before = sorted(p.name for p in src.iterdir())
    result = cli("convert", src, src, "--overwrite")
    assert result.exit_code == 2 and "is inside SRC" in result.stderr
    assert sorted(p.name for p in src.iterdir()) == before


def test_overwrite_of_a_destination_holding_the_source(checkpoint, tmp_path, cli):
    src = checkpoint("outer/src")
    result = cli("convert", src, tmp_path / "outer", "--overwrite")
    assert result.exit_code == 2 and "would delete the source" in result.stderr
    assert (src / "config.json").exists()


def test_not_enough_free_disk(checkpoint, tmp_path, monkeypatch, assert_refused):
    src = checkpoint()
    real = os.statvfs

    def one_megabyte_free(path):
        stat = real(path)
        fields = list(stat)
        fields[4] = 10**6 // stat.f_frsize  # f_bavail
        return os.statvfs_result(fields)

    # The filesystem's own numbers, with only 1 MB free: the machine cannot be filled for a test
    # (tests/test_filesystems.py fills a real tmpfs where this user may mount one).
    monkeypatch.setattr(os, "statvfs", one_megabyte_free)
    assert_refused(src, tmp_path / "dst", match="not enough free disk")


def test_source_asking_for_custom_code_without_trust_remote_code(
    checkpoint, tmp_path, assert_refused
):
    src = checkpoint()
    edit_json(src / "config.json", auto_map={"AutoModelForCausalLM": "custom.MyLlama"})
    assert_refused(src, tmp_path / "dst", match="pass --trust-remote-code")


def test_unknown_tensor_in_the_weights(checkpoint, tmp_path, assert_refused):
    from safetensors.torch import load_file, save_file

    src = checkpoint()
    tensors = load_file(src / "model.safetensors")
    tensors["model.extra.weight"] = torch.zeros(3)
    save_file(tensors, src / "model.safetensors")
    assert_refused(src, tmp_path / "dst", match="holds tensor model.extra.weight")


class Payload:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["SKIPV1_PWNED"]),))


def test_bin_with_pickled_code_is_refused_without_running_it(
    checkpoint, tmp_path, monkeypatch, assert_refused
):
    src = checkpoint(fmt="bin")
    marker = tmp_path / "pwned"
    monkeypatch.setenv("SKIPV1_PWNED", str(marker))
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    with open(src / "pytorch_model.bin", "wb") as f:
        pickle.dump({**state, "evil": Payload()}, f)
    assert_refused(src, tmp_path / "dst", match="cannot be read safely")
    assert not marker.exists()


def test_tokenizer_file_that_cannot_be_read(checkpoint, tmp_path, assert_refused):
    src = checkpoint()
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(tmp_path / "blobs" / "gone")  # a broken HF-cache link
    assert_refused(src, tmp_path / "dst", match="tokenizer file")


def test_hub_id_while_offline(tmp_path, monkeypatch, assert_refused):
    monkeypatch.chdir(tmp_path)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert_refused(
        "no-such-org/no-such-model", tmp_path / "dst", match="could not be fetched from the Hub"
    )


def test_destination_inside_a_symlink_loop(checkpoint, tmp_path, assert_refused):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert_refused(checkpoint(), tmp_path / "a" / "out", match="lies in a symlink loop")


def test_an_internal_error_is_one_line_exit_1_and_its_traceback_is_there_on_request(
    checkpoint, tmp_path, cli, monkeypatch
):
    """A bug of ours (here: the planner raising something that is not a SkipV1Error) is not a
    traceback either, unless SKIPV1_DEBUG asks for it."""
    import skipv1.convert.api as api

    def broken_plan(*args, **kwargs):
        raise KeyError("num_heads")

    monkeypatch.setattr(api, "make_plan", broken_plan)
    args = ("convert", checkpoint("src"), tmp_path / "dst", "--init", "mean", "--quiet")
    result = cli(*args)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: internal error: KeyError: 'num_heads'")
    assert "SKIPV1_DEBUG=1" in result.stderr and not (tmp_path / "dst").exists()
    monkeypatch.setenv("SKIPV1_DEBUG", "1")
    result = cli(*args)
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)


@pytest.mark.parametrize("args", [(), ("convert",)])
def test_help_names_every_source_family(cli, args):
    """The help a user reads first lists what convert takes (from the family table, not by hand)."""
    result = cli(*args, "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())
    for arch in (a for f in FAMILIES for a in f.sources):
        assert arch.removesuffix("ForCausalLM").removesuffix("LMHeadModel") in text, arch
