"""Tiles and waves: how a matrix product's grid of output tiles maps onto the SMs, and its cost.

:func:`tile_count`, :func:`wave_count` and :func:`wave_sweep` show how a matrix product's grid of
output tiles maps onto the SMs in *waves*, and why run time grows in steps (wave quantization;
NVIDIA's "Matrix Multiplication Background" guide); :func:`wave_model` predicts a product's rate
from its last wave's share (chapter 6), :func:`fit_waves` fits the steps,
:func:`wave_groups` does it for a batch of equal products from the profiler's record of which
kernel ran at each batch size (its tile in :func:`kernel_tile`, chapter 2): cuBLAS changes its
kernel (tile shape, split of K) with the problem, so each kernel's calls get a staircase of
their own.

Units: seconds, FLOP/s.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from perflab.core.device import need_gpu
from perflab.core.fits import fit_line
from perflab.core.rounds import Spread
from perflab.core.progress import progress as show_progress
from perflab.core.timing import event_timer
from perflab.core.validate import integers, number, positive_int

__all__ = ["tile_count", "wave_count", "wave_model", "wave_sweep", "WaveFit", "fit_waves", "kernel_tile",
           "WaveGroup", "wave_groups"]


def tile_count(m: int, n: int, tile_m: int = 128, tile_n: int = 128) -> int:
    """Output tiles of an ``m x n`` product cut into ``tile_m x tile_n`` tiles: ``ceil(m/tile_m) * ceil(n/tile_n)``.

    A partly filled edge tile costs a whole tile: that is *tile quantization*.

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("m", m), ("n", n), ("tile_m", tile_m), ("tile_n", tile_n)):
        positive_int(name, v)
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def wave_count(tiles: int, sms: int, tiles_per_sm: int = 1) -> int:
    """Waves needed to run ``tiles`` thread blocks on ``sms`` SMs holding ``tiles_per_sm`` each at once.

    ``ceil(tiles / (sms * tiles_per_sm))``: one tile past a multiple of the machine's width costs a
    whole extra wave (*wave quantization*; NVIDIA's "Matrix Multiplication Background" guide).

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("tiles", tiles), ("sms", sms), ("tiles_per_sm", tiles_per_sm)):
        positive_int(name, v)
    return math.ceil(tiles / (sms * tiles_per_sm))


def wave_model(sizes: Sequence[int], plateau: float, sms: int, tile: tuple[int, int] = (128, 256)
               ) -> list[float]:
    """Predicted rate of an ``n x n`` matrix product for each ``n`` in ``sizes``: ``plateau``
    times the share of the last wave that is used, ``T / (sms * ceil(T / sms))`` with
    ``T = ceil(n / tile[0]) * ceil(n / tile[1])`` output tiles (wave quantization; NVIDIA's
    matrix multiplication guide).

    Raises:
        ValueError: a size, ``sms`` or a tile side that is not positive.
    """
    number("sms", sms, minimum=1)
    for name, v in [("tile", t) for t in tile] + [("sizes", n) for n in sizes]:
        number(name, v, minimum=1)
    out = []
    for n in sizes:
        tiles = math.ceil(n / tile[0]) * math.ceil(n / tile[1])
        out.append(plateau * tiles / (sms * math.ceil(tiles / sms)))
    return out


def wave_sweep(
    device: torch.device | str,
    m: int,
    k: int,
    ns: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = False,
) -> list[tuple[int, float]]:
    """Time ``A[m,k] @ B[k,n]`` for each ``n`` in ``ns``: ``[(n, seconds)]``.

    Each point is the median of 20 CUDA-event timings with the L2 flushed before each
    (:func:`perflab.core.timing.event_timer`); 20 short products take milliseconds, so a sweep of a
    hundred sizes takes about a second.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: empty ``ns`` or a non-positive size.
    """
    need_gpu("wave_sweep")
    ns = list(ns)
    if not ns:
        raise ValueError("ns must hold at least one size")
    for name, v in [("m", m), ("k", k)] + [("ns", n) for n in ns]:
        number(name, v, minimum=1)
    dev = torch.device(device)
    a = torch.randn(m, k, device=dev).to(dtype)
    b_full = torch.randn(k, max(ns), device=dev).to(dtype)
    iterator = show_progress(ns, "wave sweep", progress)
    out = []
    for n in iterator:
        b = b_full[:, :n].contiguous()
        out.append((n, event_timer(lambda: a @ b, dev, warmup=5, reps=20, flush=True).median_s))
    return out


@dataclass(frozen=True)
class WaveFit:
    """How well a staircase (time proportional to waves) explains a wave sweep, against a line.

    Attributes:
        tile: ``(tile_m, tile_n)`` of the best staircase.
        staircase_rms: RMS relative residual of ``t = a + b * waves(n)``.
        linear_rms: RMS relative residual of ``t = a + b * n`` (no quantization).
        seconds_per_wave: the fitted ``b`` of the staircase.
    """

    tile: tuple[int, int]
    staircase_rms: float
    linear_rms: float
    seconds_per_wave: float


def fit_waves(
    points: Sequence[tuple[int, float]],
    m: int,
    sms: int,
    tiles: Sequence[tuple[int, int]] = ((128, 128), (128, 256), (256, 128), (64, 128)),
) -> WaveFit:
    """Fit a wave sweep's times with a staircase for each candidate tile shape and with a line.

    For each ``(tile_m, tile_n)`` the model is ``t = a + b * wave_count(tile_count(m, n, tile_m,
    tile_n), sms)``, fitted by least squares; the tile with the smallest RMS relative residual
    wins (:func:`perflab.core.fits.fit_line`). A staircase residual well below the line's means wave quantization shapes the times;
    similar residuals mean the library's choices (other tile shapes, split-K, stream-K) smooth it.

    Raises:
        ValueError: fewer than 4 points, a non-positive time, or an empty ``tiles``.
    """
    if len(points) < 4:
        raise ValueError(f"need at least 4 points, got {len(points)}")
    if not tiles:
        raise ValueError("tiles must not be empty")
    ns = [n for n, _ in points]
    ts = [t for _, t in points]
    for t in ts:
        number("every time", t, above=0)      # seconds
    linear_rms = fit_line(ns, ts).rms_relative
    best = None
    for tm, tn in tiles:
        waves = [wave_count(tile_count(m, n, tm, tn), sms) for n in ns]
        if len(set(waves)) < 2:
            continue
        fit = fit_line(waves, ts)
        rms, slope = fit.rms_relative, fit.slope
        if best is None or rms < best[1]:
            best = ((tm, tn), rms, slope)
    if best is None:
        raise ValueError("the sweep spans a single wave for every tile shape: widen the range of n")
    return WaveFit(best[0], best[1], linear_rms, best[2])


_TILE = re.compile(r"(?:_|tilesize)(\d+)x(\d+)")


def kernel_tile(name: str) -> tuple[int, int] | None:
    """The output tile a matrix-product kernel's name carries, ``(tile_m, tile_n)``, or None.

    cuBLAS names its kernels after their tiles: ``nvjet_tst_128x96_64x4_...`` (Hopper's
    ``nvjet`` kernels), ``sm90_xmma_gemm_..._tilesize128x128x64_...``, CUTLASS's
    ``..._128x256_64x3_...``: the first pair of sizes of at least 32 is the output tile.
    """
    for a, b in _TILE.findall(name):
        if int(a) >= 32 and int(b) >= 32:
            return int(a), int(b)
    return None


@dataclass(frozen=True)
class WaveGroup:
    """The calls of a batch sweep that ran one kernel, with the staircase fitted to them.

    Attributes:
        kernel: the kernel's name (the longest kernel of each call).
        tile: its output tile ``(tile_m, tile_n)`` from the name (None if the name has none).
        ctas: thread blocks that run at once: the kernel's grid, at most one per SM.
        batches: the batch counts ``b`` that ran it, increasing.
        rounds: for each, ``ceil(b * tiles per product / ctas)``: how many times each running
            block takes a new tile (a wave of a plain grid, a loop turn of a persistent one).
        seconds: for each, the device time of one call (a Spread over the repeats).
        round_s: the fitted time per round (a Spread: one fit per repeat), None when the group
            spans a single round count.
        fixed_s: the fitted intercept (median over the repeats), None likewise.
        staircase_rms, linear_rms: RMS relative residuals of ``t = a + s * rounds`` and of the
            straight line ``t = a + c * b`` (median over the repeats; None likewise).
        product_s: the straight line's slope ``c``, seconds per product in the batch (a Spread:
            one fit per repeat), None likewise: the quantity to compare when the line fits
            better than the staircase (a persistent kernel that splits the work evenly).
    """

    kernel: str
    tile: tuple[int, int] | None
    ctas: int
    batches: tuple[int, ...]
    rounds: tuple[int, ...]
    seconds: tuple[Spread, ...]
    round_s: Spread | None
    fixed_s: float | None
    staircase_rms: float | None
    linear_rms: float | None
    product_s: Spread | None = None

    def predict(self, rounds: int) -> float | None:
        """The fitted staircase's time for ``rounds`` rounds (seconds), None without a fit."""
        if self.round_s is None or self.fixed_s is None:
            return None
        return self.fixed_s + self.round_s.median * rounds


