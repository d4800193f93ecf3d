"""Overhead: time that is neither arithmetic nor memory traffic (Python, dispatch, launches).

Rates here are operations per second; times are seconds. Every function runs on CPU and GPU.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from perflab.core.timing import Stopwatch, benchmark, best_of, synchronize
from perflab.core.validate import integer, number, positive, positive_int
from perflab.machine.caches import beyond_cache_numel
from perflab.machine.roofline import copy_bandwidth

__all__ = ["CallModel", "batch_scaling", "call_model", "issue_time", "launch_rate",
           "cuda_graph_op_rate", "dram_copy_bandwidth", "op_rate",
           "python_adds_per_second"]


def _add_loop(n: int) -> int:
    x = 0
    for _ in range(n):
        x = x + 1
    return x


def python_adds_per_second(n: int = 2_000_000) -> float:
    """Integer additions per second the Python interpreter does in a plain loop (``x = x + 1``).

    The loop's own bookkeeping is included, as it is in real code. Best of 3 runs of ``n`` adds.

    Raises:
        ValueError: ``n`` < 1.
    """
    number("n", n, minimum=1)
    return n / best_of(lambda: _add_loop(n), repeats=3)


def issue_time(fn: Callable[[], object], device: torch.device | str, calls: int = 10,
               bursts: int = 5, warm: int = 0) -> float:
    """Host seconds per call of ``fn`` when ``calls`` calls are issued back to back.

    Each burst starts from an empty queue (synchronize), issues ``calls`` calls and reads the
    host clock *without* synchronizing; the result is the median over ``bursts`` bursts of the
    burst time divided by ``calls``. On a GPU this is the host's cost to issue a call (Python,
    dispatcher, allocation, launch), as long as the device's queue absorbs the burst; a kernel
    longer than the issue time does not add to it. On a CPU the kernel runs on the calling
    thread, so it is the whole call. Chapter 3 compares it with the profiler's host times and
    with a timer that forgets to synchronize.

    With ``warm`` > 0, each burst first issues ``warm`` untimed calls after the synchronize, so
    the clock starts on a call that follows another, as inside a running loop, rather than on
    the first call after the queue drained (which may find the host's caches cold).

    Args:
        fn: the call to issue (its result is discarded).
        device: where ``fn`` runs (synchronized before each burst and at the end).
        calls: calls per burst (>= 1).
        bursts: bursts; the median is returned (>= 1).
        warm: untimed calls at the start of each burst (>= 0).

    Returns:
        seconds per call (host clock, :class:`perflab.core.timing.Stopwatch`).

    Raises:
        ValueError: ``calls`` or ``bursts`` below 1, or ``warm`` below 0.
    """
    for name, v in (("calls", calls), ("bursts", bursts)):
        positive_int(name, v)
    integer("warm", warm, minimum=0)
    per_call = []
    for _ in range(bursts):
        synchronize(device)
        for _ in range(warm):
            fn()
        with Stopwatch() as host:      # the host clock, read without synchronizing
            for _ in range(calls):
                fn()
        per_call.append(host.seconds / calls)
    synchronize(device)
    return statistics.median(per_call)


def op_rate(device: torch.device | str, numel: int = 1, ops: int = 5000) -> float:
    """Tiny-tensor PyTorch operator calls per second on ``device``: ``ops`` calls of ``y = x * 2``.

    With ``numel`` tiny the kernel does nothing, so the rate measures the per-call cost: the
    Python call, the dispatcher, allocation and, on CUDA, the kernel launch. On CUDA the clock
    stops after a synchronize, so queued launches are counted only once they have run.

    Raises:
        ValueError: ``numel`` or ``ops`` < 1.
    """
    number("numel", numel, minimum=1)
    number("ops", ops, minimum=1)
    dev = torch.device(device)
    x = torch.randn(numel, device=dev)
    for _ in range(100):  # warm-up: CUDA context, caching allocator, kernel load
        y = x * 2
    synchronize(dev)

    def block():
        for _ in range(ops):
            x * 2

    return ops / best_of(block, repeats=3, device=dev)


def launch_rate(device: torch.device | str, calls: int = 200, bursts: int = 25) -> float:
    """Bare kernel launches per second the **host** issues from Python: ``torch.cuda._sleep(0)``,
    a kernel that does nothing, launched straight from its C++ binding (no dispatcher, no output
    allocated, no tensor at all).

    Timed as :func:`issue_time` times a call: each of ``bursts`` bursts starts from an empty
    queue (synchronize), issues ``calls`` launches and reads the host clock *before*
    synchronizing; the result is one over the median burst's time per launch. A burst much
    shorter than the device's launch queue never waits for the GPU, so the figure is the host's
    side of a launch even when the GPU runs the empty kernels more slowly than the host issues
    them (a rate taken over thousands of launches with a synchronize at the end would then
    measure the device instead).

    Its inverse is what launching one kernel costs the host through the thinnest path PyTorch
    has: set beside the difference between a CUDA-tensor and a CPU-tensor operator call, it says
    how much of that difference is the launch itself, without the profiler (whose own
    instrumentation of the launch API inflates what it reports there).

    Args:
        device: a CUDA device.
        calls: launches per burst (>= 1; few enough that the device's launch queue never
            fills, or the host would wait for the GPU).
        bursts: bursts; the median is taken (>= 1).

    Returns:
        launches per second (host clock, :class:`perflab.core.timing.Stopwatch`).

    Raises:
        RuntimeError: no CUDA device, or a torch without ``torch.cuda._sleep``.
        ValueError: ``calls`` or ``bursts`` below 1.
    """
    positive_int("calls", calls)
    positive_int("bursts", bursts)
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("launch_rate needs a CUDA GPU")
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        raise RuntimeError("this torch has no torch.cuda._sleep: no bare launch to time")
    with torch.cuda.device(dev):
        for _ in range(100):               # the kernel's module loaded, the queue warm
            sleep(0)
        synchronize(dev)
        return 1.0 / issue_time(lambda: sleep(0), dev, calls=calls, bursts=bursts)


def cuda_graph_op_rate(numel: int = 1, ops: int = 1000, replays: int = 20) -> float:
    """Kernels per second when the same ``ops`` tiny ``x * 2`` operators replay from a CUDA graph.

    Capture records the kernels once; each replay launches the whole graph with one call, so
    Python, dispatch and per-kernel launch costs disappear. The rate is ``ops * replays`` over
    the wall time of ``replays`` replays (synchronized).

    Raises:
        RuntimeError: no CUDA device.
        ValueError: a non-positive argument.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_graph_op_rate needs a CUDA GPU; this machine has none")
    if min(numel, ops, replays) < 1:
        raise ValueError("numel, ops and replays must all be >= 1")
    x = torch.randn(numel, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as capture requires
        for _ in range(3):
            y = x
            for _ in range(ops):
                y = y * 2
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(ops):
            y = y * 2
    graph.replay()

    def block():
        for _ in range(replays):
            graph.replay()

    return ops * replays / best_of(block, repeats=3, device=torch.device("cuda"))


def batch_scaling(
    make_step: Callable[[int], Callable[[], object]],
    batches: Sequence[int],
    device: torch.device | str,
) -> list[tuple[int, float]]:
    """Time one step at each batch size: the "double the batch, does time move?" test.

    ``make_step(batch)`` returns a zero-argument callable that runs one step at that batch size.
    Returns ``[(batch, seconds), ...]`` with medians from :func:`perflab.core.timing.benchmark`.
    If doubling the batch barely moves the time, the step is overhead-bound.

    Raises:
        ValueError: empty ``batches`` or a batch < 1.
    """
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be a non-empty list of positive sizes, got {list(batches)}")
    out = []
    for b in batches:
        step = make_step(b)
        out.append((b, benchmark(step, device, min_run_time_s=0.1)))
    return out


# ---------------------------------------------------------------------------------------------
# One model of the cost of a call
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallModel:
    """The cost of one operator call: host issue time, device time per kernel, and the work.

    Three quantities, each measured by a different experiment and named for what it measures:

    * ``host_issue_s``: **host issue time per call**, the host CPU's time to run the Python
      call, the dispatcher, the allocation and the launch API (``1 / op_rate(device)`` on a
      1-element tensor). The host CPU sets it, not the GPU. On a CPU tensor it also includes
      the (tiny) kernel, which runs on the same thread.
    * ``device_fixed_s``: **device time per kernel** for a kernel that does no work: the GPU's
      own cost of starting one kernel after another (``1 / cuda_graph_op_rate()``, where no
      host issue is paid). 0 on a CPU.
    * the work: ``max(bytes / bandwidth, flops / peak_flops)``, the roofline time.

    An isolated call (issue, then wait for it) costs ``t0 + max(bytes/BW, FLOPs/peak)`` with
    ``t0 = host_issue_s + device_fixed_s``. In a stream of calls on a GPU the host issues the
    next call while the device runs this one, so a call costs the *larger* of the two:
    ``max(host_issue_s, device_fixed_s + work)``; on a CPU nothing overlaps and they add.

    Attributes:
        host_issue_s: seconds (> 0).
        device_fixed_s: seconds (>= 0).
        bandwidth: bytes/s (> 0), the copy bandwidth of the run's ceilings.
        peak_flops: FLOP/s (> 0), or None when no compute roof applies (bandwidth only).
        overlapped: True when host and device run concurrently (a GPU), False on a CPU.

    Raises:
        ValueError: a value out of range.
    """

    host_issue_s: float
    device_fixed_s: float
    bandwidth: float
    peak_flops: float | None = None
    overlapped: bool = True

    def __post_init__(self) -> None:
        positive("host_issue_s", self.host_issue_s)
        positive("bandwidth", self.bandwidth)
        number("device_fixed_s", self.device_fixed_s, minimum=0)
        if self.peak_flops is not None:
            positive("peak_flops", self.peak_flops)

    @property
    def t0(self) -> float:
        """Fixed cost of an isolated call: ``host_issue_s + device_fixed_s`` (seconds)."""
        return self.host_issue_s + self.device_fixed_s

    def work_s(self, nbytes: float, flops: float = 0.0) -> float:
        """Roofline time of the kernel's work: ``max(nbytes / bandwidth, flops / peak_flops)``.

        Raises:
            ValueError: negative ``nbytes`` or ``flops``, or ``flops`` > 0 without a peak.
        """
        number("nbytes", nbytes, minimum=0)
        number("flops", flops, minimum=0)
        if flops and self.peak_flops is None:
            raise ValueError("flops > 0 needs a model with peak_flops")
        compute = flops / self.peak_flops if flops else 0.0
        return max(nbytes / self.bandwidth, compute)

    def device_s(self, nbytes: float, flops: float = 0.0) -> float:
        """Device time of one kernel: ``device_fixed_s + work_s`` (seconds)."""
        return self.device_fixed_s + self.work_s(nbytes, flops)

    def isolated_s(self, nbytes: float, flops: float = 0.0) -> float:
        """One call, issued and waited for: ``t0 + work_s`` (seconds)."""
        return self.host_issue_s + self.device_s(nbytes, flops)

    def stream_s(self, nbytes: float, flops: float = 0.0) -> float:
        """One call in a long stream of calls (seconds): what a sweep such as
        :func:`perflab.internals.callcost.call_cost_sweep` (taught on chapter 3's page) measures.

        ``max(host_issue_s, device_s)`` when host and device overlap, else their sum.
        """
        if self.overlapped:
            return max(self.host_issue_s, self.device_s(nbytes, flops))
        return self.host_issue_s + self.device_s(nbytes, flops)

    def crossover_bytes(self) -> float:
        """Bytes a kernel must move for its work to equal the host's share of a call.

        Overlapped (GPU): where ``device_fixed_s + bytes / bandwidth == host_issue_s``, i.e.
        ``(host_issue_s - device_fixed_s) * bandwidth`` (0 when the device is the slower side
        even for an empty kernel). Not overlapped (CPU): ``host_issue_s * bandwidth``.
        """
        if self.overlapped:
            return max(0.0, self.host_issue_s - self.device_fixed_s) * self.bandwidth
        return self.host_issue_s * self.bandwidth


def call_model(device: torch.device | str, bandwidth: float,
               peak_flops: float | None = None) -> CallModel:
    """Measure the two fixed costs of :class:`CallModel` on ``device`` and return the model.

    ``host_issue_s = 1 / op_rate(device)`` (tiny ``x * 2`` calls, synchronized at the end);
    on CUDA ``device_fixed_s = 1 / cuda_graph_op_rate()`` (the same kernels replayed from a
    CUDA graph, so no host issue is paid), on a CPU 0. ``bandwidth`` (bytes/s) and
    ``peak_flops`` (FLOP/s or None) come from the run's ceilings; they are not measured here.

    Raises:
        ValueError: a non-positive ``bandwidth`` or ``peak_flops``.
    """
    positive("bandwidth", bandwidth)
    dev = torch.device(device)
    host = 1.0 / op_rate(dev)
    gpu = dev.type == "cuda"
    fixed = 1.0 / cuda_graph_op_rate() if gpu else 0.0
    return CallModel(host_issue_s=host, device_fixed_s=fixed, bandwidth=float(bandwidth),
                     peak_flops=peak_flops, overlapped=gpu)


def dram_copy_bandwidth(factor: float = 4.0) -> tuple[float, int]:
    """Host DRAM copy bandwidth in bytes/s, with tensors ``factor`` x the last-level cache.

    Returns ``(bytes_per_s, numel)`` where ``numel`` is the float32 elements per tensor
    (:func:`beyond_cache_numel`). Bytes read plus written are counted.
    """
    numel = beyond_cache_numel(factor)
    return copy_bandwidth("cpu", numel), numel
