"""Device facts: which device to use, how big to make problems, and what the chip can do.

Everything here *reads* the machine (through torch, ``/proc/cpuinfo`` via :func:`cpuinfo`, and for
NVIDIA GPUs :mod:`perflab.nvml`); nothing changes clocks, power limits or modes. Datasheet figures are kept in :data:`DATASHEETS` with their
source, so a chapter can show *achieved / datasheet* with the citation beside it.
"""

from __future__ import annotations

import os
import platform
from typing import Any, TypeVar

import torch

from . import nvml

T = TypeVar("T")

__all__ = [
    "DATASHEETS",
    "FP32_LANES_PER_SM",
    "cpu_name",
    "cpuinfo",
    "datasheet",
    "describe",
    "device",
    "fp32_peak_flops",
    "gpu_count",
    "has_gpu",
    "pick",
    "requires_gpu",
]

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


def has_gpu() -> bool:
    """True when torch sees at least one CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def gpu_count() -> int:
    """Number of CUDA devices torch sees (0 on a CPU-only machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device(index: int = 0) -> torch.device:
    """The device a notebook should use: ``cuda:index`` when a GPU is present, else ``cpu``.

    Raises:
        ValueError: ``index`` is negative or names a GPU this machine does not have.
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    if not has_gpu():
        return torch.device("cpu")
    if index >= gpu_count():
        raise ValueError(f"index={index} but this machine has {gpu_count()} GPU(s)")
    return torch.device("cuda", index)


def pick(cpu: T, gpu: T) -> T:
    """Choose a problem size (or any setting) by device: ``gpu`` when CUDA is available, else ``cpu``.

    Notebooks call this so that one source runs at full size on a GPU and small on a CPU (CI).
    ``PERFLAB_FORCE_CPU_SIZES=1`` forces the CPU choice (used by tests).
    """
    if os.environ.get("PERFLAB_FORCE_CPU_SIZES") == "1":
        return cpu
    return gpu if has_gpu() else cpu


def requires_gpu(count: int = 1, what: str = "This cell",
                 capability: tuple[int, int] | None = None, feature: str | None = None) -> bool:
    """Return True if ``count`` GPUs are present (of at least compute ``capability``, when
    given); otherwise print one sentence saying why not.

    Usage in a notebook: ``if perflab.hardware.requires_gpu(): ...``. On a machine without the GPUs
    the cell prints its reason and does nothing else; the book keeps the reference run's output.
    ``capability=(8, 9)`` with ``feature="FP8 tensor cores"`` gates a cell on Ada/Hopper or
    newer: on an A100 (8.0) it prints that the GPU lacks the feature instead of raising.

    Raises:
        ValueError: ``count`` is smaller than 1, or ``capability`` is not a (major, minor) pair.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if capability is not None and (len(capability) != 2 or
                                   not all(isinstance(v, int) for v in capability)):
        raise ValueError(f"capability must be a (major, minor) pair, got {capability!r}")
    have = gpu_count()
    if have < count:
        need = "a CUDA GPU" if count == 1 else f"{count} CUDA GPUs"
        where = "this machine has none" if have == 0 else f"this machine has {have}"
        print(f"{what} needs {need} and {where}: skipped here; the book shows the reference "
              "run's output.")
        return False
    if capability is not None:
        got = torch.cuda.get_device_capability(0)
        if tuple(got) < tuple(capability):
            name = torch.cuda.get_device_name(0)
            print(f"{what} needs {feature or 'a newer GPU'} (compute capability "
                  f"{capability[0]}.{capability[1]} or newer) and this {name} has "
                  f"{got[0]}.{got[1]}: skipped here; the book shows the reference run's output.")
            return False
    return True


def cpuinfo() -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one dict per logical CPU (``{"model name": ..., "cpu MHz": ...,
    "flags": ...}``, keys and values as the kernel writes them): the one reader of that file.
    An empty list where the OS has no such file (macOS, Windows)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return []
    blocks = []
    for chunk in text.split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def cpu_name() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo`` on Linux), else ``platform.processor()``."""
    for block in cpuinfo():
        if block.get("model name"):
            return block["model name"]
    return platform.processor() or platform.machine() or "unknown CPU"


def fp32_peak_flops(index: int = 0, fma: bool = False, clock_hz: float | None = None) -> float:
    """Derived FP32 CUDA-core (non-tensor-core) peak of GPU ``index``, in FLOP/s.

    ``SMs x FP32 lanes per SM x SM clock``, doubled when ``fma=True`` because a fused multiply-add
    counts as two FLOPs. A kernel of plain multiplies (``x * 2``) can reach only the ``fma=False``
    figure. Lanes per SM come from :data:`FP32_LANES_PER_SM` (CUDA C++ Programming Guide); the
    clock is the maximum SM clock from NVML (:func:`perflab.nvml.max_sm_clock_hz`) unless ``clock_hz`` is given.

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


def describe(index: int = 0) -> dict[str, Any]:
    """Facts about the machine a notebook runs on, for tables and provenance.

    Returns a dict with ``device`` (name), ``kind`` ("cuda" or "cpu"), and for GPUs:
    ``sm_count``, ``l2_bytes``, ``memory_bytes``, ``compute_capability``, ``max_sm_clock_hz``
    (None if NVML cannot say); for CPUs: ``threads`` (torch intra-op threads) and ``cores``.
    """
    info: dict[str, Any] = {"torch": torch.__version__, "cpu": cpu_name(), "cores": os.cpu_count()}
    if has_gpu():
        props = torch.cuda.get_device_properties(index)
        info.update(
            kind="cuda",
            device=props.name,
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
            max_sm_clock_hz=nvml.max_sm_clock_hz(index),
            gpus=gpu_count(),
        )
    else:
        info.update(kind="cpu", device=cpu_name(), threads=torch.get_num_threads())
    return info
