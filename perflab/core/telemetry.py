"""Telemetry: the clocks, power and throttle reasons a measurement ran under, read inside its
timed window.

A GPU does not run at one speed: the same 8192^3 bf16 matrix product reads ~800 TFLOP/s for
twenty repetitions at 1,980 MHz and ~685 TFLOP/s for three hundred back-to-back repetitions,
when the board reaches its power limit and the driver lowers the SM clock to ~1,500 MHz (NVML
sets the "software power cap" clock-event reason). A number without its clock and duration
cannot be compared with another one, so every headline benchmark of the course runs under
:class:`Telemetry` (or :func:`measure`) and states what it saw.

**Only the timed window counts.** The sampler (:class:`perflab.core.sampler.Sampler`) reads
every ``interval_s`` seconds for the whole ``with`` block, set-up and warm-up included; the
summary keeps only the readings taken inside the *timed windows*, the stretches in which a
timing primitive of :mod:`perflab.core.timing` ran its timed repetitions (they announce them,
:func:`perflab.core.timing.timed_window`; a loop timed by hand marks its own with
:meth:`Telemetry.window`). A window that holds fewer than :data:`MIN_SAMPLES` readings is too
short to read a clock from, and the sentence says so instead of quoting the idle readings before
or after it. A block in which nothing marked a window is summarized whole, and says so.

**The clock of a window is time-weighted.** The sampler's readings are not evenly spaced (a
reading of NVML takes milliseconds, and the sampler's thread waits for the interpreter), so a
median of readings counts a stretch read often more than one read rarely. The clock a sentence
states, and the one :attr:`TelemetrySummary.sm_clock_hz` gives the clock model, is the mean of
the readings inside the window, each weighted by the part of the window it stands for (from the
midpoint with the reading before it to the midpoint with the one after, the first from the
window's start, the last to its end): :func:`time_weighted`. Its range is stated beside it.

What a sentence states depends on the work (``work=``): an SM clock belongs only to work the SMs
do (``"sm"``: arithmetic); a memory-bound kernel's rate follows the memory clock (``"memory"``);
a transfer between host and GPU (``"link"``) follows no GPU clock at all. The SM clock is given
as its range over the window with the median.

**Power.** Where the driver has it, NVML's instantaneous field (``NVML_FI_DEV_POWER_INSTANT``) is
read; else ``nvmlDeviceGetPowerUsage``, which on Ampere and newer GPUs (GA100 aside) is a
one-second average. A reading that averages over the last second describes the window only
once the window is a second old, and on an H200 the "instantaneous" field, too, read idle
levels (121 W, 126 W) through copies of 0.09 s and 0.7 s at 4.2 TB/s. So a power figure is
quoted only from readings taken at least :data:`POWER_AVERAGING_S` after their window opened;
a shorter window says that it is shorter than the power reading's averaging interval, and
which field was read. An instantaneous reading may exceed the board's power limit (700 W on an
H200 SXM): the limit is enforced on an average over a longer interval, so the power controller
lets a spike through and lowers the clock if the average stays high. The sentence says so when
it happens. Without a GPU the CPU's clock is read (:func:`perflab.core.device.cpu_clock_readings`),
and a CPU whose clock the OS does not expose (a virtual machine's constant ``/proc/cpuinfo``
figure) is said to have no readable clock.

NVML reference: ``nvmlDeviceGetClockInfo``, ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetFieldValues`` (``NVML_FI_DEV_POWER_INSTANT``),
``nvmlDeviceGetCurrentClocksEventReasons`` (NVIDIA Management Library API reference).
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import torch

from perflab.core import nvml
from perflab.core.device import cpu_name
from perflab.core.sampler import Sampler, cpu_clock_readable, cpu_state
from perflab.core.timing import benchmark, timed_window, window_listener
from perflab.core.validate import integer, number, one_of, positive

__all__ = ["MIN_SAMPLES", "POWER_AVERAGING_S", "WORK", "Measurement", "Telemetry",
           "TelemetrySummary", "measure", "summarize", "time_weighted"]

_IDLE = "idle"  # perflab.core.nvml.CLOCK_EVENT_REASONS[0x1]: not a slowdown

#: Fewest readings inside a timed window from which a clock is read; below it the summary
#: says the window was too short (a 20 ms burst sampled every 20 ms holds one reading, which
#: may have been taken as the clock was still rising).
MIN_SAMPLES = 3

#: Seconds over which NVML's power reading averages (``nvmlDeviceGetPowerUsage`` on Ampere and
#: newer): a power reading describes a timed window only once the window is this old.
POWER_AVERAGING_S = 1.0

#: What kind of work a measurement times, and so which clock its sentence states.
WORK = {
    "sm": "arithmetic on the SMs: its rate follows the SM clock",
    "memory": "memory traffic: its rate follows the memory clock, not the SM clock",
    "link": "a transfer between host and GPU: no GPU clock sets its rate",
}


def _fmt_int(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def time_weighted(readings: list[tuple[float, float]],
                  windows: list[tuple[float, float]]) -> float | None:
    """The mean of ``readings`` (``(t, value)``) over ``windows`` (``(start, end)``, seconds on
    the readings' clock), each reading weighted by the part of its window it stands for.

    Only readings inside a window count. Inside one window a reading stands for the stretch
    from the midpoint with the reading before it to the midpoint with the one after; the first
    from the window's start, the last to its end. None when no reading falls inside a window.
    Readings at one instant (zero weight in all) count equally.
    """
    total = weight = 0.0
    plain: list[float] = []
    for a, b in windows:
        inside = sorted((t, v) for t, v in readings if a <= t <= b)
        for i, (t, v) in enumerate(inside):
            lo = a if i == 0 else (inside[i - 1][0] + t) / 2
            hi = b if i == len(inside) - 1 else (t + inside[i + 1][0]) / 2
            total += v * (hi - lo)
            weight += hi - lo
            plain.append(v)
    if not plain:
        return None
    return total / weight if weight > 0 else statistics.fmean(plain)


@dataclass(frozen=True)
class TelemetrySummary:
    """What a :class:`Telemetry` sampler saw inside the timed window(s) of its block.

    Attributes:
        duration_s: wall-clock seconds the readings describe: the timed windows together, or
            the whole block when nothing marked a window (``scope``).
        samples: number of readings inside that span.
        source: ``"NVML"`` (GPU), ``"/proc/cpuinfo"`` (CPU frequency only) or ``"none"``.
        device: GPU name, or the CPU model.
        sm_clock_mhz_median, sm_clock_mhz_min, sm_clock_mhz_highest: SM clock over the
            readings (MHz); on a CPU the core frequency the OS reports; None when the window
            was too short (``too_short``) or nothing could be read.
        sm_clock_mhz_max: the chip's maximum SM clock (MHz; NVML's max clock), None on a CPU.
        mem_clock_mhz_median: memory clock (MHz), None on a CPU.
        power_w_max, power_limit_w: highest board power read in the span and the enforced
            limit (W).
        temperature_c_max: highest GPU temperature read (degrees C).
        reasons: clock-event (throttle) reasons seen in any reading of the span, "idle" left
            out.
        unavailable: quantities this machine does not expose.
        work: ``"sm"``, ``"memory"`` or ``"link"`` (:data:`WORK`) on a GPU, ``"cpu"`` on a CPU.
        power_kind: ``"instantaneous"`` or ``"1 s average"``, None without power readings.
        cpu_clock_readable: on a CPU, False when the OS gives no reading of the clock.
        scope: ``"timed window"`` (readings inside the windows the timing primitives marked) or
            ``"whole block"`` (nothing marked a window: set-up and warm-up included).
        windows: number of timed windows in the block (0 for ``"whole block"``).
        interval_s: seconds between readings.
        too_short: True when the span held fewer than :data:`MIN_SAMPLES` readings or lasted
            less than :data:`MIN_SAMPLES` sampling intervals: no clock, power or reason is
            quoted from it.
        sm_clock_mhz_weighted: the SM clock averaged over the window, each reading weighted by
            the time it stands for (:func:`time_weighted`): the clock the work ran at.
        power_short: True when no power reading was taken :data:`POWER_AVERAGING_S` or more
            after its window opened: no power figure is quoted (``power_w_max`` is None).
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
    sm_clock_mhz_highest: float | None = None
    scope: str = "timed window"
    windows: int = 1
    interval_s: float = 0.02
    too_short: bool = False
    sm_clock_mhz_weighted: float | None = None
    power_short: bool = False

    @property
    def sm_clock_mhz(self) -> float | None:
        """The SM clock (or CPU core clock) the work ran at, MHz: time-weighted over the window
        (the median where no weighted figure was recorded); None when too short to read."""
        return (self.sm_clock_mhz_weighted if self.sm_clock_mhz_weighted is not None
                else self.sm_clock_mhz_median)

    @property
    def sm_clock_hz(self) -> float | None:
        """The time-weighted SM clock in Hz over the timed window (GPU only), the clock the
        clock model's peak takes: :func:`perflab.machine.datasheets.peak_flops`
        ``(fmt, summary.sm_clock_hz)``; None when the window was too short to read one."""
        if self.source != "NVML" or not self.sm_clock_mhz:
            return None
        return self.sm_clock_mhz * 1e6

    @property
    def clock_fraction(self) -> float | None:
        """Time-weighted SM clock / maximum SM clock (GPU only; None when either is unknown).

        Not a normalization of a datasheet peak: datasheet tensor-core peaks assume a clock
        below the maximum (1.83 of 1.98 GHz on an H100/H200 SXM). The clock-normalized peak is
        :func:`perflab.machine.datasheets.peak_flops` at :attr:`sm_clock_hz`.
        """
        if not self.sm_clock_mhz or not self.sm_clock_mhz_max:
            return None
        return self.sm_clock_mhz / self.sm_clock_mhz_max

    def _power(self) -> str:
        if self.power_short:
            field = {"instantaneous": "NVML's instantaneous field",
                     "1 s average": "NVML's one-second average"}.get(self.power_kind or "",
                                                                     "NVML's power reading")
            which = "the window is" if self.windows <= 1 else "each window is"
            return (f"; no power figure: {which} shorter than the "
                    f"{POWER_AVERAGING_S:.0f} s over which the power reading ({field}) "
                    "catches up with the work")
        if self.power_w_max is None:
            return ""
        text = (f", board power up to {_fmt_int(self.power_w_max)} W (read from "
                f"{POWER_AVERAGING_S:.0f} s into the window")
        limit = self.power_limit_w
        if self.power_kind == "instantaneous":
            if limit is not None and self.power_w_max > limit:
                return text + (f"; instantaneous readings: one may exceed the "
                               f"{_fmt_int(limit)} W limit, which the board enforces on an "
                               "average)")
            text += ", instantaneous)"
        elif self.power_kind == "1 s average":
            text += ", NVML's one-second average)"
        else:
            text += ")"
        if limit is not None:
            text += f" of a {_fmt_int(limit)} W limit"
        return text

    def _head(self) -> str:
        n = f"{self.samples} reading{'s' if self.samples != 1 else ''}"
        if self.scope == "whole block":
            return (f"measured over the whole {self.duration_s:.2f} s block on {self.device} "
                    f"({n}; no timed window was marked, so set-up and warm-up are included)")
        span = (f"the {self.duration_s:.2f} s timed window" if self.windows <= 1 else
                f"{self.windows} timed windows, {self.duration_s:.2f} s in all")
        return f"measured over {span} on {self.device} ({n})"

    def _clock(self) -> str:
        lo, hi, mean = self.sm_clock_mhz_min, self.sm_clock_mhz_highest, self.sm_clock_mhz
        if lo is not None and hi is not None and round(lo) != round(hi):
            return (f"SM clock {_fmt_int(mean)} MHz time-weighted over the window, readings "
                    f"{_fmt_int(lo)}–{_fmt_int(hi)} MHz "
                    f"(chip max {_fmt_int(self.sm_clock_mhz_max)})")
        return f"SM clock {_fmt_int(mean)} MHz (chip max {_fmt_int(self.sm_clock_mhz_max)})"

    def sentence(self) -> str:
        """One sentence stating the span the readings cover, the clock that sets the work's
        rate, and power, for a caption or a "how this was measured" note."""
        head = self._head()
        if self.too_short:
            return (f"{head}: too short to read a clock (readings every "
                    f"{self.interval_s * 1e3:.0f} ms, at least {MIN_SAMPLES} needed over "
                    f"at least {MIN_SAMPLES} intervals), or power")
        if self.source == "NVML":
            reasons = ("; clock-event reasons seen: " + ", ".join(self.reasons)
                       if self.reasons else "; no clock-event reason seen")
            if self.work == "memory":
                return (f"{head}: memory traffic, whose rate follows the memory clock "
                        f"({_fmt_int(self.mem_clock_mhz_median)} MHz), not the SM clock"
                        f"{self._power()}")
            if self.work == "link":
                return (f"{head}: a transfer between host and GPU, whose rate no GPU clock "
                        f"sets{self._power()}")
            return f"{head}: {self._clock()}{self._power()}{reasons}"
        if self.sm_clock_mhz is not None and self.cpu_clock_readable:
            return (f"{head}: core clock {_fmt_int(self.sm_clock_mhz)} MHz (time-weighted) as "
                    "the OS reports it; power and throttle reasons are not exposed here")
        if self.sm_clock_mhz_median is not None:
            return (f"{head}; the CPU clock cannot be read here (no cpufreq, and "
                    f"/proc/cpuinfo repeats a constant {_fmt_int(self.sm_clock_mhz_median)} "
                    "MHz, a virtual machine's nominal figure), nor power")
        return f"{head}; this machine exposes no clock, power or throttle readings"

    def brief(self) -> str:
        """A few words for a printed output line: the window's length, the clock the work ran
        at (SM clock on a GPU, core clock on a CPU, when one was read and the work is the
        SM's: a memory or link transfer states none, as in :meth:`sentence`) and, on a GPU, the
        clock-event reasons seen; e.g. ``"3.02 s, SM clock 1,676 MHz, software power cap"``.
        The full account is :meth:`sentence`, for a caption or a "how this was measured"
        note."""
        parts = [f"{self.duration_s:.2f} s"]
        if not self.too_short and self.sm_clock_mhz is not None and self.work == "sm" and (
                self.source == "NVML" or self.cpu_clock_readable):
            kind = "SM" if self.source == "NVML" else "core"
            parts.append(f"{kind} clock {_fmt_int(self.sm_clock_mhz)} MHz")
        if self.source == "NVML" and self.reasons:
            parts.append(", ".join(self.reasons))
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields plus ``clock_fraction`` and ``sentence``."""
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["unavailable"] = list(self.unavailable)
        d["clock_fraction"] = self.clock_fraction
        d["sm_clock_mhz"] = self.sm_clock_mhz
        d["sentence"] = self.sentence()
        return d


def _gpu_reading(index: int = 0) -> dict[str, Any] | None:
    """One NVML reading of GPU ``index`` in the sampler's units (MHz), or None without NVML."""
    r = nvml.readings(index, links=False)
    return None if r is None else _gpu_reading_from(r)


