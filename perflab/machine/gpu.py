"""The GPU as a performance engineer sees it: its structure, its clocks, its math units.

* :func:`properties` reads what the chip is (SMs, warps, caches, memory bus) through torch; how
  it is running right now (clocks, power, PCIe link, NVLinks) is :func:`perflab.core.nvml.readings`.
  Nothing here sets clocks, power limits or modes. :func:`fact_rows` puts either dict into
  words with units, for a table.
* :func:`matmul_rates` measures matrix-multiply FLOP/s per number format (FP32 on the CUDA
  cores; TF32, bf16, fp16 and fp8 on the tensor cores; one :func:`perflab.machine.roofline.matmul_rate`
  each). (The CUDA cores' elementwise rate is chapter 1's fused ``x * 2`` kernel,
  :func:`perflab.machine.sweep.sweep_repeat`; the L2-against-HBM probe is taught on chapter 2's
  page and exported to :mod:`perflab.machine.replay`.)
* :func:`burst_and_sustained` times one matrix product briefly after a rest and for seconds back
  to back, each under :class:`perflab.core.telemetry.Telemetry`: the burst and the sustained rate.
* :func:`clocked_burst` times products back to back with a short spin kernel behind each, so the
  SM clock is counted by the SMs inside the products' own window (:class:`ClockedBurst`).

How a matrix product's tiles map onto the SMs in waves is :mod:`perflab.machine.waves`.

Units: bytes, Hz, watts, FLOP/s, seconds.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Iterable

import torch

from perflab.core.device import need_gpu
from perflab.core.telemetry import Telemetry, time_weighted
from perflab.core.timing import Stopwatch, event_timer, synchronize
from perflab.core.validate import number, positive, positive_int
from perflab.machine.caches import format_bytes
from perflab.machine.roofline import matmul_rate

__all__ = ["properties", "fact_rows", "dram_bandwidth_from_clock", "available_matmul_kinds", "matmul_rates",
           "matmul_rates_clocked",
           "BurstSustained", "burst_and_sustained", "ClockedBurst", "clocked_burst",
           "cycle_clock_behind", "cycle_clock_hz"]


def properties(index: int = 0) -> dict:
    """Structural facts of GPU ``index`` from ``torch.cuda.get_device_properties`` (read-only).

    Returns a dict: ``name``, ``compute_capability`` (e.g. ``"9.0"``), ``sm_count``, ``warp_size``
    (threads per warp), ``max_threads_per_sm``, ``max_warps_per_sm``, ``regs_per_sm`` (32-bit
    registers), ``shared_memory_per_sm`` (bytes), ``l2_bytes``, ``memory_bytes``. A field the
    installed torch does not expose is None.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: ``index`` names a GPU this machine does not have.
    """
    need_gpu("properties()")
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"index={index} but this machine has {torch.cuda.device_count()} GPU(s)")
    p = torch.cuda.get_device_properties(index)
    get = lambda name: getattr(p, name, None)  # noqa: E731
    warp = get("warp_size") or 32  # 32 on every NVIDIA GPU so far (CUDA C++ Programming Guide)
    threads = get("max_threads_per_multi_processor")
    return {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "warp_size": warp,
        "max_threads_per_sm": threads,
        "max_warps_per_sm": threads // warp if threads else None,
        "regs_per_sm": get("regs_per_multiprocessor"),
        "shared_memory_per_sm": get("shared_memory_per_multiprocessor"),
        "l2_bytes": get("L2_cache_size"),
        "memory_bytes": p.total_memory,
    }


#: How :func:`fact_rows` writes a value, by the end of its key: (suffix, format).
_UNITS = (("_hz", lambda v: f"{v / 1e6:,.0f} MHz"), ("_bytes", format_bytes),
          ("_w", lambda v: f"{v:,.0f} W"), ("_c", lambda v: f"{v:,.0f} °C"),
          ("_pct", lambda v: f"{v:,.0f} %"), ("_bits", lambda v: f"{v:,} bits"))


def fact_rows(facts: dict) -> list[tuple[str, str]]:
    """Each entry of :func:`properties` or :func:`perflab.core.nvml.readings` as ``(key, words)``:
    the value with its unit, read off the key's ending (``_hz`` in MHz, ``_bytes`` in KiB/MiB/
    GiB, ``_w`` in watts, ``_c`` in degrees C, ``_pct`` in per cent, ``_bits``), shared memory
    per SM in KiB, a list joined with commas (``"none"`` when empty), ``pstate`` as ``P0``, and a
    value the machine does not report (None) as ``"not reported"``: a table, not Python reprs.

    Raises:
        ValueError: ``facts`` is not a dict.
    """
    if not isinstance(facts, dict):
        raise ValueError(f"facts must be a dict (properties() or nvml.readings()), got "
                         f"{type(facts).__name__}")
    rows = []
    for key, value in facts.items():
        if value is None:
            words = "not reported"
        elif isinstance(value, (list, tuple)):
            words = ", ".join(map(str, value)) or "none"
        elif key == "pstate":
            words = f"P{value}"
        elif key == "shared_memory_per_sm" and isinstance(value, (int, float)):
            words = format_bytes(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            fmt_ = next((f for suffix, f in _UNITS if key.endswith(suffix)),
                        lambda v: f"{v:,}" if isinstance(v, int) else f"{v:,.4g}")
            words = fmt_(value)
        else:
            words = str(value)
        label = next((key[: -len(sfx)] for sfx, _ in _UNITS if key.endswith(sfx)), key)
        label += " size" if key.endswith("_bytes") else ""
        rows.append((label.replace("_", " "), words))
    return rows


def dram_bandwidth_from_clock(bus_width_bits: int, mem_clock_hz: float, transfers_per_clock: int = 2) -> float:
    """Peak DRAM bandwidth in bytes/s: ``bus width / 8 x transfers per clock x memory clock``.

    HBM and GDDR move data on both clock edges (double data rate), hence the default 2. With the
    H100 SXM's 5120-bit bus and NVML's 2619 MHz memory clock this gives the datasheet's 3.35 TB/s.

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("bus_width_bits", bus_width_bits), ("mem_clock_hz", mem_clock_hz),
                    ("transfers_per_clock", transfers_per_clock)):
        positive(name, v)
    return bus_width_bits / 8 * transfers_per_clock * mem_clock_hz


