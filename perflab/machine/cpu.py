"""The CPU side of the machine: caches the OS reports, threads, memory bandwidth, matmul scaling.

Everything here measures the host processor with PyTorch CPU tensors, so the numbers describe
what a data loader, an optimizer step on CPU, or a pageable host-to-device copy can expect.
Measurements reuse :mod:`perflab.machine.roofline` (the copy and matmul ceilings) under a chosen number
of intra-op threads; nothing here changes CPU frequency or power states. Units: bytes, bytes/s,
FLOP/s, Hz.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from perflab.core.device import cpu_clocks_mhz, cpuinfo
from perflab.core.validate import integer, number, positive, positive_int
from perflab.machine.roofline import copy_bandwidth, matmul_rate

__all__ = [
    "CacheLevel",
    "bf16_matmul_unit",
    "cpu_flags",
    "cache_levels",
    "clock_hz",
    "core_shares",
    "core_times",
    "default_thread_counts",
    "matmul_thread_scaling",
    "memory_bandwidth",
    "peak_flops_estimate",
    "physical_cores",
    "simd_fp32_lanes",
    "threads",
]

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class CacheLevel:
    """One cache of CPU 0 as the operating system reports it.

    Attributes:
        level: 1, 2, 3, ...
        kind: ``"Data"``, ``"Instruction"`` or ``"Unified"``.
        size_bytes: capacity in bytes.
        shared_by: how many logical CPUs share this cache (1 = private to one core).
        line_bytes: cache-line size in bytes (None when the OS does not say).
    """

    level: int
    kind: str
    size_bytes: int
    shared_by: int
    line_bytes: int | None = None

    @property
    def name(self) -> str:
        """Short name such as ``"L1d"``, ``"L2"``, ``"L3"``."""
        suffix = {"Data": "d", "Instruction": "i"}.get(self.kind, "")
        return f"L{self.level}{suffix}"


def _parse_size(text: str) -> int:
    """``"32K"`` -> 32768, ``"1024K"`` -> 1048576, ``"32M"`` -> 33554432, ``"512"`` -> 512."""
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in mult:
        return int(text[:-1]) * mult[text[-1]]
    return int(text)


def _count_cpus(cpu_list: str) -> int:
    """Number of CPUs in a Linux cpu list such as ``"0-3,8,10-11"``."""
    count = 0
    for part in cpu_list.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += (int(hi) - int(lo) + 1) if hi else 1
    return count


def cache_levels(sysfs: str | os.PathLike | None = None) -> list[CacheLevel]:
    """The caches of CPU 0 as the OS reports them, smallest level first.

    Reads Linux's ``/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size,shared_cpu_list,
    coherency_line_size}`` (``sysfs`` points elsewhere, for tests). On other systems, or where the
    files are missing, returns an empty list: callers print one line saying the OS did not report.
    """
    root = Path(sysfs) if sysfs is not None else _SYSFS_CACHE
    out = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        try:
            shared = _count_cpus((index / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            shared = 1
        try:
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            line = None
        out.append(CacheLevel(level, kind, size, shared, line))
    return sorted(out, key=lambda c: (c.level, c.kind != "Data"))


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[int]:
    """Run the ``with`` block with PyTorch using ``count`` intra-op threads; restore afterwards.

    ``count=None`` keeps the current setting. Yields the number of threads in effect.

    Raises:
        ValueError: ``count`` is not a positive integer.
    """
    before = torch.get_num_threads()
    if count is None:
        yield before
        return
    positive_int("count", count)
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)


def physical_cores(sysfs: str | os.PathLike | None = None) -> int | None:
    """Physical cores among the logical CPUs the OS lists: distinct ``thread_siblings_list``
    sets under ``/sys/devices/system/cpu/cpu*/topology`` (two logical CPUs of one core share
    its FMA units under simultaneous multithreading); None where the OS does not say.

    Args:
        sysfs: the ``cpu`` directory (default ``/sys/devices/system/cpu``; for tests).
    """
    root = Path(sysfs) if sysfs is not None else Path("/sys/devices/system/cpu")
    sets = set()
    for cpu_dir in root.glob("cpu[0-9]*"):
        f = cpu_dir / "topology" / "thread_siblings_list"
        if f.exists():
            sets.add(f.read_text().strip())
    return len(sets) or None


def default_thread_counts(maximum: int | None = None) -> list[int]:
    """1, 2, 4, ... up to ``maximum`` (default: PyTorch's current thread count), ``maximum`` included.

    Raises:
        ValueError: ``maximum`` < 1.
    """
    top = torch.get_num_threads() if maximum is None else maximum
    number("maximum", top, minimum=1)
    counts = []
    t = 1
    while t < top:
        counts.append(t)
        t *= 2
    counts.append(top)
    return counts


def memory_bandwidth(nbytes: int, num_threads: int | None = None) -> float:
    """Host memory bandwidth in bytes/s: a float32 ``dst.copy_(src)`` of ``nbytes`` per tensor.

    Bytes read plus bytes written are counted (``2 * nbytes`` per copy), as in McCalpin's STREAM
    "Copy" kernel. Pick ``nbytes`` several times the last-level cache so that the copy streams from
    DRAM. ``num_threads`` sets PyTorch's intra-op threads for the measurement (None: as is).
    Timing: :func:`perflab.machine.roofline.copy_bandwidth` (``torch.utils.benchmark`` on CPU).

    Raises:
        ValueError: ``nbytes`` smaller than 4 or not a multiple of 4; a bad ``num_threads``.
    """
    integer("nbytes", nbytes, 4, multiple_of=4)
    with threads(num_threads):
        return copy_bandwidth("cpu", nbytes // 4, torch.float32)


def matmul_thread_scaling(
    n: int,
    thread_counts: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[tuple[int, float]]:
    """FLOP/s of an ``n x n @ n x n`` CPU matrix product at each thread count: ``[(threads, FLOP/s)]``.

    ``2 n^3`` FLOPs per product (:func:`perflab.machine.roofline.matmul_rate`). Default thread counts:
    :func:`default_thread_counts`.

    Raises:
        ValueError: ``n`` not a positive integer, or an empty or invalid ``thread_counts``.
    """
    counts = list(thread_counts) if thread_counts is not None else default_thread_counts()
    if not counts:
        raise ValueError("thread_counts must not be empty")
    out = []
    for t in counts:
        with threads(t):
            out.append((t, matmul_rate("cpu", n, dtype)))
    return out


def cpu_flags() -> set[str]:
    """The instruction-set flags the CPU advertises (``flags`` in ``/proc/cpuinfo`` on x86,
    ``Features`` on Arm, read by :func:`perflab.core.device.cpuinfo`); an empty set where the OS
    does not say."""
    for block in cpuinfo():
        text = block.get("flags", block.get("Features"))
        if text is not None:
            return set(text.split())
    return set()


def simd_fp32_lanes(flags: set[str] | None = None) -> int:
    """float32 lanes of the widest SIMD unit the CPU advertises: 16 (AVX-512), 8 (AVX/AVX2), 4.

    Read from the ``flags`` line of ``/proc/cpuinfo`` (x86) or ``Features`` (Arm: NEON is 4 lanes;
    SVE's width is not in the flags, so 4 is a lower bound there). Pass ``flags`` to test.
    """
    flags = cpu_flags() if flags is None else set(flags)
    if "avx512f" in flags:
        return 16
    if "avx2" in flags or "avx" in flags:
        return 8
    return 4


def bf16_matmul_unit(flags: set[str] | None = None) -> str | None:
    """The CPU's bf16 matrix hardware, from its flags: ``"amx_bf16"`` (Intel AMX tiles),
    ``"avx512_bf16"`` (dot-product instructions doing twice the FLOPs of an fp32 FMA per lane
    pair), or None (bf16 is converted to fp32 and gains nothing). Pass ``flags`` to test."""
    flags = cpu_flags() if flags is None else set(flags)
    for unit in ("amx_bf16", "avx512_bf16"):
        if unit in flags:
            return unit
    return None


def clock_hz() -> float | None:
    """The CPU's maximum clock in Hz as the OS reports it, or None.

    Prefers ``/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq`` (kHz); virtual machines
    often lack it, and then the first core's current clock
    (:func:`perflab.core.device.cpu_clocks_mhz`) is used.
    """
    try:
        return float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) * 1e3
    except (OSError, ValueError):
        pass
    mhz = cpu_clocks_mhz()
    return mhz[0] * 1e6 if mhz else None


def peak_flops_estimate(cores: int = 1, fma_units: int = 2, clock: float | None = None,
                        lanes: int | None = None) -> float:
    """First-principles upper bound on float32 FLOP/s: ``cores x lanes x 2 (FMA) x fma_units x clock``.

    A fused multiply-add counts as 2 FLOPs; ``lanes`` defaults to :func:`simd_fp32_lanes` and
    ``clock`` to :func:`clock_hz`. Two FMA units per core is an *assumption* that holds for most
    recent server cores at their native width; some (e.g. AMD Zen 4) run 512-bit instructions as
    two 256-bit halves, which halves the true figure, so treat the result as an upper bound.

    Raises:
        ValueError: a non-positive ``cores``, ``fma_units``, ``clock`` or ``lanes``.
        RuntimeError: no ``clock`` given and the OS reports none.
    """
    number("cores", cores, minimum=1)
    number("fma_units", fma_units, minimum=1)
    lanes = simd_fp32_lanes() if lanes is None else lanes
    number("lanes", lanes, minimum=1)
    if clock is None:
        clock = clock_hz()
        if clock is None:
            raise RuntimeError("the OS reports no CPU clock; pass clock= in Hz")
    positive("clock", clock)
    return cores * lanes * 2 * fma_units * clock


#: The fields of a ``cpuN`` line of ``/proc/stat``, in order (USER_HZ ticks since boot).
PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def core_times(text: str | None = None) -> dict[int, dict[str, int]]:
    """Ticks each core spent in each state since boot, from ``/proc/stat`` (Linux; ``text``
    replaces the file's contents, for tests): ``{core: {"user": ticks, ...}}``
    (:data:`PROC_STAT_FIELDS`). Two readings bracket a window (:func:`core_shares`). Empty
    where there is no ``/proc/stat``."""
    if text is None:
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return {}
    out = {}
    for line in text.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            out[int(name[3:])] = dict(zip(PROC_STAT_FIELDS, (int(v) for v in values)))
    return out


def core_shares(before: dict, after: dict, cores: Sequence[int]) -> dict[str, float] | None:
    """What ``cores`` did between two :func:`core_times` readings, as shares of their ticks:
    ``busy`` (user, nice, system, irq, softirq), ``steal`` (time the hypervisor ran something
    else while the core had work: on a VM, lost time) and ``iowait``; None when no tick of
    those cores was read (no ``/proc/stat``, unknown cores, or no time passed).

    Raises:
        ValueError: a reading ``after`` with fewer ticks than ``before``.
    """
    sums = dict.fromkeys(PROC_STAT_FIELDS, 0)
    for c in cores:
        if c in before and c in after:
            for k in PROC_STAT_FIELDS:
                d = after[c].get(k, 0) - before[c].get(k, 0)
                if d < 0:
                    raise ValueError(f"core {c}'s {k} ticks went back: {before[c]} -> {after[c]}")
                sums[k] += d
    total = sum(sums.values())
    if not total:
        return None
    busy = sum(sums[k] for k in ("user", "nice", "system", "irq", "softirq"))
    return {"busy": busy / total, "steal": sums["steal"] / total,
            "iowait": sums["iowait"] / total}
