"""The roofline: ridge point, attainable rate, measured ceilings, the ``x*2 repeat`` kernel and its
check at the knee, plots. (The sweep itself is chapter 1's code, exported to
:mod:`perflab.machine.sweep`.)

The roofline model (Williams, Waterman and Patterson, "Roofline: an insightful visual performance
model for multicore architectures", CACM 52(4), 2009) bounds a kernel's rate by

    attainable FLOP/s = min(peak FLOP/s, arithmetic intensity x memory bandwidth),

where arithmetic intensity is FLOPs per byte moved to and from DRAM. The two roofs meet at the
*ridge point* ``peak / bandwidth`` (FLOP/byte): below it a kernel is bandwidth-bound, above it
compute-bound. This module is the one implementation of that model (the explorer draws it).

FLOP and byte counts live in :mod:`perflab.machine.costs`; :class:`~perflab.machine.costs.Cost`,
:func:`~perflab.machine.costs.matmul_cost`, :func:`~perflab.machine.costs.elementwise_cost` and
:func:`~perflab.machine.costs.arithmetic_intensity` are re-exported here because chapter 1 and lab 1
teach them beside the roofline. Units throughout: seconds, bytes, FLOPs, FLOP/s, bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from perflab.core import formats
from perflab.core.telemetry import measure
from perflab.core.timing import benchmark
from perflab.core.validate import integer, number, positive, positive_int
from perflab.machine.costs import Cost, arithmetic_intensity, elementwise_cost, matmul_cost
from perflab.record.plotting import plain_log_ticks, style

__all__ = [
    "Cost",
    "KneeCheck",
    "SweepPoint",
    "arithmetic_intensity",
    "attainable_flops",
    "classify",
    "copy_bandwidth",
    "elementwise_cost",
    "fp8_matmul_rate",
    "knee_check",
    "knee_from_sweep",
    "matmul_cost",
    "matmul_rate",
    "plot_roofline",
    "plot_sweep",
    "predicted_knee_repeat",
    "repeat_multiply",
    "ridge_changes",
    "ridge_point",
]


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the compute roof meets the bandwidth roof: ``peak / bw``.

    Raises:
        ValueError: either argument is not positive.
    """
    positive("peak_flops", peak_flops)
    positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline bound in FLOP/s: ``min(peak_flops, intensity * bandwidth)``.

    Raises:
        ValueError: a negative intensity or a non-positive ceiling.
    """
    ridge_point(peak_flops, bandwidth)  # validates the ceilings
    number("intensity", intensity, minimum=0)  # FLOP/byte
    return min(peak_flops, intensity * bandwidth)


def classify(intensity: float, ridge: float) -> str:
    """``"bandwidth-bound"`` below the ridge point, ``"compute-bound"`` at or above it.

    (The third regime, overhead-bound, depends on kernel size, not intensity: see
    :mod:`perflab.internals.overhead`.)

    Raises:
        ValueError: a negative intensity or a non-positive ridge.
    """
    positive("ridge", ridge)
    number("intensity", intensity, minimum=0)  # FLOP/byte
    return "compute-bound" if intensity >= ridge else "bandwidth-bound"


def ridge_changes(machines: Sequence[tuple[str, float, float]]) -> list[tuple]:
    """The steps where a ridge point fell along a sequence of machines (oldest first).

    Args:
        machines: ``(name, peak FLOP/s, bandwidth bytes/s)`` per machine, in order.

    Returns:
        ``(name_from, name_to, ridge_from, ridge_to, peak ratio, bandwidth ratio)`` for each
        consecutive pair whose ridge point (peak / bandwidth) fell; empty when it rose at
        every step. A claim that "the ridge moved right with every generation" holds only when
        this is empty.

    Raises:
        ValueError: fewer than two machines, or a non-positive peak or bandwidth.
    """
    machines = list(machines)
    if len(machines) < 2:
        raise ValueError("need at least two machines to compare")
    ridges = [ridge_point(peak, bw) for _, peak, bw in machines]
    return [(a[0], b[0], ra, rb, b[1] / a[1], b[2] / a[2])
            for a, b, ra, rb in zip(machines, machines[1:], ridges, ridges[1:]) if rb < ra]


def predicted_knee_repeat(peak_flops: float, bandwidth: float, bytes_per_element: float = 8.0) -> float:
    """The ``repeat`` where a fused ``x*2``-repeated kernel turns compute-bound.

    Each element costs ``repeat`` FLOPs and ``bytes_per_element`` bytes (read + write: 8 for
    float32), so its intensity ``repeat / bytes_per_element`` meets the ridge at
    ``repeat = bytes_per_element * peak / bandwidth``.

    Raises:
        ValueError: a non-positive argument.
    """
    positive("bytes_per_element", bytes_per_element)
    return bytes_per_element * ridge_point(peak_flops, bandwidth)


# ---------------------------------------------------------------------------------------------
# Measuring the ceilings
# ---------------------------------------------------------------------------------------------

def copy_bandwidth(device: torch.device | str, numel: int, dtype: torch.dtype = torch.float32) -> float:
    """Achieved DRAM bandwidth of ``dst.copy_(src)`` in bytes/s, counting bytes read + written.

    ``numel`` elements of ``dtype`` (random data): pick it so the tensor dwarfs the last-level
    cache (on an H200 with 60 MB of L2, 2**28 float32 = 1 GiB).

    Raises:
        ValueError: ``numel`` is not a positive integer.
    """
    positive_int("numel", numel)
    src = torch.randn(numel, device=device).to(dtype)
    dst = torch.empty_like(src)
    seconds = benchmark(lambda: dst.copy_(src), device)
    return 2 * src.numel() * src.element_size() / seconds


def fp8_matmul_rate(device: torch.device | str, n: int, min_run_time_s: float = 0.2) -> float:
    """FLOP/s of an ``n x n @ n x n`` fp8 (e4m3) product with ``torch._scaled_mm``, bf16 output.

    Both operands are ``float8_e4m3fn``; cuBLASLt wants the first row-major and the second
    column-major (here the transpose of a row-major matrix), ``n`` a multiple of 16, and one
    float32 scale per operand (``scale_a``, ``scale_b``: scalar tensors, here 1.0). FLOPs: ``2 n^3``.
    Timing: :func:`perflab.core.timing.benchmark`.

    Raises:
        RuntimeError: no CUDA device, or the GPU/torch build has no fp8 matmul (the error from
            ``torch._scaled_mm`` itself propagates unchanged).
        ValueError: ``n`` not a positive multiple of 16.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise RuntimeError("fp8_matmul_rate needs a CUDA GPU with fp8 tensor cores; the device is a CPU")
    integer("n", n, 16, multiple_of=16)
    fp8 = torch.float8_e4m3fn
    a = torch.randn(n, n, device=dev).to(fp8)
    b = torch.randn(n, n, device=dev).to(fp8).t()  # column-major view, as cuBLASLt requires
    one = torch.ones((), device=dev, dtype=torch.float32)

    def fn():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    fn()  # a missing kernel raises here, before any timing
    return 2.0 * n**3 / benchmark(fn, dev, min_run_time_s=min_run_time_s)


