"""Model FLOPs utilisation: training FLOPs per second (6 x parameters per token, plus 2 x the
teacher's for distillation) against the devices' dense bf16/fp16 peak when it is known."""

import torch

# Dense bf16/fp16 tensor-core peak per device, FLOP/s (vendor datasheets, no sparsity).
PEAK_FLOPS = {
    "B200": 2.25e15,
    "H200": 9.89e14,
    "H100": 9.89e14,
    "H800": 9.89e14,
    "A100": 3.12e14,
    "A800": 3.12e14,
    "L40S": 3.62e14,
    "L4": 1.21e14,
    "A10G": 1.25e14,
    "A10": 1.25e14,
}


def device_peak_flops(device: torch.device, dtype: str) -> float | None:
    """The device's peak for `dtype`, or None (CPU, fp32, or a GPU not in the table)."""
    if device.type != "cuda" or dtype not in ("bfloat16", "float16"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def flops_fields(flops_per_token: float, tokens_per_s: float, world: int, peak: float | None):
    """`tflops` (achieved, all ranks) and `mfu` (a fraction, when the peak is known)."""
    achieved = flops_per_token * tokens_per_s
    fields = {"tflops": achieved / 1e12}
    if peak:
        fields["mfu"] = achieved / (peak * world)
    return fields