def _gpu_reading_from(r: dict[str, Any]) -> dict[str, Any]:
    """:func:`perflab.core.nvml.readings`' dict (Hz, W) in the sampler's units (MHz, W)."""
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
    """Sample GPU clocks, power, temperature and throttle reasons while a block runs, and
    summarize the readings taken inside its timed windows.

    Args:
        index: GPU index (ignored on a machine without a GPU).
        interval_s: seconds between readings (> 0). 0.02 s gives ~50 readings a second.
        device: the device the measured work runs on. ``"cpu"`` (or a ``torch.device`` of
            type cpu) samples the CPU's clock even on a machine with a GPU: work that runs on
            CPU cores (decoding in DataLoader workers, reading files) must not be captioned
            with an idle GPU's clock. None (default) or a CUDA device: the GPU when present.
        work: on a GPU, what the timed work is (:data:`WORK`).

    Raises:
        ValueError: ``interval_s`` is not positive, ``index`` is negative, ``device`` is
            not a device, or ``work`` is not a key of :data:`WORK`.

    Example::

        with Telemetry() as tel:
            seconds = benchmark(fn)          # benchmark marks its own timed window
        print(tel.summary().sentence())

        with Telemetry() as tel:
            warm_up()
            with tel.window():               # a loop timed by hand marks its window
                for _ in range(steps):
                    step()
    """

    index: int = 0
    interval_s: float = 0.02
    device: Any = None
    work: str = "sm"
    samples: list[dict[str, Any]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    _sampler: Sampler | None = field(default=None, repr=False)
    _source: str = "none"
    _opened: float | None = field(default=None, repr=False)
    _stop_listening: Callable[[], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        positive("interval_s", self.interval_s)
        integer("index", self.index, minimum=0)
        one_of("work", self.work, sorted(WORK))
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

    def _hear(self, event: str) -> None:
        now = self._sampler.now()
        if event == "open":
            self._opened = now
        elif self._opened is not None:
            self.windows.append((self._opened, now))
            self._opened = None

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Mark the block as a timed window (for work timed by hand inside the ``with``).

        On a CUDA device the device is synchronized as the window opens and before it closes
        (:func:`perflab.core.timing.timed_window`)."""
        on_gpu = self._source == "NVML"
        dev = (torch.device(self.device) if self.device is not None
               else torch.device("cuda", self.index)) if on_gpu else None
        with timed_window(dev):
            yield

    def __enter__(self) -> "Telemetry":
        self.samples.clear()
        self.windows.clear()
        self._opened = None
        on_cpu = self.device is not None and torch.device(self.device).type == "cpu"
        if not on_cpu and torch.cuda.is_available() and _gpu_reading(self.index) is not None:
            self._source = "NVML"
        elif _cpu_mhz() is not None:
            self._source = "/proc/cpuinfo"
        else:
            self._source = "none"
        self._sampler = Sampler(self._read, self.interval_s, name="perflab-telemetry")
        self._sampler.__enter__()
        self._stop_listening = window_listener(self._hear)
        return self

    def __exit__(self, *exc) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
        self._sampler.__exit__(*exc)
        self.samples[:] = [{**reading, "t": t} for t, reading in self._sampler.samples]

    def start(self) -> "Telemetry":
        """Start sampling, as entering the ``with`` block does; returns self. For timed work
        in a cell of its own: a hidden cell before it starts, one after calls :meth:`stop`;
        :meth:`summary` reads the timed windows the work marks in between."""
        return self.__enter__()

    def stop(self) -> "Telemetry":
        """Stop sampling, as leaving the ``with`` block does; returns self (for
        ``tel.stop().summary()``)."""
        self.__exit__(None, None, None)
        return self

    def summary(self) -> TelemetrySummary:
        """What was seen inside the timed windows (or the whole block when none was marked),
        as a :class:`TelemetrySummary` (:func:`summarize`).

        Raises:
            RuntimeError: called before the ``with`` block has finished.
        """
        if self._sampler is None or self._sampler.duration_s is None:
            raise RuntimeError("summary() is available after the with-block has finished")
        device = (torch.cuda.get_device_name(self.index) if self._source == "NVML"
                  else cpu_name())
        return summarize(self.samples, self.windows, source=self._source,
                         interval_s=self.interval_s, block_s=self._sampler.duration_s,
                         work=self.work, device=device)


def summarize(samples: list[dict[str, Any]], windows: list[tuple[float, float]], *,
              source: str, interval_s: float, block_s: float, work: str = "sm",
              device: str = "?") -> TelemetrySummary:
    """Summarize a sampler's trace: the readings inside ``windows`` (all of them when
    ``windows`` is empty: the whole block, ``block_s`` seconds).

    Args:
        samples: readings as :class:`Telemetry` keeps them, each a dict with ``"t"`` (seconds
            since the block started) and the reading's keys (``sm_clock_mhz``, ``power_w``,
            ``power_kind``, ``clock_event_reasons`` ...).
        windows: ``(start, end)`` of each timed window, on the readings' clock.
        source: ``"NVML"``, ``"/proc/cpuinfo"`` or ``"none"``.
        interval_s: the sampler's interval (a span shorter than :data:`MIN_SAMPLES` intervals
            is too short to read a clock).
        block_s: the whole block's length (the span when no window was marked).
        work: :data:`WORK` key (GPU), for the sentence.
        device: the device's name, for the sentence.

    The clock is :func:`time_weighted` over the windows, with the range of the readings inside
    them and their median. Power comes only from readings taken :data:`POWER_AVERAGING_S` or
    more after their window opened (``power_short`` otherwise).
    """
    ordered = sorted(samples, key=lambda x: x["t"])
    if windows:
        spans, scope = list(windows), "timed window"
    else:
        spans, scope = [(0.0, block_s)], "whole block"
    readings = [x for x in ordered if any(a <= x["t"] <= b for a, b in spans)]
    span = sum(b - a for a, b in spans)
    too_short = len(readings) < MIN_SAMPLES or span < MIN_SAMPLES * interval_s
    values = lambda key: [x[key] for x in readings if x.get(key) is not None]  # noqa: E731
    every = lambda key: [x[key] for x in ordered if x.get(key) is not None]  # noqa: E731
    clocks = [] if too_short else values("sm_clock_mhz")
    weighted = None if too_short else time_weighted(
        [(x["t"], x["sm_clock_mhz"]) for x in readings if x.get("sm_clock_mhz") is not None],
        spans)
    common = dict(duration_s=span, samples=len(readings), source=source,
                  scope=scope, windows=len(windows), interval_s=interval_s,
                  too_short=too_short,
                  sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
                  sm_clock_mhz_min=min(clocks) if clocks else None,
                  sm_clock_mhz_highest=max(clocks) if clocks else None,
                  sm_clock_mhz_weighted=weighted)
    if source == "NVML":
        reasons: list[str] = []
        for x in ([] if too_short else readings):
            for r in x.get("clock_event_reasons") or ():
                if r != _IDLE and r not in reasons:
                    reasons.append(r)
        # a power reading describes the window only once the window is a second old
        settled = [x["power_w"] for x in readings if x.get("power_w") is not None
                   and any(a + POWER_AVERAGING_S <= x["t"] <= b for a, b in spans)]
        power = [] if too_short else settled
        maxima, limits = every("max_sm_clock_mhz"), every("power_limit_w")
        mem = [] if too_short else values("memory_clock_mhz")
        temps = [] if too_short else values("temperature_c")
        unavailable = [name for name, key in (("power", "power_w"),
                                              ("temperature", "temperature_c"),
                                              ("throttle reasons", "clock_event_reasons"))
                       if not every(key)]
        return TelemetrySummary(
            **common, device=device,
            sm_clock_mhz_max=max(maxima) if maxima else None,
            mem_clock_mhz_median=statistics.median(mem) if mem else None,
            power_w_max=max(power) if power else None,
            power_short=not too_short and bool(every("power_w")) and not power,
            power_kind=next((x["power_kind"] for x in ordered if x.get("power_kind")), None),
            work=work, power_limit_w=max(limits) if limits else None,
            temperature_c_max=max(temps) if temps else None,
            reasons=tuple(reasons), unavailable=tuple(unavailable))
    all_mhz = [m for x in ordered for m in x.get("cpu_mhz", ())]
    sources = {x.get("clock_source") for x in ordered if x.get("clock_source")}
    readable = bool(every("sm_clock_mhz")) and cpu_clock_readable(
        sources.pop() if len(sources) == 1 else "cpufreq" if sources else None,
        all_mhz or every("sm_clock_mhz"))
    return TelemetrySummary(
        **common, device=device,
        unavailable=("power", "temperature", "throttle reasons")
        + (() if readable else ("clock",)),
        work="cpu", cpu_clock_readable=readable)


@dataclass(frozen=True)
class Measurement:
    """A timing and the telemetry it ran under.

    Attributes:
        seconds: median seconds of one call (from :func:`perflab.core.timing.benchmark`).
        telemetry: the :class:`TelemetrySummary` of the timed window (warm-up left out).
    """

    seconds: float
    telemetry: TelemetrySummary

    def rate(self, work: float) -> float:
        """``work / seconds`` (e.g. FLOPs per call -> FLOP/s, bytes per call -> bytes/s).

        Raises:
            ValueError: ``work`` is negative.
        """
        return number("work", work, minimum=0) / self.seconds


def measure(fn: Callable[[], object], device: torch.device | str | None = None,
            min_run_time_s: float = 0.2, index: int | None = None,
            work: str = "sm") -> Measurement:
    """Median seconds of one call of ``fn()`` by :func:`perflab.core.timing.benchmark`, under
    telemetry read inside its timed window.

    Args:
        fn: the work, called with no arguments.
        device: where ``fn`` runs (default: CUDA when present).
        min_run_time_s: passed to :func:`~perflab.core.timing.benchmark` (> 0); the timed
            window lasts at least about this long (on a GPU with Triton at least about
            0.125 s, one do_bench call: see ``benchmark``), which holds several readings at
            the default 20 ms interval.
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
