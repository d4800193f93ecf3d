"""Timing device work honestly: warm-up, synchronization, events, medians.

Two layers, as the course teaches them:

* :func:`event_timer` is the idea in plain PyTorch: warm up, then bracket each repetition with
  CUDA events (or a host clock plus synchronization on CPU) and keep every sample.
* :func:`benchmark` reaches for the well-kept library: ``triton.testing.do_bench`` on a GPU and
  ``torch.utils.benchmark.Timer`` on a CPU. Chapters use it for their headline numbers.

* :class:`Stopwatch`, :func:`seconds_per_call` and :func:`best_of` time what is not a small
  repeatable callable: one pass over a file, a training run's timed steps, a block of calls.

Comparing two versions of one work on a drifting, shared machine (paired blocks, the ABBA order
check) is :mod:`perflab.core.paired`, built on :class:`Stopwatch`.

This module is the only place in perflab that reads a clock (``time.perf_counter``,
``time.time``, ``time.monotonic``, CUDA events, ``torch.utils.benchmark``, ``do_bench``);
``tests/test_architecture.py`` enforces it. Everything else asks one of the functions here,
including the two non-measurements: a :class:`Deadline` (a timeout) and a :func:`timestamp`
(seconds since the epoch, to compare moments between processes with :func:`seconds_since`).

All times are in **seconds**.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.utils import benchmark as tub

from perflab.core.validate import number, positive, positive_int

__all__ = ["CacheTiming", "Deadline", "Stopwatch", "Timing", "benchmark", "best_of", "event_timer",
           "flush_l2", "hot_and_cold", "process_seconds", "seconds_per_call", "seconds_since",
           "synchronize", "thread_seconds", "timed_window", "timestamp", "window_listener"]


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one callable.

    Attributes:
        samples_s: every timed repetition, in seconds.
        method: how the samples were taken (e.g. ``"cuda events"``).
    """

    samples_s: tuple[float, ...]
    method: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        """Median of the samples, in seconds."""
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        """Fastest sample, in seconds."""
        return min(self.samples_s)

    @property
    def iqr_s(self) -> float:
        """Inter-quartile range of the samples, in seconds (0 with fewer than 4 samples)."""
        if len(self.samples_s) < 4:
            return 0.0
        q = statistics.quantiles(self.samples_s, n=4)
        return q[2] - q[0]

    def __repr__(self) -> str:
        return f"Timing(median={self.median_s * 1e3:.4g} ms, n={len(self.samples_s)}, {self.method})"


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all queued work on ``device`` is done (no-op on CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# The timed window: which part of a measurement is the measurement
# --------------------------------------------------------------------------------------------
# A sampler reading the machine while a benchmark runs (perflab.core.telemetry.Telemetry) must
# describe the timed repetitions, not the warm-up before them or the idle time after: a 20 ms
# burst at 1,980 MHz inside a 0.8 s block of set-up would otherwise be captioned with the
# block's idle readings. Every timing primitive below opens a window when its timed repetitions
# start and closes it once the device has finished them; listeners (the samplers) hear both.

_LISTENERS: list[Callable[[str], None]] = []
_DEPTH = [0]


def window_listener(listener: Callable[[str], None]) -> Callable[[], None]:
    """Call ``listener("open")`` and ``listener("close")`` around every timed window from now
    on; returns a function that stops it (call it when the listener's block ends).

    Nested windows (a :func:`benchmark` that calls :func:`event_timer`) count once: only the
    outermost opens and closes.
    """
    _LISTENERS.append(listener)

    def stop() -> None:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)
    return stop


@contextlib.contextmanager
def timed_window(device: torch.device | str | None = None) -> Iterator[None]:
    """Mark the block as the timed part of a measurement (for the samplers, see above).

    With a CUDA ``device`` the device is synchronized as the window opens and before it closes,
    so the window covers the device's work on the block, not only the host's issuing of it. Use
    it around a loop a page times by hand (``with timed_window(dev): for ...: step()``); the
    timing functions of this module open their own.
    """
    dev = None if device is None else torch.device(device)
    outer = _DEPTH[0] == 0
    if outer and dev is not None:
        synchronize(dev)
    _DEPTH[0] += 1
    if outer:
        for listener in list(_LISTENERS):
            listener("open")
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if outer:
            if dev is not None:
                synchronize(dev)
            for listener in list(_LISTENERS):
                listener("close")


