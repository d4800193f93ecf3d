"""Reading the machine while it works: GPU clocks, power, temperature and utilization, CPU frequency.

Everything here *reads* (through nvidia-ml-py's NVML bindings and Linux's ``/sys`` and ``/proc``);
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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLOCK_EVENT_REASONS", "UtilizationSampler", "cpu_state", "gpu_state", "machine_state"]

# Bits of nvmlDeviceGetCurrentClocksEventReasons (formerly ...ThrottleReasons), NVML reference,
# "Clocks Event Reasons". A set bit says why the SM clock is below its maximum right now.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}


def _nvml_read(fn, *args):
    """Call an NVML getter; None when the driver cannot answer (not supported, no permission)."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def gpu_state(index: int = 0) -> dict[str, Any] | None:
    """What NVML reports about GPU ``index`` right now, or None without a GPU or NVML.

    Returns a dict with ``sm_clock_mhz`` and ``max_sm_clock_mhz`` (current and maximum SM clock),
    ``memory_clock_mhz``, ``power_w`` and ``power_limit_w`` (watts; the enforced limit),
    ``temperature_c`` (degrees Celsius), ``pstate`` (performance state, 0 = fastest),
    ``utilization_pct`` (the ``gpu`` field of ``nvmlDeviceGetUtilizationRates``) and
    ``clock_event_reasons`` (names from :data:`CLOCK_EVENT_REASONS`). A field the driver does not
    expose is None.

    Raises:
        ValueError: ``index`` is negative.
    """
    from .hardware import nvml_handle

    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    handle = nvml_handle(index)
    if handle is None:
        return None
    import pynvml

    power = _nvml_read(pynvml.nvmlDeviceGetPowerUsage, handle)
    limit = _nvml_read(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    util = _nvml_read(pynvml.nvmlDeviceGetUtilizationRates, handle)
    reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask = _nvml_read(reasons_fn, handle) if reasons_fn else None
    return {
        "sm_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "max_sm_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
        "memory_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "power_w": power / 1e3 if power is not None else None,
        "power_limit_w": limit / 1e3 if limit is not None else None,
        "temperature_c": _nvml_read(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        "pstate": _nvml_read(pynvml.nvmlDeviceGetPerformanceState, handle),
        "utilization_pct": util.gpu if util is not None else None,
        "clock_event_reasons": None if mask is None else
        [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit],
    }


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
    ``driver`` (``scaling_driver``), ``cur_mhz`` (the current frequency of each core from
    ``/proc/cpuinfo``), ``cores`` (``os.cpu_count()``) and ``load_avg_1min`` (run-queue length
    averaged over the last minute: other work competing for the cores).
    """
    base = "/sys/devices/system/cpu/cpu0/cpufreq/"
    mhz = []
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("cpu MHz"):
            try:
                mhz.append(float(line.split(":", 1)[1]))
            except ValueError:
                pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "governor": _read(base + "scaling_governor"),
        "driver": _read(base + "scaling_driver"),
        "cur_mhz": mhz or None,
        "cores": os.cpu_count(),
        "load_avg_1min": load,
        "governors_seen": sorted({_read(p) for p in glob.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")}
                                 - {None}) or None,
    }


def machine_state(index: int = 0) -> dict[str, Any]:
    """``{"gpu": gpu_state(index), "cpu": cpu_state()}``: the state a benchmark ran in."""
    return {"gpu": gpu_state(index), "cpu": cpu_state()}


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

    def _run(self, handle):
        import pynvml

        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "UtilizationSampler":
        from .hardware import nvml_handle

        handle = nvml_handle(self.index)
        if handle is None:
            raise RuntimeError("UtilizationSampler needs NVML (an NVIDIA GPU, its driver and nvidia-ml-py); "
                               "none is readable here")
        self.samples.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(handle,), daemon=True)
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
        import statistics

        vals = self.values(skip_s=1.0)
        if not vals:
            raise ValueError("no utilization readings after the first second: run the loop longer")
        return float(statistics.median(vals))
