"""`convert` copies the tensors it leaves unchanged byte for byte from the source files: the
copied bytes are the source's, small shards are exactly what safetensors.save_file would write,
large ones keep each copied tensor at its source's offset modulo writer.ALIGNMENT (where the
kernel copies fastest) and never mix two source files, the kernel copy and its fallbacks move
the same bytes, and the output loads and computes as before."""

import json
import os
import struct
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from test_convert import hand_built_skipv1, logits
from transformers import AutoModelForCausalLM

from skipv1.convert import arrays, writer
from skipv1.convert.ahead import converted_ahead
from skipv1.convert.arrays import Array
from skipv1.convert.reader import FileRange
from skipv1.units import BFLOAT16, dtype_named


def mmap_unsupported(*args, **kwargs):
    raise OSError(19, "No such device")  # ENODEV: what mmap gives where a file system has none


def tensor_places(path: Path) -> dict[str, tuple[str, int, int]]:
    """Each tensor's (file name, first byte's file offset, byte count), read from the
    safetensors headers by hand (no skipv1, no torch)."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            out[name] = (file.name, 8 + length + begin, end - begin)
    return out


def raw_tensors(path: Path) -> dict[str, bytes]:
    """Each tensor's bytes, read at the place its safetensors header gives."""
    out = {}
    for name, (file, at, count) in tensor_places(path).items():
        with open(path / file, "rb") as f:
            f.seek(at)
            out[name] = f.read(count)
    return out


def rewritten(dst: Path) -> set[str]:
    record = json.loads((dst / "skipv1_conversion.json").read_text())
    return {t["name"] for t in record["tensors_changed"]}


@pytest.mark.parametrize("init", ["keep", "mean"])
def test_unchanged_tensors_are_the_source_bytes_and_shards_are_what_save_file_writes(
    checkpoint, tmp_path, init, converted
):
    src = checkpoint(shards=3, num_key_value_heads=2)
    dst = converted(src, tmp_path / "dst", "--init", init, "--shard-size", "40KB")
    before, after = raw_tensors(src), raw_tensors(dst)
    changed = rewritten(dst)
    assert changed and set(after) == set(before)
    for name in set(before) - changed:
        assert after[name] == before[name], name
    shards = sorted(dst.glob("*.safetensors"))
    assert len(shards) > 3
    for shard in shards:
        with safe_open(shard, "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
        assert shard.read_bytes() == (tmp_path / "reference.safetensors").read_bytes(), shard
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True).eval()
    if init == "keep":
        torch.testing.assert_close(logits(model), logits(hand_built_skipv1(src, 1)), rtol=0, atol=0)
    else:
        assert torch.isfinite(logits(model)).all()


def test_large_shards_keep_copied_tensors_at_their_source_offset_modulo_the_alignment(
    checkpoint, tmp_path, converted
):
    # vocab x hidden fp32 = 5.1 MB embeddings and lm_head, each over the padding threshold
    src = checkpoint(shards=2, vocab_size=20_000, num_key_value_heads=2)
    dst = converted(src, tmp_path / "dst", "--init", "keep", "--shard-size", "3MB")
    before, after = tensor_places(src), tensor_places(dst)
    copied = set(before) - rewritten(dst)
    big = {n for n in copied if before[n][2] >= writer.MIN_ALIGNED_BYTES}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= big
    for name in big:
        assert (after[name][1] - before[name][1]) % writer.ALIGNMENT == 0, name
    for shard in {file for file, _, _ in after.values()}:  # no shard mixes two source files
        assert len({before[n][0] for n, place in after.items() if place[0] == shard}) == 1
    source_bytes, output_bytes = raw_tensors(src), raw_tensors(dst)
    assert all(output_bytes[n] == source_bytes[n] for n in copied)
    model = AutoModelForCausalLM.from_pretrained(dst, trust_remote_code=True).eval()
    torch.testing.assert_close(logits(model), logits(hand_built_skipv1(src, 1)), rtol=0, atol=0)


