"""Reading the machine while it works: GPU clocks, power, temperature and utilization, CPU frequency.

Everything here *reads* (GPUs through :mod:`perflab.nvml`, the one NVML reader; CPUs through Linux's
``/sys`` and :func:`perflab.hardware.cpuinfo`);
nothing sets a clock, a power limit or a governor. A benchmark is only reproducible when the state
it ran in is known, so chapters print :func:`machine_state` beside their numbers.

NVML semantics (NVIDIA Management Library reference, ``nvmlDeviceGetUtilizationRates``):
``gpu`` utilization is the percent of time over the past sample period during which one or more
kernels was executing on the GPU, which is why it says nothing about how many SMs those kernels
kept busy (:class:`UtilizationSampler`).
"""

from __future__ import annotations

import glob
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import nvml
from .hardware import cpuinfo

__all__ = ["UtilizationSampler", "cpu_clock_readable", "cpu_state", "machine_state"]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_state() -> dict[str, Any]:
    """The CPU's frequency policy as Linux exposes it (read from ``/sys`` and ``/proc``).

    Returns a dict with ``governor`` (``scaling_governor`` of cpu0, e.g. ``"performance"`` or
    ``"powersave"``; None where the kernel exposes no cpufreq, as in most containers and VMs),
    ``driver`` (``scaling_driver``), ``cur_mhz`` (the current frequency of each core: cpufreq's
    ``scaling_cur_freq`` where the kernel has it, else the ``cpu MHz`` lines of
    ``/proc/cpuinfo``), ``clock_source`` (``"cpufreq"``, ``"/proc/cpuinfo"`` or None),
    ``cores`` (``os.cpu_count()``) and ``load_avg_1min`` (run-queue length averaged over the last
    minute: other work competing for the cores).

    Without cpufreq, a virtual machine's ``/proc/cpuinfo`` usually repeats one nominal figure
    for every core, whatever the cores run at: :func:`cpu_clock_readable` says when the
    readings cannot be trusted as a clock.
    """
    base = "/sys/devices/system/cpu/cpu0/cpufreq/"
    mhz = []
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq")):
        khz = _read(path)
        if khz and khz.isdigit():
            mhz.append(int(khz) / 1e3)
    source = "cpufreq" if mhz else None
    if not mhz:
        for block in cpuinfo():
            try:
                mhz.append(float(block["cpu MHz"]))
            except (KeyError, ValueError):
                pass
        source = "/proc/cpuinfo" if mhz else None
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "governor": _read(base + "scaling_governor"),
        "driver": _read(base + "scaling_driver"),
        "cur_mhz": mhz or None,
        "clock_source": source,
        "cores": os.cpu_count(),
        "load_avg_1min": load,
        "governors_seen": sorted({_read(p) for p in glob.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")}
                                 - {None}) or None,
    }


def cpu_clock_readable(source: str | None, readings: list[float]) -> bool:
    """Whether CPU clock readings say what the cores run at.

    cpufreq's readings do. ``/proc/cpuinfo`` readings do only when they vary (across cores or
    over time): a virtual machine without cpufreq reports one constant, the host's nominal
    frequency, on every core whatever the cores do (turbo, power limits), so a constant
    ``/proc/cpuinfo`` figure is no reading of the clock.

    Args:
        source: ``"cpufreq"``, ``"/proc/cpuinfo"`` or None (:func:`cpu_state`'s ``clock_source``).
        readings: every MHz value read (all cores, all samples).
    """
    if not readings or source is None:
        return False
    return source == "cpufreq" or len(set(readings)) > 1


def machine_state(index: int = 0) -> dict[str, Any]:
    """``{"gpu": perflab.nvml.readings(index, links=False), "cpu": cpu_state()}``: the state a
    benchmark ran in (``"gpu"`` is None without a GPU or NVML).

    Raises:
        ValueError: ``index`` is negative.
    """
    return {"gpu": nvml.readings(index, links=False), "cpu": cpu_state()}


@dataclass
class UtilizationSampler:
    """Sample NVML's GPU utilization in a background thread while the ``with`` block runs.

    ``nvmlDeviceGetUtilizationRates(handle).gpu`` is the percent of time over the driver's last
    sample period (between 1/6 s and 1 s depending on the product) during which *any* kernel was
    running: a single one-block kernel on a 132-SM GPU counts as fully busy. Each reading is kept
    with its time (``time.perf_counter`` seconds) in :attr:`samples`.

    Args:
        index: GPU index.
        interval_s: seconds between readings (> 0).

    Raises:
        RuntimeError: on entering, when NVML cannot be read (no GPU, no driver, no nvidia-ml-py).
        ValueError: ``interval_s`` is not positive.

    Example::

        with UtilizationSampler() as util:
            run_loop()
        print(util.median_pct)
    """

    index: int = 0
    interval_s: float = 0.05
    samples: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self):
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self):
        while not self._stop.is_set():
            pct = nvml.utilization_pct(self.index)
            if pct is not None:
                self.samples.append((time.perf_counter(), pct))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "UtilizationSampler":
        if nvml.utilization_pct(self.index) is None:
            raise RuntimeError("UtilizationSampler needs NVML (an NVIDIA GPU, its driver and nvidia-ml-py); "
                               "none is readable here")
        self.samples.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def values(self, skip_s: float = 0.0) -> list[int]:
        """Readings (percent) taken at least ``skip_s`` seconds after the first one."""
        if not self.samples:
            return []
        t0 = self.samples[0][0]
        return [v for t, v in self.samples if t - t0 >= skip_s]

    @property
    def median_pct(self) -> float:
        """Median reading in percent, skipping the first second (the driver's window still
        covers the time before the loop started).

        Raises:
            ValueError: fewer than one reading after the first second.
        """
        vals = self.values(skip_s=1.0)
        if not vals:
            raise ValueError("no utilization readings after the first second: run the loop longer")
        return float(statistics.median(vals))
