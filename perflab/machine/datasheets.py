"""Datasheet figures: peak rates and bandwidths from vendor datasheets, with their sources, and the
FP32 CUDA-core peak derived from SMs, lanes per SM and the SM clock."""

from __future__ import annotations

from typing import Any

import torch

from perflab.core import nvml
from perflab.core.device import has_gpu

__all__ = ["datasheet", "DATASHEETS", "FP32_LANES_PER_SM", "fp32_peak_flops"]


# Peak figures from vendor datasheets, dense (no 2:4 sparsity): the datasheets quote tensor-core
# rates "with sparsity", which are twice the dense rate. Units: FLOP/s and bytes/s.
DATASHEETS: dict[str, dict[str, Any]] = {
    "NVIDIA H200": {
        "fp64_flops": 34e12,
        "fp32_flops": 67e12,
        "tf32_flops": 494.5e12,
        "bf16_flops": 989.5e12,
        "fp16_flops": 989.5e12,
        "fp8_flops": 1979e12,
        "memory_bandwidth": 4.8e12,
        "memory_bytes": 141e9,
        "nvlink_bandwidth": 900e9,
        "source": "NVIDIA H200 Tensor Core GPU datasheet (SXM column), NVIDIA, 2024",
        "url": "https://www.nvidia.com/en-us/data-center/h200/",
    },
    "NVIDIA H100 80GB HBM3": {
        "fp64_flops": 34e12,
        "fp32_flops": 67e12,
        "tf32_flops": 494.5e12,
        "bf16_flops": 989.5e12,
        "fp16_flops": 989.5e12,
        "fp8_flops": 1979e12,
        "memory_bandwidth": 3.35e12,
        "memory_bytes": 80e9,
        "nvlink_bandwidth": 900e9,
        "source": "NVIDIA H100 Tensor Core GPU datasheet (SXM column), NVIDIA, 2023",
        "url": "https://www.nvidia.com/en-us/data-center/h100/",
    },
    "Tesla V100-SXM2-32GB": {
        "fp64_flops": 7.8e12,
        "fp32_flops": 15.7e12,
        "fp16_flops": 125e12,
        "memory_bandwidth": 900e9,
        "memory_bytes": 32e9,
        "nvlink_bandwidth": 300e9,
        "source": "NVIDIA Tesla V100 GPU datasheet (SXM2 column), NVIDIA, 2020",
        "url": "https://www.nvidia.com/en-us/data-center/v100/",
    },
    "NVIDIA A100-SXM4-80GB": {
        "fp64_flops": 9.7e12,
        "fp32_flops": 19.5e12,
        "tf32_flops": 156e12,
        "bf16_flops": 312e12,
        "fp16_flops": 312e12,
        "memory_bandwidth": 2.039e12,
        "memory_bytes": 80e9,
        "nvlink_bandwidth": 600e9,
        "source": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column), NVIDIA, 2021",
        "url": "https://www.nvidia.com/en-us/data-center/a100/",
    },
}

# FP32 multiply (or add, or fused multiply-add) results per clock per streaming multiprocessor,
# by compute capability. Source: CUDA C++ Programming Guide, "Arithmetic Instructions",
# throughput table, row "32-bit floating-point add, multiply, multiply-add".
FP32_LANES_PER_SM: dict[tuple[int, int], int] = {
    (7, 0): 64,
    (7, 5): 64,
    (8, 0): 64,
    (8, 6): 128,
    (8, 7): 128,
    (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128,
    (12, 0): 128,
}

def fp32_peak_flops(index: int = 0, fma: bool = False, clock_hz: float | None = None) -> float:
    """Derived FP32 CUDA-core (non-tensor-core) peak of GPU ``index``, in FLOP/s.

    ``SMs x FP32 lanes per SM x SM clock``, doubled when ``fma=True`` because a fused multiply-add
    counts as two FLOPs. A kernel of plain multiplies (``x * 2``) can reach only the ``fma=False``
    figure. Lanes per SM come from :data:`FP32_LANES_PER_SM` (CUDA C++ Programming Guide); the
    clock is the maximum SM clock from NVML (:func:`perflab.core.nvml.max_sm_clock_hz`) unless ``clock_hz`` is given.

    Raises:
        RuntimeError: no GPU, an architecture missing from the table, or no clock from NVML.
    """
    if not has_gpu():
        raise RuntimeError("fp32_peak_flops needs a CUDA GPU; this machine has none")
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    if cc not in FP32_LANES_PER_SM:
        raise RuntimeError(f"no FP32 lane count known for compute capability {cc[0]}.{cc[1]}")
    clock = clock_hz if clock_hz is not None else nvml.max_sm_clock_hz(index)
    if clock is None:
        raise RuntimeError("cannot read the SM clock (nvidia-ml-py missing or NVML unavailable); pass clock_hz")
    return props.multi_processor_count * FP32_LANES_PER_SM[cc] * clock * (2 if fma else 1)

def datasheet(name: str | None = None) -> dict[str, Any] | None:
    """Datasheet peaks for a device name (default: GPU 0), or None when the course has none for it."""
    if name is None:
        if not has_gpu():
            return None
        name = torch.cuda.get_device_name(0)
    return DATASHEETS.get(name)
