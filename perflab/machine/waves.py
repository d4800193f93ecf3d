"""Tiles and waves: how a matrix product's grid of output tiles maps onto the SMs, and its cost.

:func:`tile_count`, :func:`wave_count` and :func:`wave_sweep` show how a matrix product's grid of
output tiles maps onto the SMs in *waves*, and why run time grows in steps (wave quantization;
NVIDIA's "Matrix Multiplication Background" guide); :func:`wave_model` predicts a product's rate
from its last wave's share (chapter 6), :func:`fit_waves` fits the steps,
:func:`batch_wave_sweep` and :func:`fit_wave_width` do it with a batch of equal products, whose
kernel choice does not change along the sweep.

Units: seconds, FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from perflab.core.device import need_gpu
from perflab.core.fits import fit_line
from perflab.core.progress import progress as show_progress
from perflab.core.timing import event_timer
from perflab.core.validate import integers, number, positive_int

__all__ = ["tile_count", "wave_count", "wave_model", "wave_sweep", "WaveFit", "fit_waves", "batch_wave_sweep",
           "WaveWidthFit", "fit_wave_width"]


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


def batch_wave_sweep(
    device: torch.device | str,
    m: int,
    n: int,
    k: int,
    batches: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
    reps: int = 10,
    progress: bool = False,
) -> list[tuple[int, float]]:
    """Time ``torch.bmm(A[b, m, k], B[b, k, n])`` for each batch count ``b``: ``[(b, seconds)]``.

    Every product of the batch has the same shape, so the library's kernel (its tile shape) is
    chosen for one ``m x n x k`` problem and only the number of thread blocks, ``b`` times the
    tiles of one product, changes along the sweep: the time should climb one wave at a time.
    Each point is the median of ``reps`` back-to-back calls timed with CUDA events after 3
    warm-up calls (:func:`perflab.core.timing.event_timer`, no L2 flush: the host queues the calls
    ahead, so launch overhead is hidden whenever a call lasts longer than a launch); on a CPU,
    ``time.perf_counter`` (for tests).

    Args:
        device: where to run.
        m, n, k: the shape of each product (positive).
        batches: batch counts to time (positive).
        dtype: operand dtype (bf16 runs on the tensor cores).
        reps: timed calls per point (>= 1).

    Raises:
        ValueError: empty ``batches`` or a non-positive size.
    """
    batches = list(batches)
    for name, v in (("m", m), ("n", n), ("k", k), ("reps", reps)):
        positive_int(name, v)
    integers("batches", batches)
    dev = torch.device(device)
    top = max(batches)
    a_full = torch.randn(top, m, k, device=dev).to(dtype)
    b_full = torch.randn(top, k, n, device=dev).to(dtype)
    out = []
    for b in show_progress(batches, "batch wave sweep", progress):
        a, bb = a_full[:b], b_full[:b]
        out.append((b, event_timer(lambda: torch.bmm(a, bb), dev, warmup=3, reps=reps).median_s))
    return out


@dataclass(frozen=True)
class WaveWidthFit:
    """The staircase that best explains a batch wave sweep, against a straight line.

    Attributes:
        items_per_wave: products of the batch that run at once (``sms x blocks per SM / tiles
            per product``), the width of one step.
        tile: ``(tile_m, tile_n)`` that width corresponds to.
        blocks_per_sm: thread blocks resident per SM in that staircase.
        staircase_rms: RMS relative residual of ``t = a + s * ceil(b / items_per_wave)``.
        linear_rms: RMS relative residual of ``t = a + c * b`` (no quantization).
        seconds_per_wave: the fitted ``s``.
        fixed_s: the fitted ``a``.
    """

    items_per_wave: float
    tile: tuple[int, int]
    blocks_per_sm: int
    staircase_rms: float
    linear_rms: float
    seconds_per_wave: float
    fixed_s: float

    def waves(self, batch: int) -> int:
        """``ceil(batch / items_per_wave)``."""
        return math.ceil(batch / self.items_per_wave - 1e-9)

    def predict(self, batch: int) -> float:
        """The staircase's time for ``batch`` products, seconds."""
        return self.fixed_s + self.seconds_per_wave * self.waves(batch)


def fit_wave_width(
    points: Sequence[tuple[int, float]],
    m: int,
    n: int,
    sms: int,
    tiles: Sequence[tuple[int, int]] = ((128, 128), (128, 256), (256, 128), (64, 128), (128, 64)),
    blocks_per_sm: Sequence[int] = (1, 2),
) -> WaveWidthFit:
    """Fit a batch wave sweep with a staircase for each candidate tile shape and occupancy.

    A product of ``m x n`` cut into ``tile_m x tile_n`` tiles has ``tile_count(m, n, tile_m,
    tile_n)`` thread blocks; ``sms x blocks_per_sm`` blocks run at once, so a wave holds
    ``sms x blocks_per_sm / tiles`` products and ``b`` products need ``ceil(b / that)`` waves. The
    staircase ``t = a + s x waves`` is fitted for each candidate (:func:`perflab.core.fits.fit_line`,
    relative residuals), the best one wins, and a straight line ``t = a + c b`` is fitted for
    comparison. A staircase residual well below the line's means the waves shape the times.

    Raises:
        ValueError: fewer than 4 points, a non-positive time or size, empty candidates, or a
            sweep that spans a single wave for every candidate.
    """
    if len(points) < 4:
        raise ValueError(f"need at least 4 points, got {len(points)}")
    if not tiles or not blocks_per_sm:
        raise ValueError("tiles and blocks_per_sm must not be empty")
    for name, v in (("m", m), ("n", n), ("sms", sms)):
        positive_int(name, v)
    bs = [b for b, _ in points]
    ts = [t for _, t in points]
    for t in ts:
        number("every time", t, above=0)      # seconds
    linear = fit_line(bs, ts, relative=True)
    best = None
    for tm, tn in tiles:
        for occ in blocks_per_sm:
            width = sms * occ / tile_count(m, n, tm, tn)
            waves = [math.ceil(b / width - 1e-9) for b in bs]
            if len(set(waves)) < 2:
                continue
            fit = fit_line(waves, ts, relative=True)
            if fit.slope > 0 and (best is None or fit.rms_relative < best[0].rms_relative):
                best = (fit, width, (tm, tn), occ)
    if best is None:
        raise ValueError("the sweep spans a single wave for every candidate: widen the batches")
    fit, width, tile, occ = best
    return WaveWidthFit(width, tile, occ, fit.rms_relative, linear.rms_relative, fit.slope,
                        fit.fixed)