def available_matmul_kinds(device: torch.device | str) -> list[str]:
    """The :data:`perflab.core.formats.FORMATS` keys worth measuring on ``device``.

    CPU: fp32 and bf16. CUDA: fp32, tf32, bf16, fp16, and fp8 where the chip has fp8 tensor cores
    (compute capability 8.9 or newer) and torch has ``float8_e4m3fn``.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return ["fp32", "bf16"]
    kinds = ["fp32", "tf32", "bf16", "fp16"]
    props = torch.cuda.get_device_properties(dev)
    if (props.major, props.minor) >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
        kinds.append("fp8")
    return kinds


def matmul_rates(device: torch.device | str, n: int, kinds: Iterable[str] | None = None,
                 min_run_time_s: float = 0.2) -> tuple[dict, dict]:
    """:func:`perflab.machine.roofline.matmul_rate` for each format key: returns ``(rates, errors)``.

    ``rates`` maps kind -> FLOP/s. An fp8 product that fails (no fp8 kernel in this build, an
    unsupported layout) does not stop the others: ``errors["fp8"]`` holds ``"<ErrorClass>:
    <first line of the message>"`` for the caller to print. Failures of any other kind raise.
    Default ``kinds``: :func:`available_matmul_kinds`. ``min_run_time_s``: the timed window of
    each product (:func:`perflab.core.timing.benchmark`).
    """
    kinds = list(kinds) if kinds is not None else available_matmul_kinds(device)
    rates, errors = {}, {}
    for kind in kinds:
        if kind == "fp8":
            try:
                rates[kind] = matmul_rate(device, n, kind, min_run_time_s=min_run_time_s)
            except Exception as err:  # reported to the caller, never swallowed
                errors[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        else:
            rates[kind] = matmul_rate(device, n, kind, min_run_time_s=min_run_time_s)
    return rates, errors


def matmul_rates_clocked(device: torch.device | str, n: int, kinds: Iterable[str] | None = None,
                         min_run_time_s: float = 0.2) -> tuple[dict, dict, object]:
    """:func:`matmul_rates` under its own :class:`perflab.core.telemetry.Telemetry`: returns
    ``(rates, errors, summary)``, ``summary`` the
    :class:`perflab.core.telemetry.TelemetrySummary` of the products' timed windows (the clock
    they ran at, for a rate per clock).
    """
    with Telemetry() as tel:
        rates, errors = matmul_rates(device, n, kinds, min_run_time_s=min_run_time_s)
    return rates, errors, tel.summary()


@dataclass(frozen=True)
class BurstSustained:
    """One matrix product timed briefly after a rest (burst) and for seconds back to back.

    Attributes:
        flops: FLOPs of one product (``2 n^3``).
        burst_s, sustained_s: median seconds of one product in each measurement.
        burst, sustained: the :class:`perflab.core.telemetry.TelemetrySummary` of each.
        sustained_window_s: how long the products ran back to back (>= ``sustained_s``; the
            sustained summary covers its second half).
        burst_cycle_hz, sustained_cycle_hz: the SM clock counted by the SM itself
            (:func:`cycle_clock_hz`, median of 3) after the burst's products and after the
            sustained window's, synchronized first: the clock once the work stopped; None on a
            CPU.
        burst_counted_hz, sustained_counted_hz: the SM clock counted inside the timed
            products' own window (:attr:`ClockedBurst.clock_hz` of the spins between them:
            the burst's, and the sustained second half's): the clock the products ran at;
            None on a CPU.
    """

    flops: float
    burst_s: float
    sustained_s: float
    burst: object
    sustained: object
    sustained_window_s: float
    burst_cycle_hz: float | None = None
    sustained_cycle_hz: float | None = None
    burst_counted_hz: float | None = None
    sustained_counted_hz: float | None = None

    @property
    def burst_rate(self) -> float:
        """FLOP/s of the burst."""
        return self.flops / self.burst_s

    @property
    def sustained_rate(self) -> float:
        """FLOP/s sustained (the last half of the window)."""
        return self.flops / self.sustained_s


def _spin_device(caller: str, device, cycles: int, reps: int) -> torch.device:
    """The checked arguments of a cycle-counting probe: ``device`` as a CUDA device."""
    positive_int("cycles", cycles)
    positive_int("reps", reps)
    dev = torch.device(device)
    if dev.type != "cuda":
        raise RuntimeError(f"{caller} counts a CUDA SM's cycles; {dev} has none")
    return dev


def cycle_clock_hz(device: torch.device | str = "cuda", cycles: int = 2_000_000,
                   reps: int = 3) -> float:
    """The SM clock one kernel ran at, counted by the SM: ``cycles / seconds``, median of ``reps``.

    ``torch.cuda._sleep(cycles)`` launches one kernel that spins until its SM's cycle counter
    (``clock64``) has advanced ``cycles``; CUDA events time it. NVML's clock is a sample of what
    the driver set, read every few milliseconds; this is the clock the SM counted while the
    kernel ran. 2,000,000 cycles last about 1.0-1.4 ms at 1.4-2 GHz: the events' resolution
    (~0.5 µs) and the few µs between an event and the kernel's start are under 0.3 % of it, and
    the power controller moves the clock in steps of milliseconds, so called right after other
    work (the timer synchronizes first, a host round trip of idle) it reads the clock that work
    left.

    Raises:
        RuntimeError: ``device`` is not a CUDA device.
        ValueError: ``cycles`` or ``reps`` not a positive integer.
    """
    dev = _spin_device("cycle_clock_hz", device, cycles, reps)
    t = event_timer(lambda: torch.cuda._sleep(cycles), dev, warmup=0, reps=reps)
    return cycles / t.median_s


def cycle_clock_behind(fn, device: torch.device | str = "cuda", cycles: int = 400_000,
                       reps: int = 3) -> float:
    """The SM clock counted by the SM while ``fn``'s work has the board loaded: ``cycles /
    seconds`` of a spin kernel queued in the same stream right behind ``fn()``'s kernels, with
    no synchronization between them, ``reps`` times (work, spin; work, spin; ...); the median.

    :func:`cycle_clock_hz` synchronizes first and spins ~1 ms per rep, so it reads the clock
    the power controller sets once the work has stopped (a one-thread spin draws little power).
    Here each spin starts the moment the work before it ends (``event_timer`` with no warm-up
    and ``behind=True`` records its start event without synchronizing) and lasts ~0.2-0.3 ms at 1.4-2 GHz,
    shorter than the milliseconds over which the controller moves the clock, so it reads the
    clock the work ran at. The events' resolution (~0.5 µs) and the ~1 µs between an event and
    the queued kernel's start bias the clock low by under 1 %. ``fn`` must queue its kernels
    without synchronizing (``a @ b`` does).

    Raises:
        RuntimeError: ``device`` is not a CUDA device.
        ValueError: ``cycles`` or ``reps`` not a positive integer.
    """
    dev = _spin_device("cycle_clock_behind", device, cycles, reps)
    spin = lambda: torch.cuda._sleep(cycles)  # noqa: E731
    seconds = []
    for _ in range(reps):
        fn()                                     # the work, queued ahead of the spin
        seconds.append(event_timer(spin, dev, warmup=0, reps=1, behind=True).median_s)
    return cycles / sorted(seconds)[len(seconds) // 2]


@dataclass(frozen=True)
class ClockedBurst:
    """Products timed back to back with a spin behind each (:func:`clocked_burst`).

    Attributes:
        work_s: every product's seconds (CUDA events), in the order they ran.
        short_s, long_s: the short and the long spins' seconds, one of each per two products
            (a short spin behind the first, a long one behind the second), in order.
        cycles: the (short, long) spins' lengths in SM cycles.
    """

    work_s: tuple[float, ...]
    short_s: tuple[float, ...]
    long_s: tuple[float, ...]
    cycles: tuple[int, int]

    @property
    def median_s(self) -> float:
        """Median seconds of one product."""
        return statistics.median(self.work_s)

    @property
    def clock_hz(self) -> float:
        """The SM clock the spins counted, in Hz: the spins' difference in cycles over the
        difference of their median seconds. Each spin's events also hold a few µs that are not
        its cycles (the kernel's start behind the product); both lengths carry them, so the
        difference cancels them, where ``cycles / seconds`` of one spin reads low, the more the
        shorter the spin.

        Raises:
            ValueError: the long spins were not slower than the short ones (no clock to count).
        """
        dt = statistics.median(self.long_s) - statistics.median(self.short_s)
        if dt <= 0:
            raise ValueError(f"the long spins took no longer than the short ones ({dt:.3g} s): "
                             "these timings count no clock")
        return (self.cycles[1] - self.cycles[0]) / dt

    @property
    def offset_s(self) -> float:
        """Seconds of a spin's events that are not its cycles at :attr:`clock_hz` (median
        short spin minus its cycles over the clock)."""
        return statistics.median(self.short_s) - self.cycles[0] / self.clock_hz

    def __add__(self, other: "ClockedBurst") -> "ClockedBurst":
        """Both bursts' timings as one (same spin lengths only)."""
        if self.cycles != other.cycles:
            raise ValueError(f"bursts with other spins ({self.cycles} and {other.cycles}) "
                             "do not add")
        return ClockedBurst(self.work_s + other.work_s, self.short_s + other.short_s,
                            self.long_s + other.long_s, self.cycles)


