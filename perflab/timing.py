"""Timing device work honestly: warm-up, synchronization, events, medians.

Two layers, as the course teaches them:

* :func:`event_timer` is the idea in plain PyTorch: warm up, then bracket each repetition with
  CUDA events (or a host clock plus synchronization on CPU) and keep every sample.
* :func:`benchmark` reaches for the well-kept library: ``triton.testing.do_bench`` on a GPU and
  ``torch.utils.benchmark.Timer`` on a CPU. Chapters use it for their headline numbers.

All times are in **seconds**.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils import benchmark as tub

__all__ = ["Timing", "benchmark", "event_timer", "flush_l2", "synchronize"]


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
) -> Timing:
    """Time ``fn()`` ``reps`` times after ``warmup`` untimed calls; one sample per call, in seconds.

    On CUDA each call is bracketed by two ``torch.cuda.Event(enable_timing=True)`` recorded on
    the current stream, so only device time between them counts and the host may run ahead;
    all events are read after one final synchronize. On CPU a ``time.perf_counter`` pair brackets
    each call. ``flush=True`` evicts the L2 before each call (outside the timed region).

    Raises:
        ValueError: ``warmup < 0`` or ``reps < 1``.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        synchronize(dev)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            if flush:
                flush_l2(dev)
            s.record()
            fn()
            e.record()
        synchronize(dev)
        samples = tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))
        return Timing(samples, "cuda events")
    samples = []
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
      warms up, flushes the L2 before each call and times with CUDA events.
    * CUDA without Triton: :func:`event_timer` with L2 flushing.
    * CPU: ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=min_run_time_s)``.

    Raises:
        ValueError: ``min_run_time_s`` is not positive.
    """
    if min_run_time_s <= 0:
        raise ValueError(f"min_run_time_s must be > 0, got {min_run_time_s}")
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if dev.type == "cuda":
        try:  # optional: triton ships with CUDA builds of torch only
            from triton.testing import do_bench
        except ImportError:
            return event_timer(fn, dev, warmup=5, reps=50, flush=True).median_s
        with torch.cuda.device(dev):
            ms = do_bench(fn, warmup=25, rep=max(100, int(min_run_time_s * 1e3)), return_mode="median")
        return ms / 1e3

    fn()  # warm-up: first-call costs (allocation, compilation) stay out of the measurement
    timer = tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time_s).median
