"""`convert`'s torch-free tensors (skipv1.convert.arrays) and the numpy `--init mean` give what
torch gives, bit for bit: every cast on random bit patterns plus ties, subnormals, signed zeros,
infinities and overflow, and the mean on random heads (groups of 1 to 4 heads in numpy, larger ones through torch)."""

import numpy as np
import pytest
import torch

from skipv1.convert import arrays
from skipv1.convert.arrays import Array
from skipv1.convert.inits import mean
from skipv1.convert.inits.mean import init_mean
from skipv1.units import BY_NAME, dtype_named

DTYPES = ("bfloat16", "float16", "float32", "float64")


def special_float32() -> np.ndarray:
    """Ties to even for bfloat16 and float16, their subnormals, overflow, +-0, +-inf."""
    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x00008000]
    bits += [0x00018000, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x00000001]
    values = np.array(bits, dtype=np.uint32).view(np.float32)
    halves = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504, 65520, 65519.99, 2**-25, 2**-24 * 1.5])
    return np.concatenate([values, halves.astype(np.float32), -halves.astype(np.float32)])


def random_tensor(dtype: str, n: int = 4096, seed: int = 0) -> torch.Tensor:
    """Random bit patterns of `dtype` (every exponent, no NaN) plus the special values."""
    g = torch.Generator().manual_seed(seed)
    width = {"bfloat16": torch.int16, "float16": torch.int16}.get(dtype)
    if width is not None:
        raw = torch.randint(-(2**15), 2**15, (n,), generator=g, dtype=torch.int32).to(width)
        t = raw.view(getattr(torch, dtype))
    else:
        t = (
            torch.randn(n, generator=g, dtype=torch.float64)
            * 10 ** torch.empty(n).uniform_(-40, 40, generator=g)
        ).to(getattr(torch, dtype))
    t = t[~torch.isnan(t)]
    return torch.cat([t, torch.from_numpy(special_float32()).to(t.dtype)])


def same_bits(array: Array, tensor: torch.Tensor) -> bool:
    return array.dtype == dtype_named(tensor.dtype) and bytes(array.data.tobytes()) == bytes(
        tensor.contiguous().view(torch.uint8).numpy().tobytes()
    )


@pytest.mark.parametrize("source", DTYPES)
@pytest.mark.parametrize("target", DTYPES)
def test_casts_equal_torchs_bit_for_bit(source, target, monkeypatch):
    monkeypatch.setattr(arrays, "CAST_BLOCK", 1000)  # several blocks, the last one partial
    tensor = random_tensor(source)
    array = Array.from_torch(tensor)
    assert same_bits(array, tensor)
    assert same_bits(array.to(BY_NAME[target]), tensor.to(getattr(torch, target)))
    assert torch.equal(array.to_torch().view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_nan_stays_nan_with_torchs_bits_on_this_cpu(target):
    # torch's NaN bits differ between its scalar and vector kernels: compare positions, and the
    # bits where this machine's torch agrees with itself on both lengths
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001, 0x3F800000], np.uint32)
    values = torch.from_numpy(bits.view(np.float32))
    out = Array.from_float32(values.numpy(), BY_NAME[target]).to_torch()
    expected = values.to(getattr(torch, target))
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    if torch.equal(
        expected.view(torch.int16), values.repeat(9).to(expected.dtype)[:5].view(torch.int16)
    ):
        assert torch.equal(out.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    ("kv", "s", "shape"),
    [
        (8, 4, (8 * 16, 64)),
        (3, 1, (3 * 8, 40)),
        (4, 3, (4 * 5,)),
        (12, 9, (12 * 3, 7)),
        (6, 2, (6 * 4,)),
        (8, 7, (8 * 2, 5)),
    ],
)
@pytest.mark.parametrize("block", [7, 1 << 16])  # many blocks, the last partial; one block
def test_numpy_mean_equals_torchs_bit_for_bit(dtype, kv, s, shape, block, monkeypatch):
    monkeypatch.setattr(mean, "MEAN_BLOCK", block)
    g = torch.Generator().manual_seed(kv * 100 + s)
    t = (
        torch.randn(shape, generator=g) * 10 ** torch.empty(shape).uniform_(-4, 4, generator=g)
    ).to(getattr(torch, dtype))
    heads = t.view(kv, shape[0] // kv, -1)
    heads[:, 0, 0] = -0.0  # all -0.0 across a group: torch's sum starts from +0.0
    heads[0, 1, 0], heads[1, 1, 0], heads[2, 1, 0] = float("inf"), float("-inf"), float("inf")
    out = init_mean(Array.from_torch(t), kv, s)
    assert isinstance(out, Array) and same_bits(out, init_mean(t, kv, s))  # torch's, as before
