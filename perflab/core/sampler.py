"""Telemetry: the clocks, power and throttle reasons a benchmark actually ran under.

A GPU does not run at one speed. The same 8192^3 bf16 matrix product reads ~800 TFLOP/s for
twenty repetitions at 1,980 MHz and ~685 TFLOP/s for three hundred back-to-back repetitions,
when the board reaches its power limit and the driver lowers the SM clock to ~1,500 MHz (NVML
sets the "software power cap" clock-event reason). A number without its clock and duration
cannot be compared with another one, so every headline benchmark of the course runs under a
:class:`Telemetry` sampler and states what it saw.

The sampler is a background thread that reads NVML (:func:`perflab.core.nvml.readings`, the course's
one NVML reader: SM and memory clocks, power, temperature, clock-event reasons) every ``interval_s`` seconds while the ``with``
block runs; on a machine without a GPU it reads the CPU frequency the OS exposes
(``/proc/cpuinfo``), and says which quantities it could not read. Reading NVML costs tens of
microseconds on the host and nothing on the GPU. Nothing here changes a clock or a limit.

NVML reference: ``nvmlDeviceGetClockInfo``, ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetCurrentClocksEventReasons`` (NVIDIA Management Library API reference).
"""

from __future__ import annotations

import glob
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from perflab.core import nvml
from perflab.core.device import cpu_name, cpuinfo
from perflab.core.timing import benchmark

__all__ = ["cpu_state", "machine_state", "measure", "Measurement", "Telemetry", "TelemetrySummary",
           "UtilizationSampler"]

_IDLE = "idle"  # perflab.core.nvml.CLOCK_EVENT_REASONS[0x1]: not a slowdown