def matmul_rate(device: torch.device | str, n: int, dtype: torch.dtype | str = torch.float32,
                tf32: bool = False, min_run_time_s: float = 0.2) -> float:
    """Achieved FLOP/s of an ``n x n @ n x n`` matrix product on random data: the one
    matrix-product rate of the course.

    ``dtype`` is a torch dtype or a key of :data:`perflab.core.formats.FORMATS`: ``"fp32"`` runs on
    the CUDA cores (TF32 off); ``"tf32"`` is float32 storage with TF32 tensor-core math;
    ``"bf16"``/``"fp16"`` are stored and multiplied in 16 bits (float32 accumulation); ``"fp8"``
    is :func:`fp8_matmul_rate`. ``tf32=True`` with ``torch.float32`` is the same as ``"tf32"``
    (``torch.set_float32_matmul_precision("high")``); the previous precision setting is restored
    afterwards. FLOPs counted: ``2 n^3``. ``min_run_time_s``: how long the timed repetitions
    last at least (:func:`perflab.core.timing.benchmark`); a rate whose clock is read under
    telemetry needs >= 0.5 s, several sampling intervals.

    Raises:
        ValueError: ``n`` not a positive integer, ``tf32`` with a dtype other than float32, an
            unknown format key, or ``"tf32"``/``"fp8"`` on a device that is not CUDA.
    """
    positive_int("n", n)
    if isinstance(dtype, str):
        fmt = formats.FORMATS[formats.check(dtype)]
        if torch.device(device).type != "cuda" and dtype in ("tf32", "fp8"):
            raise ValueError(f"dtype={dtype!r} is a GPU tensor-core format; the device is {device}")
        if dtype == "fp8":
            return fp8_matmul_rate(device, n, min_run_time_s)
        dtype, tf32 = formats.dtype(dtype), tf32 or fmt.tf32
    if tf32 and dtype != torch.float32:
        raise ValueError(f"tf32=True applies to float32 only, got dtype={dtype}")
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        seconds = benchmark(lambda: a @ b, device, min_run_time_s=min_run_time_s)
    finally:
        torch.set_float32_matmul_precision(before)
    return 2.0 * n**3 / seconds


