"""The one sampler: a background thread that reads the machine while a block of work runs.

:class:`Sampler` is that thread (one reading every ``interval_s`` seconds, each kept with its
time); three readers use it:

* :class:`Telemetry`: the clocks, power and throttle reasons a benchmark actually ran under. A
  GPU does not run at one speed: the same 8192^3 bf16 matrix product reads ~800 TFLOP/s for
  twenty repetitions at 1,980 MHz and ~685 TFLOP/s for three hundred back-to-back repetitions,
  when the board reaches its power limit and the driver lowers the SM clock to ~1,500 MHz (NVML
  sets the "software power cap" clock-event reason). A number without its clock and duration
  cannot be compared with another one, so every headline benchmark of the course runs under
  :class:`Telemetry` (or :func:`measure`) and states what it saw. Without a GPU it reads the
  CPU's clock (:func:`perflab.core.device.cpu_clock_readings`) and says what it could not read.
* :class:`UtilizationSampler`: NVML's "GPU utilization" over a loop (chapter 4).
* :class:`MemoryPeak`: the largest rise of any GPU's used memory while a notebook runs
  (``scripts/execute.py`` records it as ``gpu_memory_peak_bytes``).

Beside them, :func:`cpu_state` and :func:`machine_state` read the machine once (CPU governor and
clocks, NVML's readings). Every GPU reading goes through :mod:`perflab.core.nvml`, the course's
one NVML reader (SM and memory clocks, power, temperature, clock-event reasons); reading NVML
costs tens of microseconds on the host and nothing on the GPU. Nothing here changes a clock or a
limit.

What a sentence states depends on the work (``work=``): an SM clock belongs only to work the SMs
do (``"sm"``: arithmetic); a memory-bound kernel's rate follows the memory clock (``"memory"``);
a transfer between host and GPU (``"link"``: PCIe, NVLink) or a disk read follows no GPU clock at
all. Power is stated as what NVML gives: the instantaneous field where the driver has it, else
``nvmlDeviceGetPowerUsage``, which on Ampere and newer GPUs (GA100 aside) is a one-second
average. A CPU whose clock the OS does not expose (a virtual machine's constant
``/proc/cpuinfo`` figure) is said to have no readable clock.

NVML reference: ``nvmlDeviceGetClockInfo``, ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetFieldValues`` (``NVML_FI_DEV_POWER_INSTANT``),
``nvmlDeviceGetCurrentClocksEventReasons`` (NVIDIA Management Library API reference).
"""

from __future__ import annotations

import glob
import os
import statistics
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from perflab.core import nvml
from perflab.core.device import cpu_clock_readings, cpu_name
from perflab.core.timing import Stopwatch, benchmark
from perflab.core.validate import positive

__all__ = ["WORK", "cpu_clock_readable", "cpu_state", "machine_state", "measure", "Measurement",
           "MemoryPeak", "Sampler", "Telemetry", "TelemetrySummary", "UtilizationSampler"]

_IDLE = "idle"  # perflab.core.nvml.CLOCK_EVENT_REASONS[0x1]: not a slowdown