def _fmt_int(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


@dataclass(frozen=True)
class TelemetrySummary:
    """What a :class:`Telemetry` sampler saw while its block ran.

    Attributes:
        duration_s: wall-clock seconds the block ran.
        samples: number of readings taken.
        source: ``"NVML"`` (GPU), ``"/proc/cpuinfo"`` (CPU frequency only) or ``"none"``.
        device: GPU name, or the CPU model.
        sm_clock_mhz_median, sm_clock_mhz_min: SM clock over the readings (MHz); on a CPU the
            median/minimum core frequency the OS reports (MHz), or None.
        sm_clock_mhz_max: the chip's maximum SM clock (MHz; NVML's max clock), None on a CPU.
        mem_clock_mhz_median: memory clock (MHz), None on a CPU.
        power_w_max, power_limit_w: highest board power read and the enforced limit (W).
        temperature_c_max: highest GPU temperature read (degrees C).
        reasons: clock-event (throttle) reasons seen in any reading, "idle" left out.
        unavailable: quantities this machine does not expose (e.g. ``["power", "throttle
            reasons"]`` on a CPU).
    """

    duration_s: float
    samples: int
    source: str
    device: str
    sm_clock_mhz_median: float | None = None
    sm_clock_mhz_min: float | None = None
    sm_clock_mhz_max: float | None = None
    mem_clock_mhz_median: float | None = None
    power_w_max: float | None = None
    power_limit_w: float | None = None
    temperature_c_max: float | None = None
    reasons: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = ()

    @property
    def clock_fraction(self) -> float | None:
        """Median SM clock / maximum SM clock (GPU only; None when either is unknown).

        A datasheet peak assumes the boost clock; a rate measured at a lower clock compares with
        ``peak x clock_fraction`` (the clock-normalized peak), because FLOP/s per SM scale with
        the SM clock.
        """
        if not self.sm_clock_mhz_median or not self.sm_clock_mhz_max:
            return None
        return self.sm_clock_mhz_median / self.sm_clock_mhz_max

    def sentence(self) -> str:
        """One sentence stating the clock, power and duration, for a caption or glued prose."""
        if self.source == "NVML":
            clock = (f"SM clock median {_fmt_int(self.sm_clock_mhz_median)} MHz "
                     f"(min {_fmt_int(self.sm_clock_mhz_min)}, "
                     f"chip max {_fmt_int(self.sm_clock_mhz_max)})")
            power = ""
            if self.power_w_max is not None:
                power = f", power up to {_fmt_int(self.power_w_max)} W"
                if self.power_limit_w is not None:
                    power += f" of a {_fmt_int(self.power_limit_w)} W limit"
            reasons = ("; throttle reasons seen: " + ", ".join(self.reasons)
                       if self.reasons else "; no throttle reason seen")
            return (f"measured over {self.duration_s:.2f} s on {self.device}: "
                    f"{clock}{power}{reasons}")
        if self.sm_clock_mhz_median is not None:
            return (f"measured over {self.duration_s:.2f} s on {self.device}: "
                    f"core clock median {_fmt_int(self.sm_clock_mhz_median)} MHz as the OS "
                    f"reports it; power and throttle reasons are not exposed here")
        return (f"measured over {self.duration_s:.2f} s on {self.device}; "
                f"this machine exposes no clock, power or throttle readings")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields plus ``clock_fraction`` and ``sentence``."""
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["unavailable"] = list(self.unavailable)
        d["clock_fraction"] = self.clock_fraction
        d["sentence"] = self.sentence()
        return d


def _gpu_reading(index: int = 0) -> dict[str, Any] | None:
    """One NVML reading of GPU ``index`` in the sampler's units (MHz), or None without NVML."""
    r = nvml.readings(index, links=False)
    if r is None:
        return None
    mhz = lambda v: None if v is None else v / 1e6  # noqa: E731
    return {"sm_clock_mhz": mhz(r["sm_clock_hz"]), "max_sm_clock_mhz": mhz(r["sm_clock_max_hz"]),
            "memory_clock_mhz": mhz(r["mem_clock_hz"]), "power_w": r["power_w"],
            "power_limit_w": r["power_limit_w"], "temperature_c": r["temperature_c"],
            "clock_event_reasons": r["clock_event_reasons"]}


def _cpu_mhz() -> float | None:
    mhz = cpu_state().get("cur_mhz")
    return statistics.median(mhz) if mhz else None


@dataclass
class Telemetry:
    """Sample GPU clocks, power, temperature and throttle reasons while a block runs.

    Args:
        index: GPU index (ignored on a machine without a GPU).
        interval_s: seconds between readings (> 0). 0.02 s gives ~50 readings a second.
        device: the device the measured work runs on. ``"cpu"`` (or a ``torch.device`` of
            type cpu) samples the CPU's clock even on a machine with a GPU: work that runs on
            CPU cores (decoding in DataLoader workers, reading files) must not be captioned
            with an idle GPU's clock. None (default) or a CUDA device: the GPU when present.

    Raises:
        ValueError: ``interval_s`` is not positive, ``index`` is negative, or ``device`` is
            not a device.

    Example::

        with Telemetry() as tel:
            seconds = benchmark(fn)
        print(tel.summary().sentence())
    """

    index: int = 0
    interval_s: float = 0.02
    device: Any = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _t0: float = 0.0
    _t1: float | None = None
    _source: str = "none"

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ValueError(f"device must be a torch device or its name, "
                                 f"got {self.device!r}") from None

    def _read(self) -> dict[str, Any] | None:
        if self._source == "NVML":
            return _gpu_reading(self.index)
        if self._source == "/proc/cpuinfo":
            mhz = _cpu_mhz()
            return None if mhz is None else {"sm_clock_mhz": mhz}
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            reading = self._read()
            if reading is not None:
                reading["t"] = time.perf_counter() - self._t0
                self.samples.append(reading)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Telemetry":
        self.samples.clear()
        self._stop.clear()
        self._t1 = None
        on_cpu = self.device is not None and torch.device(self.device).type == "cpu"
        if not on_cpu and torch.cuda.is_available() and _gpu_reading(self.index) is not None:
            self._source = "NVML"
        elif _cpu_mhz() is not None:
            self._source = "/proc/cpuinfo"
        else:
            self._source = "none"
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="perflab-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._t1 = time.perf_counter()
        reading = self._read()  # one reading at the very end: short blocks still get one
        if reading is not None:
            reading["t"] = self._t1 - self._t0
            self.samples.append(reading)

    def summary(self) -> TelemetrySummary:
        """What was seen, as a :class:`TelemetrySummary`.

        Raises:
            RuntimeError: called before the ``with`` block has finished.
        """
        if self._t1 is None:
            raise RuntimeError("summary() is available after the with-block has finished")
        duration = self._t1 - self._t0
        values = lambda key: [s[key] for s in self.samples if s.get(key) is not None]  # noqa: E731
        clocks = values("sm_clock_mhz")
        if self._source == "NVML":
            device = torch.cuda.get_device_name(self.index)
            maxima = values("max_sm_clock_mhz")
            reasons: list[str] = []
            for s in self.samples:
                for r in s.get("clock_event_reasons") or ():
                    if r != _IDLE and r not in reasons:
                        reasons.append(r)
            power = values("power_w")
            unavailable = [name for name, key in (("power", "power_w"),
                                                  ("temperature", "temperature_c"),
                                                  ("throttle reasons", "clock_event_reasons"))
                           if not values(key)]
            return TelemetrySummary(
                duration_s=duration, samples=len(self.samples), source="NVML", device=device,
                sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
                sm_clock_mhz_min=min(clocks) if clocks else None,
                sm_clock_mhz_max=max(maxima) if maxima else None,
                mem_clock_mhz_median=(statistics.median(values("memory_clock_mhz"))
                                      if values("memory_clock_mhz") else None),
                power_w_max=max(power) if power else None,
                power_limit_w=max(values("power_limit_w")) if values("power_limit_w") else None,
                temperature_c_max=(max(values("temperature_c"))
                                   if values("temperature_c") else None),
                reasons=tuple(reasons), unavailable=tuple(unavailable))
        return TelemetrySummary(
            duration_s=duration, samples=len(self.samples), source=self._source,
            device=cpu_name(),
            sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
            sm_clock_mhz_min=min(clocks) if clocks else None,
            unavailable=("power", "temperature", "throttle reasons")
            + (() if clocks else ("clock",)))


@dataclass(frozen=True)
class Measurement:
    """A timing and the telemetry it ran under.

    Attributes:
        seconds: median seconds of one call (from :func:`perflab.core.timing.benchmark`).
        telemetry: the :class:`TelemetrySummary` of the whole measurement (warm-up included).
    """

    seconds: float
    telemetry: TelemetrySummary

    def rate(self, work: float) -> float:
        """``work / seconds`` (e.g. FLOPs per call -> FLOP/s, bytes per call -> bytes/s).

        Raises:
            ValueError: ``work`` is negative.
        """
        if work < 0:
            raise ValueError(f"work must be >= 0, got {work}")
        return work / self.seconds


def measure(fn: Callable[[], object], device: torch.device | str | None = None,
            min_run_time_s: float = 0.2, index: int | None = None) -> Measurement:
    """Median seconds of one call of ``fn()`` by :func:`perflab.core.timing.benchmark`, under telemetry.

    Args:
        fn: the work, called with no arguments.
        device: where ``fn`` runs (default: CUDA when present).
        min_run_time_s: passed to :func:`~perflab.core.timing.benchmark` (> 0).
        index: GPU to sample (default: ``device``'s index, else 0).

    Raises:
        ValueError: ``min_run_time_s`` is not positive.
    """
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if index is None:
        index = dev.index if (dev.type == "cuda" and dev.index is not None) else 0
    with Telemetry(index=index, device=dev) as tel:   # CPU work: the CPU's clock
        seconds = benchmark(fn, dev, min_run_time_s=min_run_time_s)
    return Measurement(seconds=seconds, telemetry=tel.summary())


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
    for block in cpuinfo():
        try:
            mhz.append(float(block["cpu MHz"]))
        except (KeyError, ValueError):
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
    """``{"gpu": perflab.core.nvml.readings(index, links=False), "cpu": cpu_state()}``: the state a
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
