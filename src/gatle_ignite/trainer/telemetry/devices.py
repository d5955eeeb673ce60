"""What the device can do and what the run used of it: peak FLOP/s and peak memory.

Both are read from host-side counters (the CUDA caching allocator's statistics, the process's
resource usage), so reading them never waits for the device.
"""

import re
import sys
from typing import Optional

import torch

__all__ = [
    "peak_memory_mb",
    "peak_tflops",
    "peak_tflops_of",
    "precision_of",
    "reset_peak_memory",
]

_MIB = 2**20

# Dense peak TFLOP/s (no structured sparsity) from the vendors' datasheets, as
# (pattern of torch.cuda.get_device_name, {precision: TFLOP/s}); the first match wins, so a
# variant comes before its family. A precision the GPU lacks is absent: no MFU is given for it.
_PEAKS = (
    (r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H200.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"V100.*PCIE", {"fp16": 112.0, "fp32": 14.0}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    (r"MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
)


def precision_of(dtype: torch.dtype, autocast_enabled: bool) -> str:
    """The precision the matmuls run in: the autocast dtype, else fp32 (tf32 when allowed)."""
    if autocast_enabled and dtype == torch.bfloat16:
        return "bf16"
    if autocast_enabled and dtype == torch.float16:
        return "fp16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_tflops(device: torch.device, precision: str) -> Optional[float]:
    """The device's dense peak TFLOP/s at ``precision``; None off a GPU, or for one not known."""
    if torch.device(device).type != "cuda":
        return None
    return peak_tflops_of(torch.cuda.get_device_name(device), precision)


def peak_tflops_of(name: str, precision: str) -> Optional[float]:
    """The dense peak TFLOP/s of the GPU ``torch.cuda.get_device_name`` calls ``name``."""
    for pattern, peaks in _PEAKS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return peaks.get(precision)
    return None


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator counts from here. A process's peak cannot restart."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> Optional[float]:
    """MiB: the most memory tensors held on the CUDA device since the last reset; elsewhere,
    the process's peak resident memory since it started. None where neither can be read."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / _MIB
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / _MIB if sys.platform == "darwin" else peak / 1024
