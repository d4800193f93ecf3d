"""The GPU as a performance engineer sees it: its structure, its clocks, its math units.

* :func:`properties` reads what the chip is (SMs, warps, caches, memory bus) through torch; how
  it is running right now (clocks, power, PCIe link, NVLinks) is :func:`perflab.core.nvml.readings`.
  Nothing here sets clocks, power limits or modes.
* :func:`matmul_rates` measures matrix-multiply FLOP/s per number format (FP32 on the CUDA
  cores; TF32, bf16, fp16 and fp8 on the tensor cores; one :func:`perflab.machine.roofline.matmul_rate`
  each) and :func:`elementwise_rate` the CUDA-core rate of a fused elementwise kernel, so the
  two kinds of math unit can be compared.
* :func:`graph_copy_sweep` measures copy bandwidth against working-set size with many copies
  replayed from one CUDA graph (no launch gaps, a small per-kernel fixed cost), for the L2 / HBM
  comparison; :func:`graph_sum_sweep` does the same with ``torch.sum``, whose fixed cost per
  call says why a reduction is the poorer probe.
* :func:`burst_and_sustained` times one matrix product briefly after a rest and for seconds back
  to back, each under :class:`perflab.core.telemetry.Telemetry`: the burst and the sustained rate.

How a matrix product's tiles map onto the SMs in waves is :mod:`perflab.machine.waves`.

Units: bytes, Hz, watts, FLOP/s, seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from perflab.core.device import need_gpu
from perflab.core.progress import progress as show_progress
from perflab.core.telemetry import Telemetry, TelemetrySummary, measure
from perflab.core.timing import Stopwatch, event_timer, synchronize
from perflab.core.validate import integers, number, positive, positive_int
from perflab.machine.caches import WorkingSetPoint
from perflab.machine.costs import elementwise_cost
from perflab.machine.roofline import SweepPoint, matmul_rate, repeat_multiply
from perflab.core.profiler import kernels_per_call

__all__ = ["properties", "dram_bandwidth_from_clock", "available_matmul_kinds", "matmul_rates",
           "elementwise_rate", "graph_copy_sweep", "graph_sum_sweep", "BurstSustained",
           "burst_and_sustained"]


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


def matmul_rates(device: torch.device | str, n: int, kinds: Iterable[str] | None = None) -> tuple[dict, dict]:
    """:func:`perflab.machine.roofline.matmul_rate` for each format key: returns ``(rates, errors)``.

    ``rates`` maps kind -> FLOP/s. An fp8 product that fails (no fp8 kernel in this build, an
    unsupported layout) does not stop the others: ``errors["fp8"]`` holds ``"<ErrorClass>:
    <first line of the message>"`` for the caller to print. Failures of any other kind raise.
    Default ``kinds``: :func:`available_matmul_kinds`.
    """
    kinds = list(kinds) if kinds is not None else available_matmul_kinds(device)
    rates, errors = {}, {}
    for kind in kinds:
        if kind == "fp8":
            try:
                rates[kind] = matmul_rate(device, n, kind)
            except Exception as err:  # reported to the caller, never swallowed
                errors[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        else:
            rates[kind] = matmul_rate(device, n, kind)
    return rates, errors


def elementwise_rate(device: torch.device | str, numel: int,
                     repeat: int) -> tuple[SweepPoint, TelemetrySummary]:
    """The fused ``x*2``-repeated kernel of chapter 1 at one ``repeat``, timed under telemetry.

    Returns ``(point, telemetry)``: a :class:`perflab.machine.roofline.SweepPoint` and the
    :class:`perflab.core.telemetry.TelemetrySummary` its timing ran under. With ``repeat`` far right
    of the ridge point the kernel is compute-bound, so ``point.flops_per_s`` is the elementwise
    (CUDA-core, non-FMA) FP32 rate; ``point.kernels`` is the number of kernels per call (1 =
    fused). The function is compiled (:func:`perflab.machine.roofline.repeat_multiply`, a few seconds)
    and its kernels counted before the timing starts, so the telemetry covers only the timing
    (:func:`perflab.core.telemetry.measure`), not an idle GPU waiting for the compiler.

    Raises:
        ValueError: ``numel`` or ``repeat`` not a positive integer.
    """
    positive_int("numel", numel)
    x = torch.randn(numel, device=device)
    fn = repeat_multiply(repeat)
    fn(x)  # compile and warm up outside the measurement
    kernels = kernels_per_call(fn, x)
    m = measure(lambda: fn(x), x.device)
    cost = elementwise_cost(x.numel(), repeat, x.dtype)
    return SweepPoint(repeat, m.seconds, cost.flops, cost.bytes, kernels), m.telemetry


def _replayer(fn, copies: int, dev: torch.device):
    """A callable that runs ``fn`` ``copies`` times: one CUDA-graph replay on a GPU, a loop on a
    CPU (where there are no graphs and no launches to hide)."""
    if dev.type != "cuda":
        def loop():
            for _ in range(copies):
                fn()
        return loop
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):          # warm up outside the capture, as PyTorch asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            fn()
    return graph.replay


def _graph_sweep(device, sizes, target_s: float, reps: int, progress: bool, what: str,
                 make_fn) -> list:
    """The loop shared by :func:`graph_copy_sweep` and :func:`graph_sum_sweep`: for each size,
    ``make_fn(nbytes, dev)`` builds one call whose traffic is ``nbytes``; enough calls for about
    ``target_s`` seconds at 5 TB/s (8 to 2,000) are captured in one CUDA graph and replayed."""
    sizes = list(sizes)
    integers("sizes", sizes, 8, multiple_of=8)
    positive("target_s", target_s)
    positive_int("reps", reps)
    dev = torch.device(device)
    out = []
    for nbytes in show_progress(sizes, what, progress):
        fn = make_fn(nbytes, dev)
        calls = max(8, min(2000, math.ceil(target_s * 5e12 / nbytes)))
        replay = _replayer(fn, calls, dev)
        t = event_timer(replay, dev, warmup=2, reps=reps).median_s / calls
        out.append(WorkingSetPoint(nbytes, nbytes / t))
        del replay, fn
    return out


def _copy_call(nbytes: int, dev: torch.device):
    src = torch.ones(nbytes // 8, device=dev)   # two float32 buffers of nbytes / 2
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _sum_call(nbytes: int, dev: torch.device):
    src = torch.ones(nbytes // 4, device=dev)   # one float32 buffer of nbytes
    out = torch.empty((), device=dev)
    return lambda: torch.sum(src, 0, out=out)


def graph_copy_sweep(
    device: torch.device | str,
    sizes: Sequence[int],
    target_s: float = 2e-3,
    reps: int = 5,
    progress: bool = False,
):
    """Copy bandwidth against working-set size: ``[caches.WorkingSetPoint]``, one per size.

    For a working set of ``nbytes`` (bytes; two float32 buffers of ``nbytes / 2`` each), the
    kernel is ``dst.copy_(src)``, which reads ``nbytes / 2`` and writes ``nbytes / 2``: its
    traffic equals its working set. ``copies`` copies (enough for about ``target_s`` seconds at
    5 TB/s, between 8 and 2,000) are captured in one CUDA graph; each replay is timed with CUDA
    events (:func:`perflab.core.timing.event_timer`, 2 warm-up replays, the median of ``reps``), and
    the time of one copy is the replay's time / ``copies``. Replayed from a graph, copies run
    back to back with no launch gap and nothing between them flushes the L2, so a working set
    that fits in the L2 is served by it; each copy keeps only the kernel's own fixed cost (ramp
    and tail), which :func:`perflab.machine.caches.fit_fixed_cost` separates from the bandwidth. On a
    CPU (for tests) the copies run in a Python loop timed by ``time.perf_counter``.

    Raises:
        ValueError: empty ``sizes``, a size that is not a positive multiple of 8 bytes, or a
            non-positive ``target_s`` or ``reps``.
    """
    return _graph_sweep(device, sizes, target_s, reps, progress, "graph copy sweep",
                        _copy_call)


def graph_sum_sweep(
    device: torch.device | str,
    sizes: Sequence[int],
    target_s: float = 2e-3,
    reps: int = 5,
    progress: bool = False,
):
    """:func:`graph_copy_sweep` with ``torch.sum`` as the kernel: ``[caches.WorkingSetPoint]``.

    For a working set of ``nbytes`` (one float32 buffer of ``nbytes``), the call is
    ``torch.sum(src, 0, out=out)`` (a preallocated 0-dim ``out``: no result tensor per call),
    which reads ``nbytes``: traffic equals working set, as for the copy, and the same graph
    replay and event timing apply. A reduction ends with a step a copy does not have (its blocks combine their
    partial sums), so :func:`perflab.machine.caches.fit_fixed_cost` of these points against those of
    :func:`graph_copy_sweep` over the same sizes says what that step costs per call.

    Raises:
        ValueError: as :func:`graph_copy_sweep`.
    """
    return _graph_sweep(device, sizes, target_s, reps, progress, "graph sum sweep", _sum_call)


@dataclass(frozen=True)
class BurstSustained:
    """One matrix product timed briefly after a rest (burst) and for seconds back to back.

    Attributes:
        flops: FLOPs of one product (``2 n^3``).
        burst_s, sustained_s: median seconds of one product in each measurement.
        burst, sustained: the :class:`perflab.core.telemetry.TelemetrySummary` of each.
        sustained_window_s: how long the products ran back to back.
    """

    flops: float
    burst_s: float
    sustained_s: float
    burst: object
    sustained: object
    sustained_window_s: float

    @property
    def burst_rate(self) -> float:
        """FLOP/s of the burst."""
        return self.flops / self.burst_s

    @property
    def sustained_rate(self) -> float:
        """FLOP/s sustained (the last half of the window)."""
        return self.flops / self.sustained_s


def burst_and_sustained(
    device: torch.device | str,
    n: int,
    dtype: torch.dtype = torch.bfloat16,
    burst_reps: int = 10,
    sustained_s: float = 3.0,
    rest_s: float = 1.0,
) -> BurstSustained:
    """Time an ``n x n @ n x n`` product as a short burst and sustained for ``sustained_s``.

    After ``rest_s`` seconds idle (the board cools below its power limit), ``burst_reps``
    products are timed with CUDA events after 2 warm-up calls: a few milliseconds of work, too
    short for the power controller to lower the clock. Then products run back to back for
    ``sustained_s`` seconds in chunks of 20 event-timed calls; the sustained time is the median
    over the chunks of the window's second half, when the clock has settled. Each part runs
    under a :class:`perflab.core.telemetry.Telemetry` sampler, whose summaries say at which SM clock,
    power and throttle reasons. Nothing here changes a clock or a limit. On a CPU the same runs
    with ``time.perf_counter`` (for tests).

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
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    fn = lambda: a @ b  # noqa: E731
    fn()
    synchronize(dev)
    time.sleep(rest_s)
    with Telemetry(index=index, interval_s=0.005) as tel_burst:
        burst = event_timer(fn, dev, warmup=2, reps=burst_reps).median_s
    chunks = []
    with Telemetry(index=index) as tel_sus:
        clock = Stopwatch().start()
        while clock.elapsed() < sustained_s or len(chunks) < 2:
            chunks.append((clock.elapsed(), event_timer(fn, dev, warmup=0, reps=20)))
        window = clock.elapsed()
    late = [t for start, t in chunks if start >= window / 2] or [chunks[-1][1]]
    samples = sorted(x for t in late for x in t.samples_s)
    sustained = samples[len(samples) // 2]
    return BurstSustained(2.0 * n**3, burst, sustained, tel_burst.summary(), tel_sus.summary(),
                          window)
