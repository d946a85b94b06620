"""MFU arithmetic: achieved FLOP/s from tokens/s, against the devices' peak when known."""

import pytest
import torch

from skipv1.uptrain.throughput import device_peak_flops, flops_fields


def test_flops_fields_report_tflops_and_mfu_only_with_a_known_peak():
    assert flops_fields(6e9, 1000.0, 2, None) == {"tflops": pytest.approx(6.0)}
    fields = flops_fields(6e9, 1000.0, 2, 1e13)
    assert fields["mfu"] == pytest.approx(6e12 / 2e13)


def test_cpu_and_fp32_have_no_peak():
    assert device_peak_flops(torch.device("cpu"), "bfloat16") is None
    assert device_peak_flops(torch.device("cuda"), "float32") is None