class Stopwatch:
    """Host wall-clock seconds (``time.perf_counter``) since :meth:`start`.

    With a ``device``, the device is synchronized when the watch starts and at every reading,
    so work queued on a GPU before a reading is counted in it (and work queued before the start
    is not). Without one (None) nothing is synchronized: the watch may run in any thread (the
    samplers use it) and measures host time only.

    ``with Stopwatch(dev) as sw: work()`` sets ``sw.seconds`` at the end of the block;
    ``sw.elapsed()`` reads the time so far without stopping (splits of a step, the first batch).

    Args:
        device: a ``torch.device`` or its name to synchronize, or None.

    Raises:
        ValueError: ``device`` is not a device.
        RuntimeError: :meth:`elapsed` before :meth:`start`.
    """

    def __init__(self, device: torch.device | str | None = None):
        try:
            self.device = None if device is None else torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch device or its name, got {device!r}") from None
        self.seconds: float | None = None
        self._t0: float | None = None

    def _sync(self) -> None:
        if self.device is not None:
            synchronize(self.device)

    def start(self) -> "Stopwatch":
        """(Re)start the watch at zero; returns the watch."""
        self._sync()
        self.seconds = None
        self._t0 = time.perf_counter()
        return self

    def elapsed(self) -> float:
        """Seconds since :meth:`start` (the device synchronized first)."""
        if self._t0 is None:
            raise RuntimeError("Stopwatch.elapsed() before start()")
        self._sync()
        return time.perf_counter() - self._t0

    def __enter__(self) -> "Stopwatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.seconds = self.elapsed()


def seconds_per_call(fn: Callable[[], object], calls: int = 1,
                     device: torch.device | str | None = None, events: bool = False) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn()``, timed as one block.

    By default a :class:`Stopwatch` on ``device`` (synchronized before and after): wall time,
    host work included. With ``events=True`` on a CUDA ``device``, two CUDA events bracket the
    block instead (device time from the first kernel to the last; the host may run ahead), read
    after one synchronize. No warm-up: call ``fn`` first if its first call is special. Use it
    where a single call is too short to time alone, or where calls must run back to back (a
    collective every rank runs in lock-step).

    Raises:
        ValueError: ``calls`` is not a positive integer.
    """
    positive_int("calls", calls)
    dev = torch.device(device) if device is not None else None
    if events and dev is not None and dev.type == "cuda":
        with timed_window(dev):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    with timed_window(dev), Stopwatch(dev) as sw:
        for _ in range(calls):
            fn()
    return sw.seconds / calls


def best_of(fn: Callable[[], object], repeats: int = 3, calls: int = 1,
            device: torch.device | str | None = None) -> float:
    """The fastest of ``repeats`` :func:`seconds_per_call` blocks of ``calls`` calls, in seconds
    per call: the estimate least disturbed by other work on the machine.

    Raises:
        ValueError: ``repeats`` or ``calls`` is not a positive integer.
    """
    positive_int("repeats", repeats)
    return min(seconds_per_call(fn, calls, device) for _ in range(repeats))


class Deadline:
    """A timeout: ``Deadline(30).expired()`` turns True 30 seconds after it was made.

    Raises:
        ValueError: ``seconds`` is not a positive finite number.
    """

    def __init__(self, seconds: float):
        self.seconds = positive("seconds", seconds)
        self._end = time.monotonic() + self.seconds

    def left_s(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self._end - time.monotonic()

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.left_s() < 0


def timestamp() -> float:
    """Now, in seconds since the epoch (``time.time()``): a moment other processes can compare
    with theirs. Not for measuring durations in one process (use :class:`Stopwatch`)."""
    return time.time()


def thread_seconds() -> float:
    """CPU seconds the calling thread has used so far (user + system, ``time.thread_time()``):
    the work of one thread of the process, e.g. the one that receives a loader's batches, apart
    from the process's other threads (:func:`process_seconds` counts them all)."""
    return time.thread_time()


def process_seconds() -> float:
    """CPU seconds this process has used so far (user + system, ``time.process_time()``):
    subtract two readings for the CPU time of the work between them."""
    return time.process_time()


def seconds_since(moment: float) -> float:
    """Seconds from ``moment`` (a :func:`timestamp`, possibly another process's) until now.

    Raises:
        ValueError: ``moment`` is not a finite number.
    """
    if isinstance(moment, bool) or not isinstance(moment, (int, float)) or not math.isfinite(moment):
        raise ValueError(f"moment must be a finite timestamp in seconds, got {moment!r}")
    return time.time() - moment


_L2_FLUSH: dict[torch.device, torch.Tensor] = {}


