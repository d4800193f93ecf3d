"""Datasheet figures and the clock model: peak rates and bandwidths from vendor datasheets, with
their sources, and every peak derived from the architecture: FLOP per clock per SM (per number
format, from the architecture whitepapers) x SMs x the SM clock, the clock the datasheet assumes
(:func:`datasheet_clock_hz`) and the DRAM peak from NVML's memory clock and bus width."""

from __future__ import annotations

from typing import Any

import torch

from perflab.core import formats, nvml
from perflab.core.device import has_gpu
from perflab.core.validate import positive, positive_int

__all__ = ["datasheet", "datasheet_clock_hz", "DATASHEETS", "DATASHEET_L2_BYTES",
           "FLOP_PER_CLOCK_PER_SM",
           "FP32_LANES_PER_SM", "fp32_peak_flops", "memory_peak_bandwidth", "peak_at",
           "peak_flops"]


# Peak figures from vendor datasheets, dense (no 2:4 sparsity): the datasheets quote tensor-core
# rates "with sparsity", which are twice the dense rate. Units: FLOP/s and bytes/s. ``sm_count``,
# ``compute_capability`` and ``max_sm_clock_hz`` (the chip's maximum SM clock, from the
# architecture whitepapers) let :func:`datasheet_clock_hz` recover the clock each peak assumes.
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
        "sm_count": 132,
        "compute_capability": (9, 0),
        "max_sm_clock_hz": 1.98e9,
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
        "sm_count": 132,
        "compute_capability": (9, 0),
        "max_sm_clock_hz": 1.98e9,
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
        "sm_count": 80,
        "compute_capability": (7, 0),
        "max_sm_clock_hz": 1.53e9,
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
        "sm_count": 108,
        "compute_capability": (8, 0),
        "max_sm_clock_hz": 1.41e9,
        "source": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column), NVIDIA, 2021",
        "url": "https://www.nvidia.com/en-us/data-center/a100/",
    },
}