#: What kind of work a measurement times, and so which clock its sentence states.
WORK = {
    "sm": "arithmetic on the SMs: its rate follows the SM clock",
    "memory": "memory traffic: its rate follows the memory clock, not the SM clock",
    "link": "a transfer between host and GPU: no GPU clock sets its rate",
}


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
        work: ``"sm"``, ``"memory"`` or ``"link"`` (:data:`WORK`) on a GPU, ``"cpu"`` on a CPU.
        power_kind: ``"instantaneous"`` (NVML's instantaneous field) or ``"1 s average"``
            (``nvmlDeviceGetPowerUsage`` on Ampere and newer), None without power readings.
        cpu_clock_readable: on a CPU, False when the OS gives no reading of the clock (no
            cpufreq and a constant ``/proc/cpuinfo`` figure, as in most virtual machines).
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
    work: str = "sm"
    power_kind: str | None = None
    cpu_clock_readable: bool = True

    @property
    def sm_clock_hz(self) -> float | None:
        """The median SM clock in Hz (GPU only), the clock the clock model's peak takes:
        :func:`perflab.machine.datasheets.peak_flops` ``(fmt, summary.sm_clock_hz)``."""
        if self.source != "NVML" or not self.sm_clock_mhz_median:
            return None
        return self.sm_clock_mhz_median * 1e6

    @property
    def clock_fraction(self) -> float | None:
        """Median SM clock / maximum SM clock (GPU only; None when either is unknown).

        Not a normalization of a datasheet peak: datasheet tensor-core peaks assume a clock
        below the maximum (1.83 of 1.98 GHz on an H100/H200 SXM). The clock-normalized peak is
        :func:`perflab.machine.datasheets.peak_flops` at :attr:`sm_clock_hz`.
        """
        if not self.sm_clock_mhz_median or not self.sm_clock_mhz_max:
            return None
        return self.sm_clock_mhz_median / self.sm_clock_mhz_max

    def _power(self) -> str:
        if self.power_w_max is None:
            return ""
        kind = {"instantaneous": " (instantaneous)",
                "1 s average": " (NVML's one-second average)"}.get(self.power_kind or "", "")
        text = f", board power up to {_fmt_int(self.power_w_max)} W{kind}"
        if self.power_limit_w is not None:
            text += f" of a {_fmt_int(self.power_limit_w)} W limit"
        return text

    def sentence(self) -> str:
        """One sentence stating the clock that sets the work's rate, power and duration, for a
        caption or glued prose."""
        head = f"measured over {self.duration_s:.2f} s on {self.device}"
        if self.source == "NVML":
            sm = (f"SM clock median {_fmt_int(self.sm_clock_mhz_median)} MHz "
                  f"(min {_fmt_int(self.sm_clock_mhz_min)}, "
                  f"chip max {_fmt_int(self.sm_clock_mhz_max)})")
            reasons = ("; clock-event reasons seen: " + ", ".join(self.reasons)
                       if self.reasons else "; no clock-event reason seen")
            if self.work == "memory":
                return (f"{head}: memory traffic, whose rate follows the memory clock "
                        f"({_fmt_int(self.mem_clock_mhz_median)} MHz), not the SM clock"
                        f"{self._power()}")
            if self.work == "link":
                return (f"{head}: a transfer between host and GPU, whose rate no GPU clock "
                        f"sets{self._power()}")
            return f"{head}: {sm}{self._power()}{reasons}"
        if self.sm_clock_mhz_median is not None and self.cpu_clock_readable:
            return (f"{head}: core clock median {_fmt_int(self.sm_clock_mhz_median)} MHz as "
                    "the OS reports it; power and throttle reasons are not exposed here")
        if self.sm_clock_mhz_median is not None:
            return (f"{head}; the CPU clock cannot be read here (no cpufreq, and "
                    f"/proc/cpuinfo repeats a constant {_fmt_int(self.sm_clock_mhz_median)} "
                    "MHz, a virtual machine's nominal figure), nor power")
        return f"{head}; this machine exposes no clock, power or throttle readings"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields plus ``clock_fraction`` and ``sentence``."""
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["unavailable"] = list(self.unavailable)
        d["clock_fraction"] = self.clock_fraction
        d["sentence"] = self.sentence()
        return d


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


def _gpu_reading(index: int = 0) -> dict[str, Any] | None:
    """One NVML reading of GPU ``index`` in the sampler's units (MHz), or None without NVML."""
    r = nvml.readings(index, links=False)
    if r is None:
        return None
    mhz = lambda v: None if v is None else v / 1e6  # noqa: E731
    instant = r.get("power_instant_w")
    return {"sm_clock_mhz": mhz(r["sm_clock_hz"]), "max_sm_clock_mhz": mhz(r["sm_clock_max_hz"]),
            "memory_clock_mhz": mhz(r["mem_clock_hz"]),
            "power_w": instant if instant is not None else r["power_w"],
            "power_kind": ("instantaneous" if instant is not None
                           else "1 s average" if r["power_w"] is not None else None),
            "power_limit_w": r["power_limit_w"], "temperature_c": r["temperature_c"],
            "clock_event_reasons": r["clock_event_reasons"]}


def _cpu_reading() -> dict[str, Any] | None:
    """The CPU's clock readings now: ``{"sm_clock_mhz": median, "cpu_mhz": every core's,
    "clock_source": ...}``, or None where the OS gives none."""
    state = cpu_state()
    mhz = state.get("cur_mhz")
    if not mhz:
        return None
    return {"sm_clock_mhz": statistics.median(mhz), "cpu_mhz": list(mhz),
            "clock_source": state.get("clock_source")}


def _cpu_mhz() -> float | None:
    r = _cpu_reading()
    return None if r is None else r["sm_clock_mhz"]


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
        work: on a GPU, what the timed work is (:data:`WORK`): ``"sm"`` (default, arithmetic:
            the SM clock is stated), ``"memory"`` (memory-bound: the memory clock) or
            ``"link"`` (host <-> GPU transfers: no GPU clock).

    Raises:
        ValueError: ``interval_s`` is not positive, ``index`` is negative, ``device`` is
            not a device, or ``work`` is not a key of :data:`WORK`.

    Example::

        with Telemetry() as tel:
            seconds = benchmark(fn)
        print(tel.summary().sentence())
    """

    index: int = 0
    interval_s: float = 0.02
    device: Any = None
    work: str = "sm"
    samples: list[dict[str, Any]] = field(default_factory=list)
    _sampler: Sampler | None = field(default=None, repr=False)
    _source: str = "none"

    def __post_init__(self) -> None:
        positive("interval_s", self.interval_s)
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        if self.work not in WORK:
            raise ValueError(f"work must be one of {sorted(WORK)}, got {self.work!r}")
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
            return _cpu_reading()
        return None

    def __enter__(self) -> "Telemetry":
        self.samples.clear()
        on_cpu = self.device is not None and torch.device(self.device).type == "cpu"
        if not on_cpu and torch.cuda.is_available() and _gpu_reading(self.index) is not None:
            self._source = "NVML"
        elif _cpu_mhz() is not None:
            self._source = "/proc/cpuinfo"
        else:
            self._source = "none"
        self._sampler = Sampler(self._read, self.interval_s, name="perflab-telemetry")
        self._sampler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._sampler.__exit__(*exc)
        self.samples[:] = [{**reading, "t": t} for t, reading in self._sampler.samples]

    def summary(self) -> TelemetrySummary:
        """What was seen, as a :class:`TelemetrySummary`.

        Raises:
            RuntimeError: called before the ``with`` block has finished.
        """
        if self._sampler is None or self._sampler.duration_s is None:
            raise RuntimeError("summary() is available after the with-block has finished")
        duration = self._sampler.duration_s
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
                power_kind=next((x["power_kind"] for x in self.samples
                                 if x.get("power_kind")), None),
                work=self.work,
                power_limit_w=max(values("power_limit_w")) if values("power_limit_w") else None,
                temperature_c_max=(max(values("temperature_c"))
                                   if values("temperature_c") else None),
                reasons=tuple(reasons), unavailable=tuple(unavailable))
        every = [m for x in self.samples for m in x.get("cpu_mhz", ())]
        sources = {x.get("clock_source") for x in self.samples if x.get("clock_source")}
        readable = bool(clocks) and cpu_clock_readable(
            sources.pop() if len(sources) == 1 else "cpufreq" if sources else None,
            every or clocks)
        return TelemetrySummary(
            duration_s=duration, samples=len(self.samples), source=self._source,
            device=cpu_name(),
            sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
            sm_clock_mhz_min=min(clocks) if clocks else None,
            unavailable=("power", "temperature", "throttle reasons")
            + (() if readable else ("clock",)),
            work="cpu", cpu_clock_readable=readable)


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
            min_run_time_s: float = 0.2, index: int | None = None,
            work: str = "sm") -> Measurement:
    """Median seconds of one call of ``fn()`` by :func:`perflab.core.timing.benchmark`, under telemetry.

    Args:
        fn: the work, called with no arguments.
        device: where ``fn`` runs (default: CUDA when present).
        min_run_time_s: passed to :func:`~perflab.core.timing.benchmark` (> 0).
        index: GPU to sample (default: ``device``'s index, else 0).
        work: what ``fn`` is, for the sentence (:data:`WORK`; ignored on a CPU).

    Raises:
        ValueError: ``min_run_time_s`` is not positive, or an unknown ``work``.
    """
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if index is None:
        index = dev.index if (dev.type == "cuda" and dev.index is not None) else 0
    with Telemetry(index=index, device=dev, work=work) as tel:   # CPU work: the CPU's clock
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
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
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
