"""The one sampler: a background thread that reads the machine while a block of work runs.

:class:`Sampler` is that thread (one reading every ``interval_s`` seconds, each kept with its
time); three readers use it:

* :class:`perflab.core.telemetry.Telemetry`: the clocks, power and throttle reasons a benchmark
  ran under, read inside its timed window (its own module).
* :class:`UtilizationSampler`: NVML's "GPU utilization" over a loop (chapter 4).
* :class:`MemoryPeak`: the largest rise of any GPU's used memory while a notebook runs
  (``scripts/execute.py`` records it as ``gpu_memory_peak_bytes``).

Beside them, :func:`cpu_state` and :func:`machine_state` read the machine once (CPU governor and
clocks, NVML's readings). Every GPU reading goes through :mod:`perflab.core.nvml`, the course's
one NVML reader; reading NVML costs tens of microseconds on the host and nothing on the GPU.
Nothing here changes a clock or a limit.
"""

from __future__ import annotations

import glob
import os
import statistics
import threading
from typing import Any, Callable

from perflab.core import nvml
from perflab.core.device import cpu_clock_readings
from perflab.core.timing import Stopwatch
from perflab.core.validate import integer, positive

__all__ = ["cpu_clock_readable", "cpu_state", "machine_state", "MemoryPeak", "Sampler",
           "UtilizationSampler"]

class Sampler:
    """Call ``read()`` every ``interval_s`` seconds in one background thread while a ``with``
    block runs, and once more as the block ends (so a short block still gets a reading).

    Each reading that is not None is kept in :attr:`samples` as ``(t, reading)``, ``t`` in
    seconds since the block started (host clock, :class:`perflab.core.timing.Stopwatch`);
    :attr:`duration_s` is the block's length once it has ended. ``read`` runs in the sampler's
    thread: it must not touch the GPU's streams (NVML and ``/proc`` reads are fine).

    Args:
        read: a callable of no argument returning one reading, or None when there is nothing
            to read this time.
        interval_s: seconds between readings (> 0).
        name: the thread's name (shows in ``py-spy dump`` and tracebacks).

    Raises:
        ValueError: ``interval_s`` is not a positive finite number.

    Example::

        with Sampler(lambda: nvml.utilization_pct(0), interval_s=0.05) as s:
            run_loop()
        print(s.samples[-1])
    """

    def __init__(self, read: Callable[[], Any], interval_s: float = 0.05, name: str = "perflab-sampler"):
        self.read = read
        self.interval_s = positive("interval_s", interval_s)
        self.name = name
        self.samples: list[tuple[float, Any]] = []
        self.duration_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock = Stopwatch()

    def now(self) -> float:
        """Seconds since the block started, on the clock the readings' times use."""
        return self._clock.elapsed()

    def _keep(self) -> None:
        reading = self.read()
        if reading is not None:
            self.samples.append((self._clock.elapsed(), reading))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._keep()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Sampler":
        self.samples.clear()
        self.duration_s = None
        self._stop.clear()
        self._clock.start()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.duration_s = self._clock.elapsed()
        self._keep()


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
    ``driver`` (``scaling_driver``), ``cur_mhz`` (the current frequency of each core, from
    :func:`perflab.core.device.cpu_clock_readings`: cpufreq's ``scaling_cur_freq`` where the
    kernel has it, else the ``cpu MHz`` lines of ``/proc/cpuinfo``), ``clock_source``
    (``"cpufreq"``, ``"/proc/cpuinfo"`` or None), ``cores`` (``os.cpu_count()``) and
    ``load_avg_1min`` (run-queue length averaged over the last minute: other work competing for
    the cores).

    Without cpufreq, a virtual machine's ``/proc/cpuinfo`` usually repeats one nominal figure
    for every core, whatever the cores run at: :func:`cpu_clock_readable` says when the
    readings cannot be trusted as a clock.
    """
    base = "/sys/devices/system/cpu/cpu0/cpufreq/"
    mhz, source = cpu_clock_readings()
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
    """``{"gpu": perflab.core.nvml.readings(index, links=False), "cpu": cpu_state()}``: the state a
    benchmark ran in (``"gpu"`` is None without a GPU or NVML).

    Raises:
        ValueError: ``index`` is negative.
    """
    return {"gpu": nvml.readings(index, links=False), "cpu": cpu_state()}


class UtilizationSampler(Sampler):
    """Sample NVML's GPU utilization (percent) while the ``with`` block runs.

    ``nvmlDeviceGetUtilizationRates(handle).gpu`` is the percent of time over the driver's last
    sample period (between 1/6 s and 1 s depending on the product) during which *any* kernel was
    running: a single one-block kernel on a 132-SM GPU counts as fully busy. Each reading is kept
    as ``(t, percent)`` in :attr:`samples` (:class:`Sampler`).

    Args:
        index: GPU index (>= 0).
        interval_s: seconds between readings (> 0).

    Raises:
        RuntimeError: on entering, when NVML cannot be read (no GPU, no driver, no nvidia-ml-py).
        ValueError: ``interval_s`` is not positive, or ``index`` is negative.

    Example::

        with UtilizationSampler() as util:
            run_loop()
        print(util.median_pct)
    """

    def __init__(self, index: int = 0, interval_s: float = 0.05):
        integer("index", index, minimum=0)
        self.index = index
        super().__init__(lambda: nvml.utilization_pct(self.index), interval_s, "perflab-utilization")

    def __enter__(self) -> "UtilizationSampler":
        if nvml.utilization_pct(self.index) is None:
            raise RuntimeError("UtilizationSampler needs NVML (an NVIDIA GPU, its driver and nvidia-ml-py); "
                               "none is readable here")
        super().__enter__()
        return self

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


class MemoryPeak(Sampler):
    """The largest rise of any GPU's used memory (NVML, bytes, all processes) over its value when
    the ``with`` block started, sampled every ``interval_s`` seconds.

    :attr:`peak` is that rise in bytes (0 when nothing grew), or None where NVML sees no GPU (a
    CPU machine): there is then no thread and nothing to record. Every GPU NVML sees counts, so
    the work of a notebook's kernel and of the processes it starts (torchrun's workers) is
    included; a rise shorter than ``interval_s`` may be missed.

    Args:
        interval_s: seconds between readings (> 0).

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(self, interval_s: float = 0.2):
        super().__init__(self._rise, interval_s, "perflab-memory-peak")
        self._base: list[int] | None = None

    def _used(self) -> list[int] | None:
        used = [nvml.memory_used_bytes(i) for i in range(nvml.device_count())]
        return None if not used or None in used else used

    def _rise(self) -> int | None:
        used = self._used()
        if used is None or self._base is None:
            return None
        return max(u - b for u, b in zip(used, self._base))

    def __enter__(self) -> "MemoryPeak":
        self._base = self._used()
        if self._base is None:
            self.samples.clear()
            return self
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._base is not None:
            super().__exit__(*exc)

    @property
    def peak(self) -> int | None:
        """The largest rise seen, in bytes (>= 0), or None without NVML."""
        if self._base is None:
            return None
        return max([0] + [r for _, r in self.samples])