#: L2 sizes (bytes) from NVIDIA's architecture whitepapers, by the name CUDA gives the device
#: (``torch.cuda.get_device_name``; the keys of :data:`DATASHEETS`), each with its source. The
#: whitepapers write cache sizes in binary units ("50 MB" is 50 MiB). The H200 has no published
#: L2 figure the course could cite, so it has no entry: a check falls back to the driver's
#: (``L2_cache_size``), as lab 2's :func:`perflab.labs.lab02.l2_reference` does.
DATASHEET_L2_BYTES: dict[str, tuple[int, str]] = {
    "NVIDIA H100 80GB HBM3": (50 * 2**20, "NVIDIA H100 Tensor Core GPU Architecture whitepaper "
                                          "(H100 SXM5: 50 MB of L2), 2022"),
    "NVIDIA A100-SXM4-80GB": (40 * 2**20, "NVIDIA A100 Tensor Core GPU Architecture whitepaper "
                                          "(A100: 40 MB of L2), 2020"),
    "Tesla V100-SXM2-32GB": (6 * 2**20, "NVIDIA Tesla V100 GPU Architecture whitepaper "
                                        "(V100: 6144 KB of L2), 2017"),
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

# The clock model: a GPU's peak at a clock is FLOP per clock per SM (for the number format) x SMs x
# that clock. FLOP per clock per SM, dense (no 2:4 sparsity), a fused multiply-add counted as two
# FLOPs, by compute capability and format key (:data:`perflab.core.formats.FORMATS`). "fp32" (and
# "fp64") are the CUDA cores: 2 x the lanes of :data:`FP32_LANES_PER_SM`; the others are the tensor
# cores. Sources, the architecture whitepapers: Volta (V100): 8 tensor cores per SM, each 64 FP16
# FMA per clock; Ampere (A100): 4 tensor cores per SM, each 256 FP16 FMA per clock, TF32 at half
# that; Hopper (H100, H200): twice the A100 SM's tensor-core rate clock for clock, FP8 twice FP16.
# The datasheets' tensor-core figures follow at a clock below the chip's maximum (see
# :func:`datasheet_clock_hz`): 132 x 4,096 x 1.83 GHz = 989.5 TFLOP/s of dense bf16 on an H100/H200
# SXM, whose SM clock reaches 1.98 GHz.
FLOP_PER_CLOCK_PER_SM: dict[tuple[int, int], dict[str, int]] = {
    (7, 0): {"fp64": 64, "fp32": 128, "fp16": 1024},
    (8, 0): {"fp64": 64, "fp32": 128, "tf32": 1024, "bf16": 2048, "fp16": 2048},
    (9, 0): {"fp64": 128, "fp32": 256, "tf32": 2048, "bf16": 4096, "fp16": 4096, "fp8": 8192},
}


def _flop_per_clock(fmt: str, cc: tuple[int, int]) -> int | None:
    """FLOP per clock per SM of format ``fmt`` on compute capability ``cc``, None if unknown.
    FP32 on a compute capability missing from the table falls back to 2 x its FP32 lanes."""
    table = FLOP_PER_CLOCK_PER_SM.get(tuple(cc), {})
    if fmt in table:
        return table[fmt]
    if fmt == "fp32" and tuple(cc) in FP32_LANES_PER_SM:
        return 2 * FP32_LANES_PER_SM[tuple(cc)]
    return None


def peak_at(fmt: str, sm_count: int, compute_capability: tuple[int, int], clock_hz: float,
            fma: bool = True) -> float | None:
    """The clock model: FLOP per clock per SM of ``fmt`` x ``sm_count`` x ``clock_hz``, in FLOP/s.

    ``fma=False`` halves it: a kernel of plain multiplies (``x * 2``) does one FLOP per
    instruction where a fused multiply-add does two. Returns None when the course has no
    per-SM rate for ``fmt`` on that compute capability (:data:`FLOP_PER_CLOCK_PER_SM`).

    Raises:
        ValueError: an unknown format key, a non-positive SM count or clock.
    """
    formats.check(fmt)
    positive_int("sm_count", sm_count)
    positive("clock_hz", clock_hz)
    per_sm = _flop_per_clock(fmt, compute_capability)
    if per_sm is None:
        return None
    return per_sm * sm_count * float(clock_hz) / (1 if fma else 2)


def peak_flops(fmt: str, clock_hz: float | None = None, index: int = 0,
               fma: bool = True) -> float | None:
    """GPU ``index``'s peak for number format ``fmt`` at ``clock_hz`` (default: its maximum SM
    clock from NVML), in FLOP/s: :func:`peak_at` with this GPU's SMs and compute capability.

    A rate measured at a lower clock compares with ``peak_flops(fmt, clock)`` at the SM clock it
    ran at (:attr:`perflab.core.telemetry.TelemetrySummary.sm_clock_hz`): its efficiency per clock.
    Returns None when the course has no per-SM rate for ``fmt`` on this GPU.

    Raises:
        RuntimeError: no GPU, or no clock given and NVML cannot read the maximum.
        ValueError: an unknown format key or a non-positive clock.
    """
    if not has_gpu():
        raise RuntimeError("peak_flops needs a CUDA GPU; this machine has none")
    props = torch.cuda.get_device_properties(index)
    clock = clock_hz if clock_hz is not None else nvml.max_sm_clock_hz(index)
    if clock is None:
        raise RuntimeError("cannot read the SM clock (nvidia-ml-py missing or NVML unavailable); "
                           "pass clock_hz")
    return peak_at(fmt, props.multi_processor_count, (props.major, props.minor), clock, fma)


def datasheet_clock_hz(name: str, fmt: str) -> float | None:
    """The SM clock a datasheet's peak for ``fmt`` assumes: peak / (SMs x FLOP per clock per SM),
    in Hz; None when the datasheet or the per-SM rate is missing. For an H200 this gives 1.83 GHz
    for the tensor cores (bf16 989.5 TFLOP/s) and 1.98 GHz for FP32 (67 TFLOP/s).

    Raises:
        ValueError: an unknown format key.
    """
    sheet = DATASHEETS.get(name)
    if not sheet or f"{fmt}_flops" not in sheet or "sm_count" not in sheet:
        return None
    per_sm = _flop_per_clock(fmt, sheet["compute_capability"])
    if per_sm is None:
        return None
    return sheet[f"{fmt}_flops"] / (per_sm * sheet["sm_count"])


def memory_peak_bandwidth(index: int = 0) -> float | None:
    """GPU ``index``'s DRAM peak in bytes/s from NVML: two transfers per memory clock (DDR) x the
    bus width; None without NVML. On the course's H200, NVML reports a 3,201 MHz memory clock
    and a 6,016-bit bus (chapter 2's GPU page prints both readings; the reference run of
    3 December 2026 read those values): 3,201 MHz x 2 x 6,016 bits / 8 = 4.81 TB/s, the
    datasheet's 4.8 TB/s (``nvidia2024h200`` in ``bib/``). The copy bandwidth of the run's
    ceilings is what a kernel reaches; this is the roof no DRAM traffic can pass.
    """
    r = nvml.readings(index, links=False)
    if not r or not r.get("mem_clock_max_hz") or not r.get("memory_bus_width_bits"):
        return None
    return 2 * r["mem_clock_max_hz"] * r["memory_bus_width_bits"] / 8


def datasheet(name: str | None = None) -> dict[str, Any] | None:
    """Datasheet peaks for a device name (default: GPU 0), or None when the course has none for it."""
    if name is None:
        if not has_gpu():
            return None
        name = torch.cuda.get_device_name(0)
    return DATASHEETS.get(name)