def clocked_burst(fn, device: torch.device | str = "cuda", pairs: int = 24,
                  cycles: tuple[int, int] = (50_000, 150_000),
                  warmup: int = 2) -> ClockedBurst:
    """Time ``2 * pairs`` calls of ``fn`` back to back, with a spin kernel queued behind each,
    and count the SM clock from the spins: the products and their clock from one window.

    After ``warmup`` untimed calls, :func:`perflab.core.timing.event_timer` times, in one
    window and with no synchronization inside it, the sequence work, short spin, work, long
    spin, ... (``torch.cuda._sleep``: one thread spinning until its SM's cycle counter has
    advanced ``cycles[0]`` or ``cycles[1]``), each call between its own pair of events. A spin
    right behind a product starts the moment it ends and lasts some tens of µs, against the
    product's milliseconds: the board stays under the products' load, so the spins count the
    clock the products run at, in the products' own window, rather than the clock after them
    (:func:`cycle_clock_behind`, run after the window, read a clock that moved from one run to
    the next while the products' time did not: runs/2026-12-07c-f96650c.json and
    runs/2026-12-07d-439fc20.json, chapter 4). The clock is the spins' difference over their
    times' (:attr:`ClockedBurst.clock_hz`), which cancels the few µs each spin's events hold
    beyond its cycles. ``fn`` must queue its kernels without synchronizing (``a @ b`` does).

    Args:
        fn: the work, a callable of no argument.
        device: a CUDA device.
        pairs: pairs of (work, spin) steps with a short spin and with a long one (>= 1).
        cycles: the (short, long) spins' cycles, ``0 < short < long``.
        warmup: untimed calls of ``fn`` before the window (>= 0).

    Raises:
        RuntimeError: ``device`` is not a CUDA device.
        ValueError: a bad ``pairs``, ``cycles`` or ``warmup``.
    """
    short, long_ = (positive_int("cycles", c) for c in cycles)
    if not short < long_:
        raise ValueError(f"cycles must be (short, long) with short < long, got {cycles}")
    number("warmup", warmup, minimum=0)
    dev = _spin_device("clocked_burst", device, long_, positive_int("pairs", pairs))
    steps = (fn, lambda: torch.cuda._sleep(short), fn, lambda: torch.cuda._sleep(long_))
    turn = itertools.count()
    for _ in range(warmup):
        fn()
    s = event_timer(lambda: steps[next(turn) % 4](), dev, warmup=0,
                    reps=4 * pairs).samples_s
    return ClockedBurst(tuple(x for i, x in enumerate(s) if i % 2 == 0), tuple(s[1::4]),
                        tuple(s[3::4]), (short, long_))