def flush_l2(device: torch.device | str) -> None:
    """Evict the GPU's L2 cache by writing a buffer larger than it (256 MiB); no-op on CPU.

    Without this, a kernel timed repeatedly on a tensor that fits in L2 reads it from the cache,
    not from DRAM, and reports a bandwidth the DRAM cannot deliver.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    buf = _L2_FLUSH.get(dev)
    if buf is None:
        buf = _L2_FLUSH[dev] = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    buf.zero_()


def event_timer(
    fn: Callable[[], object],
    device: torch.device | str = "cuda",
    warmup: int = 3,
    reps: int = 20,
    flush: bool = False,
    behind: bool = False,
) -> Timing:
    """Time ``fn()`` ``reps`` times after ``warmup`` untimed calls; one sample per call, in seconds.

    On CUDA each call is bracketed by two ``torch.cuda.Event(enable_timing=True)`` recorded on
    the current stream, so only device time between them counts and the host may run ahead;
    all events are read after one final synchronize (also inside a caller's timed window). On
    CPU a ``time.perf_counter`` pair brackets each call. ``flush=True`` evicts the L2 before
    each call (outside the timed region).

    The timed window synchronizes the device as it opens (when it is the outermost one), so the
    first call starts on an idle device. ``behind=True`` leaves that synchronize out: the first
    start event is queued right behind the work the stream already holds, for a probe of the
    state that work leaves (the SM clock it ran at: ``perflab.machine.gpu.cycle_clock_behind``).

    Raises:
        ValueError: ``warmup < 0`` or ``reps < 1``.
    """
    number("warmup", warmup, minimum=0)
    number("reps", reps, minimum=1)
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        # behind: a window with no device opens without synchronizing (the events and the
        # synchronize below still time the device's work)
        with timed_window(None if behind else dev):
            for s, e in zip(starts, ends):
                if flush:
                    flush_l2(dev)
                s.record()
                fn()
                e.record()
        # the window synchronizes as it closes only when it is the outermost one; inside a
        # caller's window the events may not be reached yet, and reading them raises
        synchronize(dev)
        samples = tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))
        return Timing(samples, "cuda events")
    samples = []
    with timed_window():
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples), "perf_counter")


def benchmark(
    fn: Callable[[], object],
    device: torch.device | str | None = None,
    min_run_time_s: float = 0.2,
) -> float:
    """Median time of one call of ``fn()``, in seconds, measured by the standard library tools.

    * CUDA with Triton installed: ``triton.testing.do_bench(fn, return_mode="median")``, which
      warms up, flushes the L2 before each call and times with CUDA events; run again (the
      median of its medians) until the timed window has lasted ``min_run_time_s``, so a
      sampler reads the clock over that long.
    * CUDA without Triton: :func:`event_timer` with L2 flushing.
    * CPU: ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=min_run_time_s)``.

    Args:
        fn: the work, called with no arguments.
        device: where ``fn`` runs (default: CUDA when available, else the CPU).
        min_run_time_s: the shortest timed window, in seconds (positive). On CUDA with Triton
            a value below 0.125 s has no effect: each ``do_bench`` call here is asked for 25 ms
            of warm-up and at least 100 ms of repetitions (``warmup=25, rep=max(100, ...)``),
            so the window lasts one such call, about 125 ms (as long as do_bench's five-call
            estimate of ``fn``'s time holds), or more. On CUDA without Triton it is ignored
            (:func:`event_timer`, 5 warm-up calls and 50 timed ones).

    Raises:
        ValueError: ``min_run_time_s`` is not positive.
    """
    positive("min_run_time_s", min_run_time_s)
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if dev.type == "cuda":
        try:  # optional: triton ships with CUDA builds of torch only
            from triton.testing import do_bench
        except ImportError:
            return event_timer(fn, dev, warmup=5, reps=50, flush=True).median_s
        fn()  # first-call costs (allocation, compilation) stay out of the timed window
        # the window holds do_bench's own 25 ms warm-up of the same work, then its repetitions.
        # do_bench sizes its repetitions from a five-call estimate that can overshoot (a 1 GiB
        # copy's window once lasted 0.09 s of a requested 0.2 s), and a sampler needs the whole
        # window to read the clock: do_bench runs again until the window has lasted
        # min_run_time_s; the result is the median of its medians.
        with torch.cuda.device(dev), timed_window(dev):
            t0, runs = time.perf_counter(), []
            while not runs or time.perf_counter() - t0 < min_run_time_s:
                left_ms = (min_run_time_s - (time.perf_counter() - t0)) * 1e3
                runs.append(do_bench(fn, warmup=25, rep=max(100, int(left_ms)),
                                     return_mode="median"))
        return statistics.median(runs) / 1e3

    fn()  # warm-up: first-call costs (allocation, compilation) stay out of the measurement
    timer = tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    with timed_window():
        return timer.blocked_autorange(min_run_time=min_run_time_s).median


@dataclass(frozen=True)
class CacheTiming:
    """Per-call times of one operation with its operands in the cache and flushed out of it.

    Attributes:
        hot_s: seconds per call, calls back to back on the same operands (a GPU: replayed from a
            CUDA graph, so no host launch cost sits between them).
        cold_s: seconds per call when a buffer larger than the cache is written before each
            call (the write itself excluded).
        flush_s: seconds per flush write (GPU: from its own graph; CPU: None, untimed there).
        calls: calls per measurement (per graph on a GPU).
        flush_bytes: size of the buffer written to flush the cache.
        method: how it was measured, in words.
    """

    hot_s: float
    cold_s: float
    flush_s: float | None
    calls: int
    flush_bytes: int
    method: str


def hot_and_cold(
    fn: Callable[[], object],
    device: torch.device | str,
    calls: int = 50,
    reps: int = 10,
    flush_bytes: int = 256 * 2**20,
) -> CacheTiming:
    """Time ``fn()`` with its operands left in the cache ("hot") and flushed out ("cold").

    Timing one short kernel between two CUDA events measures the launch, not the cache: a
    kernel of a few microseconds ends before the host has issued the next one, so the events
    bracket the GPU waiting. This function removes the host from the measurement instead.

    * CUDA: three CUDA graphs are captured: ``calls`` calls of ``fn`` ("hot"), ``calls`` pairs
      of (write ``flush_bytes`` bytes, call ``fn``) ("cold"), and ``calls`` writes alone
      ("flush"). Each graph is replayed ``reps`` times between two CUDA events (after one
      untimed replay). ``hot_s = median(hot) / calls`` and ``cold_s = (median(cold) -
      median(flush)) / calls``: the flush's own time is subtracted, not guessed. ``fn`` must be
      capturable (no host synchronization, no CPU tensors); write its output in place
      (``out=``) so that every call touches the same bytes.
    * CPU: operators run synchronously, so each call is timed with ``time.perf_counter``:
      ``calls`` calls back to back (hot), and ``calls`` calls each after an untimed write of
      ``flush_bytes`` bytes (cold); medians. ``reps`` is unused.

    Args:
        fn: the operation, called with no arguments.
        device: where ``fn`` runs (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
        calls: calls per measurement (>= 1).
        reps: timed replays of each graph on a GPU (>= 1).
        flush_bytes: bytes written to evict the cache (>= 1); choose more than the last-level
            cache (an H200's L2 is 50 MiB, a server CPU's L3 tens of MiB).

    Returns:
        A :class:`CacheTiming` (seconds per call).

    Raises:
        ValueError: ``calls``, ``reps`` or ``flush_bytes`` below 1.
    """
    for label, v in (("calls", calls), ("reps", reps), ("flush_bytes", flush_bytes)):
        positive_int(label, v)
    dev = torch.device(device)
    buf = torch.empty(flush_bytes, dtype=torch.uint8, device=dev)
    if dev.type != "cuda":
        fn()  # warm-up
        hot, cold = [], []
        with timed_window():
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                hot.append(time.perf_counter() - t0)
            for _ in range(calls):
                buf.fill_(1)
                t0 = time.perf_counter()
                fn()
                cold.append(time.perf_counter() - t0)
        return CacheTiming(statistics.median(hot), statistics.median(cold), None, calls,
                           flush_bytes, f"perf_counter per call, {calls} calls each")
    with torch.cuda.device(dev):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture, as capture requires
            for _ in range(3):
                buf.zero_()
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graphs = {}
        for kind in ("hot", "cold", "flush"):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    if kind != "hot":
                        buf.zero_()
                    if kind != "flush":
                        fn()
            graphs[kind] = graph
        medians = {}
        with timed_window(dev):
            for kind, graph in graphs.items():
                graph.replay()  # untimed: the first replay uploads the graph
                starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
                ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
                for s, e in zip(starts, ends):
                    s.record()
                    graph.replay()
                    e.record()
                torch.cuda.synchronize(dev)
                medians[kind] = statistics.median(s.elapsed_time(e) / 1e3
                                                  for s, e in zip(starts, ends))
        del graphs
    return CacheTiming(medians["hot"] / calls, (medians["cold"] - medians["flush"]) / calls,
                       medians["flush"] / calls, calls, flush_bytes,
                       f"CUDA graphs of {calls} calls, median of {reps} replays")