def wave_groups(calls: Sequence[Sequence], batches: Sequence[int], m: int, n: int,
                sms: int) -> list[WaveGroup]:
    """Group a batch sweep's calls by the kernel that ran, and fit each group's staircase.

    Args:
        calls: for each repeat of the sweep, for each batch count, the kernels the call ran
            (:class:`perflab.core.profiler.KernelRecord`: name, grid, duration); a call's
            time is the sum of its kernels' durations, its kernel the longest of them.
        batches: the batch counts ``b``, in the order of each repeat's calls.
        m, n: each product's output is ``m x n``.
        sms: the GPU's SMs.

    Returns:
        One :class:`WaveGroup` per kernel, the group with the most batch counts first.

    Raises:
        ValueError: no repeat, repeats of different lengths, a call with no kernel, or
            a non-positive size.
    """
    for label, v in (("m", m), ("n", n), ("sms", sms)):
        positive_int(label, v)
    batches = list(batches)
    integers("batches", batches)
    if not calls or any(len(rep) != len(batches) for rep in calls):
        raise ValueError("calls must hold, for each repeat, one entry per batch count")
    per_b: dict[int, list] = {}
    for rep in calls:
        for b, kernels in zip(batches, rep):
            if not kernels:
                raise ValueError(f"the call with b = {b} ran no kernel")
            main = max(kernels, key=lambda k: k.duration_us)
            total = sum(k.duration_us * k.launches for k in kernels) * 1e-6
            per_b.setdefault(b, []).append((main, total))
    groups: dict[str, list[int]] = {}
    for b in batches:
        names = [main.name for main, _ in per_b[b]]
        groups.setdefault(max(set(names), key=names.count), []).append(b)
    out = []
    for name, bs in groups.items():
        bs = sorted(set(bs))
        main = per_b[bs[0]][0][0]
        tile = kernel_tile(name)
        grid = math.prod(main.grid) if main.grid else sms
        ctas = max(1, min(grid, sms))
        per_product = tile_count(m, n, *tile) if tile else 1
        rounds = tuple(math.ceil(b * per_product / ctas) for b in bs)
        reps = len(calls)
        times = [[per_b[b][r][1] for b in bs] for r in range(reps)]
        seconds = tuple(Spread(tuple(times[r][i] for r in range(reps))) for i in range(len(bs)))
        round_s = fixed = stair = line = product_s = None
        if len(set(rounds)) >= 2 and len(bs) >= 3:
            fits = [fit_line(rounds, times[r], relative=True) for r in range(reps)]
            lines = [fit_line(bs, times[r], relative=True) for r in range(reps)]
            round_s = Spread(tuple(f.slope for f in fits))
            fixed = statistics.median(f.fixed for f in fits)
            stair = statistics.median(f.rms_relative for f in fits)
            line = statistics.median(f.rms_relative for f in lines)
            product_s = Spread(tuple(f.slope for f in lines))
        out.append(WaveGroup(name, tile, ctas, tuple(bs), rounds, seconds, round_s, fixed,
                             stair, line, product_s))
    out.sort(key=lambda g: -len(g.batches))
    return out


def plot_staircases(groups, steps: bool):
    """Draw chapter 2's wave sweep: each kernel group's time per call (µs) against the batch
    count, one colour per kernel, with its fitted staircase as ticks where it has one. ``steps``:
    whether the fit found a staircase (it sets the title). Returns the matplotlib Figure, not
    yet shown (:func:`perflab.record.plotting.finish` shows it)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, g in enumerate(groups):
        label = f"{g.tile[0]}x{g.tile[1]} tiles" if g.tile else "other"
        ax.plot(g.batches, [t.median * 1e6 for t in g.seconds], "o", ms=3,
                color=f"C{i}", label=label)
        if g.round_s is not None:
            ax.plot(g.batches, [g.predict(r) * 1e6 for r in g.rounds], "_",
                    ms=8, color=f"C{i}")
    ax.set(xlabel="products in the batch (b)", ylabel="time per call (µs)",
           title="one step per round of tiles" if steps else
           "no steps: the times lie on a line in b")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig
