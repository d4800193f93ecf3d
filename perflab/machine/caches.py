"""The memory hierarchy seen as bandwidth against working-set size.

Read the same buffer of ``nbytes`` over and over: while it fits in a cache, every pass after the
first is served by that cache; once it does not, by the next level down. Plotting read bandwidth
against ``nbytes`` therefore draws a staircase whose treads are the levels' bandwidths and whose
risers sit at their capacities: L1, L2, L3 and DRAM on a CPU core; L2 and HBM on a GPU. This is
the classic way of measuring caches from software (Saavedra and Smith, "Measuring cache and TLB
performance and their effect on benchmark runtimes", IEEE Trans. Computers 44(10), 1995).

On a CPU the kernel is one PyTorch call: ``x.expand(r, n).sum()`` views the
``n``-element buffer ``x`` as ``r`` identical rows (stride 0, no copy) and sums all of them, so one
call streams ``r * nbytes`` bytes out of a working set of ``nbytes`` with a single kernel launch.
A *full* reduction walks the rows in order, so an element is read again only after all ``nbytes``
of the others: the reuse distance is the working set, as the method requires. That probe is
chapter 2's, written on its page (:mod:`perflab.machine.workingset`); this module holds what
reads its curve (:func:`find_steps`, :func:`plot_working_set`). Chapter 2's GPU curve is a copy kernel replayed from CUDA graphs (:mod:`perflab.machine.replay`,
taught on the page), whose per-call times :class:`ReplayCurve` turns into bandwidths with the
kernel's measured start-up taken out. :func:`beyond_cache_numel` sizes a host buffer that no
cache holds (from the last-level cache the OS reports), for a copy that must stream from DRAM.
Units: bytes and bytes/s.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FuncFormatter

from perflab.core.rounds import Spread
from perflab.core.validate import integer, number
from perflab.machine.cpu import cache_levels
from perflab.record.plotting import style

__all__ = [
    "beyond_cache_numel",
    "Step",
    "WorkingSetPoint",
    "find_steps",
    "format_bytes",
    "geometric_sizes",
    "largest_step",
    "match_steps",
    "plot_working_set",
    "ReplayCurve",
]


@dataclass(frozen=True)
class WorkingSetPoint:
    """One point of the curve: a working set of ``nbytes`` was read at ``bytes_per_s``."""

    nbytes: int
    bytes_per_s: float


@dataclass(frozen=True)
class Step:
    """A fall of the bandwidth curve: the working set stopped fitting in one level of the hierarchy.

    Attributes:
        capacity_bytes: where the curve crosses the geometric mean of the bandwidths before and
            after the fall (interpolated in log-log): the capacity read back from the curve.
        last_fast_bytes: the largest measured size before the fall starts.
        first_slow_bytes: the smallest measured size after it ends.
        before_Bps: bandwidth at ``last_fast_bytes`` (bytes/s, smoothed).
        after_Bps: bandwidth at ``first_slow_bytes`` (bytes/s, smoothed).
    """

    capacity_bytes: float
    last_fast_bytes: int
    first_slow_bytes: int
    before_Bps: float
    after_Bps: float

    @property
    def ratio(self) -> float:
        """How many times faster the level above the fall is than the one below it."""
        return self.before_Bps / self.after_Bps


def format_bytes(nbytes: float) -> str:
    """Binary units, as operating systems report caches: ``32768`` -> ``"32 KiB"``, ``62914560`` -> ``"60 MiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if value >= 100 or value == int(value) else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


def geometric_sizes(lo: int, hi: int, per_octave: int = 2, multiple: int = 4096) -> list[int]:
    """Sizes in bytes from ``lo`` to ``hi`` spaced ``per_octave`` to a doubling, rounded to ``multiple``.

    Raises:
        ValueError: ``lo`` not positive, ``hi < lo``, or ``per_octave``/``multiple`` < 1.
    """
    if lo <= 0 or hi < lo:
        raise ValueError(f"need 0 < lo <= hi, got lo={lo}, hi={hi}")
    number("per_octave", per_octave, minimum=1)
    number("multiple", multiple, minimum=1)
    count = int(round(math.log2(hi / lo) * per_octave))
    sizes = []
    for i in range(count + 1):
        s = lo * 2 ** (i / per_octave)
        s = max(multiple, int(round(s / multiple)) * multiple)
        if not sizes or s > sizes[-1]:
            sizes.append(s)
    return sizes


@dataclass(frozen=True)
class ReplayCurve:
    """Per-call times of a kernel replayed from CUDA graphs, at each working-set size, over
    interleaved rounds, with the kernel's start-up measured the same way.

    A kernel replayed back to back from a CUDA graph pays no launch from the host, but each one
    still costs the GPU a start-up (filling the SMs with blocks, draining the last ones) of about
    a microsecond, whatever its size: a 2 MiB copy that moves its bytes in a few hundred
    nanoseconds takes over a microsecond. ``startup`` is that cost, measured as the time per
    call of the same kernel on a working set too small to move any bytes worth counting, in the
    same rounds as the others; the bytes' own time is ``t - startup``, round by round. (The
    chapter's first edition fitted a straight line instead and clamped its negative intercept to
    zero, which read the start-up-bound small sizes as a slow L2.)

    Attributes:
        seconds: ``{nbytes: Spread}`` seconds per call (working set in bytes, per round).
        startup: seconds per call of the tiny working set (the start-up ``d0``), same rounds.

    Raises:
        ValueError: no sizes, a non-positive size, or spreads of different round counts.
    """

    seconds: dict
    startup: Spread

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("seconds must hold at least one working-set size")
        for nbytes, t in self.seconds.items():
            integer("nbytes", nbytes, 1)
            if not isinstance(t, Spread) or t.n != self.startup.n:
                raise ValueError(f"the time of {nbytes} bytes must be a Spread over the "
                                 f"{self.startup.n} rounds of the start-up")
        object.__setattr__(self, "seconds", dict(sorted(self.seconds.items())))

    @property
    def sizes(self) -> list[int]:
        """The working sets, increasing (bytes)."""
        return list(self.seconds)

    def raw(self) -> list[WorkingSetPoint]:
        """Bytes over the median time per call: the start-up left in."""
        return [WorkingSetPoint(n, n / t.median) for n, t in self.seconds.items()]

    def counted(self, nbytes: int, min_share: float = 1.0) -> bool:
        """Whether the bytes' own time at ``nbytes`` is at least ``min_share`` times the
        start-up in every round (the start-up then cannot dominate the rate read from it)."""
        t = self.seconds[nbytes]
        return all(a - d >= min_share * d for a, d in zip(t.values, self.startup.values))

    def bandwidth(self, nbytes: int) -> Spread:
        """``nbytes / (t - startup)`` round by round (bytes/s).

        Raises:
            KeyError: a size that was not measured.
            ValueError: a round whose time does not exceed the start-up.
        """
        t = self.seconds[nbytes]
        left = t - self.startup
        if min(left.values) <= 0:
            raise ValueError(f"at {nbytes} bytes a round took no longer than the start-up")
        return nbytes / left

    def curve(self, min_share: float = 1.0) -> list[WorkingSetPoint]:
        """The start-up-free curve (median over rounds), sizes whose bytes count
        (:meth:`counted`) only."""
        return [WorkingSetPoint(n, self.bandwidth(n).median) for n in self.sizes
                if self.counted(n, min_share)]

    def round_curves(self, min_share: float = 1.0) -> list[list[WorkingSetPoint]]:
        """The start-up-free curve of each round separately (same sizes as :meth:`curve`)."""
        kept = [n for n in self.sizes if self.counted(n, min_share)]
        return [[WorkingSetPoint(n, self.bandwidth(n).values[r]) for n in kept]
                for r in range(self.startup.n)]

    def level(self, lo: float = 0, hi: float = math.inf, min_share: float = 1.0) -> Spread:
        """The bandwidth of a level of the hierarchy: round by round, the median start-up-free
        bandwidth over the counted sizes between ``lo`` and ``hi`` bytes.

        Raises:
            ValueError: no counted size in the range.
        """
        kept = [n for n in self.sizes if lo <= n <= hi and self.counted(n, min_share)]
        if not kept:
            raise ValueError(f"no counted size between {lo:.4g} and {hi:.4g} bytes")
        per_size = [self.bandwidth(n).values for n in kept]
        return Spread(tuple(statistics.median(col) for col in zip(*per_size)))

    def dips(self, depth: float = 0.15) -> list[int]:
        """Sizes whose raw bandwidth lies more than ``depth`` below both neighbours': a
        deterministic dip is a property of the kernel or of the buffers at that size, not of
        a cache level (a level's fall does not come back up)."""
        raw = [p.bytes_per_s for p in self.raw()]
        return [self.sizes[i] for i in range(1, len(raw) - 1)
                if raw[i] < (1 - depth) * min(raw[i - 1], raw[i + 1])]


