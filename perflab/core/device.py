"""Device facts: which device to use, how big to make problems, and what the chip can do.

Everything here *reads* the machine (through torch, ``/proc/cpuinfo`` via :func:`cpuinfo`, and for
NVIDIA GPUs :mod:`perflab.core.nvml`); nothing changes clocks, power limits or modes. Datasheet figures are kept in :data:`DATASHEETS` with their
source, so a chapter can show *achieved / datasheet* with the citation beside it.
"""

from __future__ import annotations

import glob
import os
import platform
from pathlib import Path
from typing import Any, TypeVar

import torch

from perflab.core import nvml
from perflab.core.validate import number

T = TypeVar("T")

__all__ = ["cpu_clock_readings", "cpu_clocks_mhz", "cpu_name", "cpuinfo", "describe", "device", "gpu_count", "has_gpu", "need_gpu",
           "pick", "requires_gpu"]


def has_gpu() -> bool:
    """True when torch sees at least one CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def need_gpu(what: str) -> None:
    """Raise when there is no CUDA GPU: for a function that cannot run on a CPU (a page's cell
    asks :func:`requires_gpu` instead, which prints a sentence and lets the page go on).

    Raises:
        RuntimeError: no CUDA GPU; the message names ``what``.
    """
    if not has_gpu():
        raise RuntimeError(f"{what} needs a CUDA GPU; this machine has none")


def gpu_count() -> int:
    """Number of CUDA devices torch sees (0 on a CPU-only machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device(index: int = 0) -> torch.device:
    """The device a notebook should use: ``cuda:index`` when a GPU is present, else ``cpu``.

    Raises:
        ValueError: ``index`` is negative or names a GPU this machine does not have.
    """
    number("index", index, minimum=0)
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

    Usage in a notebook: ``if perflab.core.device.requires_gpu(): ...``. On a machine without the
    GPUs the cell prints its reason and does nothing else; the book keeps the reference run's
    output. ``capability=(8, 9)`` with ``feature="FP8 tensor cores"`` gates a cell on Ada/Hopper
    or newer: on an A100 (8.0) it prints that the GPU lacks the feature instead of raising.

    Raises:
        ValueError: ``count`` is smaller than 1, or ``capability`` is not a (major, minor) pair.
    """
    number("count", count, minimum=1)
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


def cpu_clock_readings() -> tuple[list[float] | None, str | None]:
    """Each logical CPU's current clock in MHz and where it was read: the one reading of the
    CPU's clock. cpufreq's ``scaling_cur_freq`` where the kernel has it (``"cpufreq"``), else the
    ``cpu MHz`` lines of :func:`cpuinfo` (``"/proc/cpuinfo"``: in a virtual machine often one
    nominal figure repeated, see :func:`perflab.core.sampler.cpu_clock_readable`), else
    ``(None, None)`` (Arm kernels, macOS, Windows)."""
    mhz = []
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq")):
        try:
            khz = Path(path).read_text().strip()
        except OSError:
            continue
        if khz.isdigit():
            mhz.append(int(khz) / 1e3)
    if mhz:
        return mhz, "cpufreq"
    for block in cpuinfo():
        try:
            mhz.append(float(block["cpu MHz"]))
        except (KeyError, ValueError):
            pass
    return (mhz, "/proc/cpuinfo") if mhz else (None, None)


def cpu_clocks_mhz() -> list[float] | None:
    """Each logical CPU's current clock in MHz (:func:`cpu_clock_readings` without its source),
    or None where the OS reports none."""
    return cpu_clock_readings()[0]


def cpu_name() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo`` on Linux), else ``platform.processor()``."""
    for block in cpuinfo():
        if block.get("model name"):
            return block["model name"]
    return platform.processor() or platform.machine() or "unknown CPU"


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