# ---------------------------------------------------------------------------------------------
# The x*2 repeat sweep
# ---------------------------------------------------------------------------------------------

def _multiply_by_two(x: torch.Tensor, repeat: int) -> torch.Tensor:
    for _ in range(repeat):
        x = x * 2
    return x


def repeat_multiply(repeat: int, compile: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(x)`` = ``x * 2`` applied ``repeat`` times; compiled into one fused kernel by default.

    Dynamo specializes on the Python int ``repeat`` and keeps at most
    ``torch._dynamo.config.recompile_limit`` (8) versions of one function; compiling a loop over
    many ``repeat`` values silently falls back to eager after that. This function therefore calls
    ``torch.compiler.reset()`` and compiles a fresh graph with ``fullgraph=True`` (a graph break
    raises instead of degrading) and ``dynamic=False``. Earlier compiled functions stay callable
    but recompile on their next call.

    Raises:
        ValueError: ``repeat`` is not a positive integer.
    """
    positive_int("repeat", repeat)

    def f(x: torch.Tensor) -> torch.Tensor:
        return _multiply_by_two(x, repeat)

    if not compile:
        return f
    torch.compiler.reset()
    return torch.compile(f, fullgraph=True, dynamic=False)


@dataclass(frozen=True)
class SweepPoint:
    """One point of the ``x*2 repeat`` sweep.

    Attributes:
        repeat: multiplications per element.
        seconds: median time of one call.
        flops: ``numel * repeat``.
        bytes: ``numel * itemsize * 2`` (read once, write once).
        kernels: device kernels (GPU) or ATen compute calls (CPU) per call; 1 proves fusion on GPU.
    """

    repeat: int
    seconds: float
    flops: float
    bytes: float
    kernels: float | None = None

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth in bytes/s."""
        return self.bytes / self.seconds

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return self.flops / self.bytes


def knee_from_sweep(points: Sequence[SweepPoint]) -> float:
    """The measured knee: where the measured memory roof meets the measured compute slope.

    The memory roof is the fastest time of any point (the flat, bandwidth-bound region); the
    compute slope is seconds per unit of ``repeat`` at the largest repeat (compute-bound, so
    time grows linearly). Their intersection ``t_flat / (t_max / repeat_max)`` is the repeat at
    which compute time equals memory time.

    Raises:
        ValueError: fewer than 2 points, or the largest repeat is not the slowest point (the sweep
            never left the flat region, so no knee can be read from it).
    """
    if len(points) < 2:
        raise ValueError("need at least 2 sweep points to find a knee")
    t_flat = min(p.seconds for p in points)
    last = max(points, key=lambda p: p.repeat)
    if last.seconds <= 1.5 * t_flat:
        raise ValueError(
            "the sweep never turned compute-bound (time at the largest repeat is within 1.5x of the "
            "flat region): extend repeats")
    return t_flat / (last.seconds / last.repeat)


@dataclass(frozen=True)
class KneeCheck:
    """The runtime of the ``x*2`` kernel at one ``repeat`` against the roofline's bound there.

    The roofline bounds the runtime from below by ``max(bytes / BW, FLOPs / peak)`` (perfect
    overlap of loads and arithmetic); a kernel that overlapped nothing would take their sum. Unlike
    the ratio of measured to predicted knee (which equals compute plateau / memory plateau, so it
    is near 1 whatever happens at the knee), this comparison can fail.

    Attributes:
        repeat: multiplications per element.
        seconds: median time of one call (s).
        memory_s: ``bytes / bandwidth`` (s).
        compute_s: ``FLOPs / peak`` at the peak's (maximum) clock (s).
        telemetry: the :class:`~perflab.core.telemetry.TelemetrySummary` of the timed calls.
        on_gpu: the kernel ran on a GPU, whose peak is the clock model's at the maximum SM
            clock; on a CPU the peak is the one given (a measured rate), at no stated clock.
    """

    repeat: int
    seconds: float
    memory_s: float
    compute_s: float
    telemetry: object = None
    on_gpu: bool = True

    @property
    def clock_fraction(self) -> float:
        """Median SM clock / maximum while timed (1.0 where unknown, e.g. on a CPU)."""
        frac = getattr(self.telemetry, "clock_fraction", None)
        return frac if frac else 1.0

    @property
    def bound_s(self) -> float:
        """The roofline bound ``max(memory_s, compute_s)`` (s)."""
        return max(self.memory_s, self.compute_s)

    @property
    def bound_at_clock_s(self) -> float:
        """The bound with the compute term at the clock the kernel ran at (s)."""
        return max(self.memory_s, self.compute_s / self.clock_fraction)

    @property
    def sum_s(self) -> float:
        """No overlap at all: ``memory_s + compute_s`` (s)."""
        return self.memory_s + self.compute_s

    @property
    def ratio(self) -> float:
        """Measured time / bound (>= 1 unless a ceiling was underestimated)."""
        return self.seconds / self.bound_s

    @property
    def ratio_at_clock(self) -> float:
        """Measured time / bound at the clock the kernel ran at."""
        return self.seconds / self.bound_at_clock_s

    @property
    def verdict(self) -> str:
        """``"at bound"`` (ratio <= 1.05), ``"clock"`` (at the bound once the clock is
        accounted for), ``"partial overlap"`` (below the sum of the two terms) or ``"other"``
        (above the sum: something besides the two roofs limits the kernel)."""
        if self.ratio <= 1.05:
            return "at bound"
        if self.ratio_at_clock <= 1.05:
            return "clock"
        if self.seconds < self.sum_s:
            return "partial overlap"
        return "other"

    def sentence(self, predicted_repeat: float | None = None) -> str:
        """One or two sentences: the measured time, the bound, their ratio and the verdict."""
        gap = {
            "at bound": "at the bound: loads and arithmetic overlapped fully.",
            "clock": ("above the bound only because the SM clock was below its maximum: at "
                      f"the clock it ran at, the bound is {self.bound_at_clock_s * 1e3:.3f} "
                      "ms, and the kernel met it."),
            "partial overlap": (
                f"between the roofline's bound and the sum of the two terms "
                f"({self.sum_s * 1e3:.3f} ms): at the knee neither the memory system nor "
                "the multipliers have slack, so the time a warp waits for its loads is no "
                "longer hidden behind other warps' arithmetic, and the two overlap only in "
                "part" + (f" (at the clock it ran at, {self.ratio_at_clock:.2f}x the bound)."
                          if self.clock_fraction < 0.99 else ".")),
            "other": ("more than the sum of the two terms: something other than the two "
                      "roofs limits this kernel."),
        }[self.verdict]
        formula = (f" (the formula gives {predicted_repeat:.1f})"
                   if predicted_repeat is not None else "")
        return (f"At repeat {self.repeat}{formula} the kernel took {self.seconds * 1e3:.3f} ms "
                f"against a roofline bound of {self.bound_s * 1e3:.3f} ms (memory "
                f"{self.memory_s * 1e3:.3f} ms, compute {self.compute_s * 1e3:.3f} ms "
                + ("at the maximum clock" if self.on_gpu else "at the peak given")
                + f"): {self.ratio:.2f}x, " + gap)


def knee_check(x: torch.Tensor, repeat: int, peak_flops: float, bandwidth: float,
               compile: bool = True) -> KneeCheck:
    """Time the fused ``x*2``-``repeat`` kernel on ``x`` under telemetry and compare it with the
    roofline bound ``max(bytes / bandwidth, FLOPs / peak_flops)``.

    Args:
        x: floating-point tensor on the device to test (any shape); on an H200 use 2**28 float32
            (1 GiB, far beyond the L2).
        repeat: multiplications per element, usually the sweep's power of two nearest the
            predicted knee (:func:`predicted_knee_repeat`).
        peak_flops: the multiply peak (FLOP/s), e.g. :func:`perflab.machine.datasheets.fp32_peak_flops`
            with ``fma=False``.
        bandwidth: the copy bandwidth (bytes/s, read + write), from :mod:`perflab.machine.ceilings`.
        compile: fuse into one kernel (:func:`repeat_multiply`); ``False`` runs eagerly (tests).

    Timing: :func:`perflab.core.telemetry.measure` (``do_bench`` with L2 flushes on CUDA,
    ``torch.utils.benchmark`` on a CPU); bytes and FLOPs from :func:`elementwise_cost`.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``repeat`` not a positive integer, or a non-positive ``peak_flops`` or
            ``bandwidth``.
    """
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        raise TypeError("x must be a floating-point torch.Tensor")
    positive_int("repeat", repeat)
    positive("peak_flops", peak_flops)        # FLOP/s
    positive("bandwidth", bandwidth)          # bytes/s
    fn = repeat_multiply(repeat, compile=compile)
    fn(x)  # compile and warm up outside the timed region
    m = measure(lambda: fn(x), x.device)
    cost = elementwise_cost(x.numel(), repeat, x.dtype)
    return KneeCheck(repeat=repeat, seconds=m.seconds, memory_s=cost.bytes / bandwidth,
                     compute_s=cost.flops / peak_flops, telemetry=m.telemetry,
                     on_gpu=x.device.type == "cuda")


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

def plot_sweep(
    points: Sequence[SweepPoint],
    bandwidth: float,
    peak_flops: float | None,
    knee_measured: float | None = None,
    knee_predicted: float | None = None,
):
    """The essay's three curves against ``repeat``: runtime, achieved FLOP/s, achieved bandwidth.

    ``bandwidth`` (bytes/s) and ``peak_flops`` (FLOP/s, may be None) are drawn as roofs; knees as
    vertical lines. Returns the matplotlib Figure.
    """
    r = [p.repeat for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(r, [p.seconds * 1e3 for p in points], "o-")
    axes[0].set(ylabel="runtime (ms)", title="runtime", yscale="log")
    axes[1].plot(r, [p.flops_per_s / 1e12 for p in points], "o-", color="C1")
    if peak_flops:
        axes[1].axhline(peak_flops / 1e12, ls="--", color="k", lw=1, label="FP32 multiply peak")
        axes[1].legend(loc="upper left", fontsize=8)
    axes[1].set(ylabel="achieved TFLOP/s", title="achieved FLOP/s", yscale="log")
    axes[2].plot(r, [p.bytes_per_s / 1e12 for p in points], "o-", color="C2")
    # a roof of its own colour: two black dashed lines read alike in the shared legend
    axes[2].axhline(bandwidth / 1e12, ls="--", color="C7", lw=1.2, label="copy bandwidth")
    axes[2].legend(loc="lower left", fontsize=8)
    axes[2].set(ylabel="achieved TB/s", title="achieved bandwidth", yscale="log")
    for ax in axes:
        plain_log_ticks(ax.yaxis)     # one tick, "1", hid a panel's scale
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        if knee_predicted:
            ax.axvline(knee_predicted, color="gray", ls=":", lw=1.5)
        if knee_measured:
            ax.axvline(knee_measured, color="C3", ls="-.", lw=1.2)
    if knee_predicted or knee_measured:
        axes[0].text(0.02, 0.95, "dotted: predicted knee\ndash-dot: measured knee",
                     transform=axes[0].transAxes, va="top", fontsize=8)
    # one x label, under the middle panel, for all three (three collided in a narrow column)
    axes[1].set_xlabel("repeat (multiplies per element)")
    return style(fig)


def plot_roofline(
    bandwidth: float,
    peak_flops: float,
    points: Sequence[SweepPoint] = (),
    labelled: Sequence[tuple[str, float, float]] = (),
    extra_roofs: Sequence[tuple[str, float]] = (),
):
    """A roofline: attainable FLOP/s against arithmetic intensity, log-log.

    Args:
        bandwidth: memory roof in bytes/s.
        peak_flops: compute roof in FLOP/s.
        points: sweep points drawn as a connected series.
        labelled: ``(label, intensity FLOP/byte, achieved FLOP/s)`` points to annotate.
        extra_roofs: ``(label, FLOP/s)`` further horizontal roofs (e.g. tensor-core peaks).

    Returns the matplotlib Figure.
    """
    ridge = ridge_point(peak_flops, bandwidth)
    lo = min([ridge / 64] + [p.intensity for p in points] + [i for _, i, _ in labelled])
    hi = max([ridge * 64] + [p.intensity for p in points] + [i for _, i, _ in labelled])
    ai = np.logspace(np.log10(lo / 2), np.log10(hi * 2), 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ai, np.minimum(peak_flops, ai * bandwidth) / 1e12, "k-", lw=2, label="roofline (compute and memory roofs)")
    for i, (name, roof) in enumerate(extra_roofs):
        ax.plot(ai, np.minimum(roof, ai * bandwidth) / 1e12, ls="--", lw=1, color=f"C{i + 4}", label=name)
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.text(ridge * 1.1, peak_flops / 1e12 * 1.15, f"ridge {ridge:.3g} FLOP/B", fontsize=8, color="gray")
    if points:
        ax.plot([p.intensity for p in points], [p.flops_per_s / 1e12 for p in points], "o-", color="C1",
                label="x*2 repeat (measured)")
    for name, intensity, rate in labelled:
        ax.plot([intensity], [rate / 1e12], "s", color="C3")
        ax.annotate(name, (intensity, rate / 1e12), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
           ylabel="TFLOP/s", title="roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return style(fig)