def test_a_header_is_padded_to_align_the_most_copied_bytes_and_only_when_they_are_many():
    a = writer.TensorSpec(BFLOAT16, (writer.MIN_ALIGNED_BYTES // 2,))  # the most bytes
    n = writer.TensorSpec(BFLOAT16, (12,))
    b = writer.TensorSpec(BFLOAT16, (writer.MIN_ALIGNED_BYTES // 4,))
    specs = {"b": b, "n": n, "a": a}
    source_at = {"b": 5000, "a": 5000 + b.nbytes + n.nbytes + 8}  # a sits 8 bytes further on
    header, offsets = writer.shard_header(specs, ["b", "n", "a"], source_at)
    assert len(header) % 8 == 0
    assert offsets == {"b": len(header), "n": len(header) + b.nbytes, "a": offsets["n"] + n.nbytes}
    assert (offsets["a"] - source_at["a"]) % writer.ALIGNMENT == 0
    assert (offsets["b"] - source_at["b"]) % writer.ALIGNMENT != 0
    header, _ = writer.shard_header({"n": n}, ["n"], {"n": 5000})
    assert len(header) < 200  # a few copied bytes: no padding


def test_a_shard_of_mixed_dtypes_is_byte_identical_to_save_file(tmp_path):
    tensors = {
        "b": torch.randn(3, 5).bfloat16(),
        "a": torch.randn(7, dtype=torch.float64),
        "c": torch.randn(2, 2).half(),
        "d": torch.randn(4, 1),
        "e": torch.zeros(0, 3),
    }
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    specs = {n: writer.TensorSpec(dtype_named(t.dtype), tuple(t.shape)) for n, t in tensors.items()}
    (tmp_path / "out").mkdir()
    written = writer.write_shards(tmp_path / "out", [list(tensors)], specs, tensors.items())
    assert written["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    reference = (tmp_path / "reference.safetensors").read_bytes()
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == reference


@pytest.mark.parametrize("step", ["_copy_file_range", "_sendfile", "_buffered"])
def test_each_copy_method_moves_the_same_bytes_to_the_same_place(tmp_path, step):
    source = tmp_path / "source"
    source.write_bytes(os.urandom(3 * writer.BUFFER_BYTES // 2 + 7))
    target = tmp_path / "target"
    target.write_bytes(b"\0" * 64)
    begin, count, at = 123, writer.BUFFER_BYTES + 99, 64
    with open(source, "rb") as src, open(target, "r+b") as dst:
        done = getattr(writer, step)(src.fileno(), dst.fileno(), begin, at, count, 0)
    assert done == count
    assert target.read_bytes() == b"\0" * 64 + source.read_bytes()[begin : begin + count]


def test_a_source_that_shrank_is_an_error_not_a_short_tensor(tmp_path):
    source = tmp_path / "source"
    source.write_bytes(b"x" * 100)
    with open(tmp_path / "target", "wb") as dst:
        with pytest.raises(RuntimeError, match="ended before byte 150"):
            writer.copy_range(FileRange(source, 50, 100), dst.fileno(), 0)


@pytest.mark.parametrize("mapped", [True, False])  # False: a file system without mmap
def test_a_rewritten_tensor_is_read_mapped_with_its_bytes_and_a_short_file_is_an_error(
    tmp_path, monkeypatch, mapped
):
    if not mapped:
        monkeypatch.setattr(arrays.mmap, "mmap", mmap_unsupported)
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7000, 3).to(torch.bfloat16)}
    path = tmp_path / "x.safetensors"
    save_file(tensors, path)
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8 : 8 + length])
    for name, tensor in tensors.items():
        at = 8 + length + header[name]["data_offsets"][0]
        array = Array.read(path, at, dtype_named(tensor.dtype), tuple(tensor.shape))
        assert torch.equal(array.to_torch(), tensor)
    end = 8 + length + header["b"]["data_offsets"][1]
    with open(path, "r+b") as f:
        f.truncate(end - 1)
    with pytest.raises(RuntimeError, match="ended inside a tensor"):
        Array.read(path, end - 7000 * 3 * 2, BFLOAT16, (7000, 3))


def test_rewrites_run_ahead_of_the_copies_before_them_in_order_and_raise_in_place():
    started = threading.Event()

    def convert(name, item):
        started.set()
        if item == "bad":
            raise ValueError(name)
        return item.upper()

    items = [("c0", "copy"), ("r1", "x"), ("c2", "copy"), ("r3", "y"), ("c4", "copy")]
    out = converted_ahead(items, lambda name: name.startswith("r"), convert)
    assert next(out) == ("c0", "copy")
    assert started.wait(timeout=10)  # r1 was converted while c0 was still being written
    assert list(out) == [("r1", "X"), ("c2", "copy"), ("r3", "Y"), ("c4", "copy")]
    failing = converted_ahead([("c0", "copy"), ("r1", "bad")], lambda n: n == "r1", convert)
    assert next(failing) == ("c0", "copy")
    with pytest.raises(ValueError, match="r1"):
        next(failing)