def window_clocks_hz(tel) -> list[float | None]:
    """The SM clock inside each timed window of a finished
    :class:`perflab.core.telemetry.Telemetry` ``tel``, in the order the windows were marked:
    Hz, time-weighted over the readings in that window
    (:func:`perflab.core.telemetry.time_weighted`), None for a window with no reading. For
    work timed window by window (chapter 4's bursts, one :func:`clocked_burst` each), whose
    rounds each get their own clock rather than the block's one summary.

    Raises:
        RuntimeError: ``tel`` has not finished (no readings to read yet).
    """
    if tel._sampler is None or tel._sampler.duration_s is None:
        raise RuntimeError("window_clocks_hz needs a Telemetry after the with-block has finished")
    reads = [(r["t"], r["sm_clock_mhz"] * 1e6) for r in tel.samples if r.get("sm_clock_mhz")]
    return [time_weighted(reads, [w]) for w in tel.windows]


def burst_and_sustained(
    device: torch.device | str,
    n: int,
    dtype: torch.dtype = torch.bfloat16,
    burst_reps: int = 64,
    sustained_s: float = 3.0,
    rest_s: float = 1.0,
) -> BurstSustained:
    """Time an ``n x n @ n x n`` product as a short burst and sustained for ``sustained_s``.

    After ``rest_s`` seconds idle (the board cools below its power limit), ``burst_reps``
    products (rounded up to even) are timed with CUDA events after 2 warm-up calls, each
    followed by a spin that counts the SM clock in their window (:func:`clocked_burst`): some
    tens of milliseconds of work (64 bf16 8192^3 products, about 95 ms on an H100), short
    enough to run before the power controller lowers the clock and long enough for the
    sampler, which reads NVML every 5 to 20 milliseconds, to read the clock at least three
    times inside them (the 30-product burst of runs/2026-12-07d-439fc20.json held two
    readings, too few to read a clock from). Then products run back to back for
    ``sustained_s`` seconds in chunks of 20 event-timed calls, with their spins; the sustained
    time is the median over the chunks of the window's second half, when the clock has
    settled, and its counted clock the spins' over that half. The burst and the second half
    each run under a :class:`perflab.core.telemetry.Telemetry` sampler, whose summaries say at
    which SM clock, power and throttle reasons: the sustained summary describes exactly the
    second half (one timed window around its chunks), the products its time comes from, so a
    rate and its clocks are read over the same seconds. Nothing here changes a clock or a
    limit. On a CPU the same runs with ``time.perf_counter`` and no spins (for tests).

    Raises:
        ValueError: a non-positive ``n``, ``burst_reps`` or ``sustained_s``, or a negative
            ``rest_s``.
    """
    for name, v in (("n", n), ("burst_reps", burst_reps)):
        positive_int(name, v)
    positive("sustained_s", sustained_s)
    number("rest_s", rest_s, minimum=0)
    dev = torch.device(device)
    index = (dev.index or 0) if dev.type == "cuda" else 0
    on_gpu = dev.type == "cuda"
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    fn = lambda: a @ b  # noqa: E731

    def timed(reps: int, warmup: int):   # products, with their counted clock on a GPU
        if on_gpu:
            return clocked_burst(fn, dev, pairs=(reps + 1) // 2, warmup=warmup)
        return event_timer(fn, dev, warmup=warmup, reps=reps)

    fn()
    synchronize(dev)
    time.sleep(rest_s)
    with Telemetry(index=index, interval_s=0.005) as tel_burst:
        burst = timed(burst_reps, 2)
    burst_hz = cycle_clock_hz(dev) if on_gpu else None   # the clock the products left
    clock = Stopwatch().start()
    while clock.elapsed() < sustained_s / 2:    # the first half: the clock settles, not kept
        timed(20, 0)
    # the second half is one timed window (the chunks' own windows nest inside it and count
    # once; event_timer synchronizes before reading its events), so its telemetry describes
    # the very products the sustained time and its counted clock come from
    chunks = []
    with Telemetry(index=index) as tel_sus, tel_sus.window():
        half = Stopwatch().start()             # its own clock: the sampler's start is not in it
        while half.elapsed() < sustained_s / 2 or len(chunks) < 2:
            chunks.append(timed(20, 0))
    window = clock.elapsed()
    sustained_hz = cycle_clock_hz(dev) if on_gpu else None
    if on_gpu:
        counted = (burst.clock_hz, sum(chunks[1:], chunks[0]).clock_hz)
        burst_s = burst.median_s
        samples = sorted(x for t in chunks for x in t.work_s)
    else:
        counted, burst_s = (None, None), burst.median_s
        samples = sorted(x for t in chunks for x in t.samples_s)
    sustained = samples[len(samples) // 2]
    return BurstSustained(2.0 * n**3, burst_s, sustained, tel_burst.summary(),
                          tel_sus.summary(), window, burst_hz, sustained_hz, *counted)