def _median3(values: Sequence[float]) -> list[float]:
    out = []
    for i in range(len(values)):
        window = sorted(values[max(0, i - 1): i + 2])
        out.append(window[len(window) // 2] if len(window) == 3 else sum(window) / len(window))
    return out


def find_steps(
    sizes: Sequence[float],
    bandwidths: Sequence[float],
    min_drop: float = 0.15,
    tolerance: float = 0.03,
) -> list[Step]:
    """Read cache capacities back from a bandwidth-vs-working-set curve.

    The curve (``sizes`` in bytes, increasing; ``bandwidths`` in bytes/s) is first smoothed with a
    running median of 3 (one noisy point cannot make or hide a step). A *fall* is a run of
    consecutive points each lower than the one before by more than ``tolerance`` (relative);
    it counts as a step when the whole run loses at least ``min_drop`` of the bandwidth. The
    capacity is where the smoothed curve crosses the geometric mean of the bandwidths at the run's
    two ends, interpolated in log-log: with a sharp fall between two measured sizes it lies between
    them; with a gradual one (as when a cache is shared, or not strictly LRU) in the middle.

    Returns the steps from the smallest capacity up (possibly none).

    Raises:
        ValueError: fewer than 3 points, lengths that differ, sizes not increasing, or a
            non-positive size or bandwidth; ``min_drop`` outside (0, 1) or ``tolerance`` < 0.
    """
    sizes = [float(s) for s in sizes]
    bws = [float(b) for b in bandwidths]
    if len(sizes) != len(bws):
        raise ValueError(f"sizes and bandwidths differ in length: {len(sizes)} vs {len(bws)}")
    if len(sizes) < 3:
        raise ValueError(f"need at least 3 points to find a step, got {len(sizes)}")
    if min(sizes) <= 0 or min(bws) <= 0:
        raise ValueError("sizes and bandwidths must all be positive")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError("sizes must be strictly increasing")
    number("min_drop", min_drop, above=0, below=1)
    number("tolerance", tolerance, minimum=0)
    y = _median3([math.log(b) for b in bws])
    x = [math.log(s) for s in sizes]
    small = -math.log(1 - tolerance) if tolerance < 1 else float("inf")
    needed = -math.log(1 - min_drop)
    steps = []
    i = 0
    while i < len(y) - 1:
        if y[i] - y[i + 1] <= small:
            i += 1
            continue
        j = i + 1
        while j < len(y) - 1 and y[j] - y[j + 1] > small:
            j += 1
        if y[i] - y[j] >= needed:
            mid = (y[i] + y[j]) / 2
            k = next(k for k in range(i, j) if y[k] >= mid > y[k + 1])
            frac = (y[k] - mid) / (y[k] - y[k + 1])
            capacity = math.exp(x[k] + frac * (x[k + 1] - x[k]))
            steps.append(Step(capacity, int(sizes[i]), int(sizes[j]), math.exp(y[i]), math.exp(y[j])))
        i = j
    return steps


def largest_step(steps: Sequence[Step]) -> Step | None:
    """The step with the largest fall (before / after), e.g. the last-level cache to DRAM; None if none."""
    return max(steps, key=lambda s: s.ratio) if steps else None


def match_steps(steps: Sequence[Step], sizes: Sequence[float], max_factor: float = 4.0) -> list[Step | None]:
    """Pair reported capacities with steps read from a curve, one step per capacity at most.

    ``sizes`` (bytes, e.g. the OS's L1d, L2, L3) are taken smallest first; each gets the unused
    step nearest to it on a log scale, provided it lies within ``max_factor`` of it, else None
    (that level left no visible step: its bandwidth is too close to the next level's, or noise
    hid it). Returns one entry per size, in the order given.

    Raises:
        ValueError: a non-positive size or ``max_factor`` < 1.
    """
    number("max_factor", max_factor, minimum=1)
    if any(s <= 0 for s in sizes):
        raise ValueError("sizes must all be positive")
    unused = list(steps)
    out: dict[int, Step | None] = {}
    for i in sorted(range(len(sizes)), key=lambda j: sizes[j]):
        best = min(unused, key=lambda s: abs(math.log(s.capacity_bytes / sizes[i])), default=None)
        if best is not None and abs(math.log(best.capacity_bytes / sizes[i])) <= math.log(max_factor):
            out[i] = best
            unused.remove(best)
        else:
            out[i] = None
    return [out[i] for i in range(len(sizes))]


def plot_working_set(
    curves: dict[str, Sequence[WorkingSetPoint]],
    reported: Sequence[tuple[str, float]] = (),
    steps: Sequence[Step] = (),
    unit: float = 1e9,
    unit_label: str = "GB/s",
    title: str = "read bandwidth against working-set size",
    ylabel: str = "read bandwidth",
):
    """Draw bandwidth-vs-working-set curves (log-log) with capacities marked.

    Args:
        curves: ``{label: points}``, one line each.
        reported: ``(label, bytes)`` capacities the OS or driver reports: dashed vertical lines.
        steps: capacities read back from the curve (:func:`find_steps`): dotted vertical lines.
        unit, unit_label: the y axis is ``bytes_per_s / unit``, in ``unit_label``.
        ylabel: what the y axis measures (a copy counts bytes read plus bytes written).

    Returns the matplotlib Figure, in the book's style (:func:`perflab.record.plotting.style`); a
    page shows it with :func:`perflab.record.plotting.finish`.
    """
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (label, points) in enumerate(curves.items()):
        ax.plot([p.nbytes for p in points], [p.bytes_per_s / unit for p in points], "o-", ms=3,
                color=f"C{i}", label=label)
    top = ax.get_ylim()[1]
    for j, (label, nbytes) in enumerate(reported):
        ax.axvline(nbytes, color="0.4", ls="--", lw=1)
        ax.text(nbytes * 1.05, top * 0.92 / (1.35 ** (j % 3)), f"{label} (reported)", fontsize=8,
                color="0.3", rotation=90, va="top")
    for s in steps:
        ax.axvline(s.capacity_bytes, color="C3", ls=":", lw=1.5)
    if steps:
        ax.plot([], [], color="C3", ls=":", label="capacity read from the curve")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set(xlabel="working set (bytes, log scale)", ylabel=f"{ylabel} ({unit_label})", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return style(fig)


def beyond_cache_numel(factor: float = 4.0, element_size: int = 4,
                       minimum: int = 2**24, maximum: int = 2**28,
                       sysfs: str | None = None) -> int:
    """Elements per tensor for a host copy that streams from DRAM, not from the caches.

    The last-level cache the OS reports (``perflab.machine.cpu.cache_levels``: size of one instance,
    times the number of instances, ``os.cpu_count() / shared_by``) times ``factor``, divided
    by ``element_size``, rounded up to a power of two, clipped to ``[minimum, maximum]``
    (the maximum keeps a many-socket host within memory and time: 2**28 float32 is 1 GiB).
    Without cache information from the OS, ``minimum``. ``sysfs`` points elsewhere, for tests.

    Raises:
        ValueError: ``factor`` < 1, a non-positive ``element_size`` or ``minimum``, or
            ``maximum`` < ``minimum``.
    """
    number("factor", factor, minimum=1)
    number("element_size", element_size, minimum=1)
    number("minimum", minimum, minimum=1)
    number("maximum", maximum, minimum=minimum)
    levels = cache_levels(sysfs)
    if not levels:
        return int(minimum)
    last = max(levels, key=lambda c: (c.level, c.size_bytes))
    instances = max(1, (os.cpu_count() or 1) // max(1, last.shared_by))
    total = last.size_bytes * instances
    numel = math.ceil(factor * total / element_size)
    return min(int(maximum), max(int(minimum), 1 << (numel - 1).bit_length()))
