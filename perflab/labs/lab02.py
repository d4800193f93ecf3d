"""Lab 2's checks: a cache capacity read off a bandwidth curve, with a recipe that survives a
real GPU curve, and a check that the answer is a physical one.

The recipe (what exercise 1 asks for, :func:`capacity_reference`):

1. smooth the curve with a running median of three points (one stray point cannot make or hide
   a step);
2. *fast* is the smoothed curve's maximum, *slow* the median of the smoothed points at four
   times the maximum's size and beyond (the plateau past the cache);
3. the threshold is their geometric mean;
4. the capacity is the last size, from the maximum on, before the smoothed curve first falls
   below the threshold.

Its first edition took *fast* as the median of the three smallest sizes and *slow* as that of
the three largest, and returned the largest size still above the threshold. On the course's
H200 that read **512 MiB for a 60 MiB L2**: the smallest sizes of a GPU curve are its slowest
(each short kernel pays a start-up of about a microsecond), so the threshold fell below the HBM
plateau. :data:`H200_FIRST_EDITION_CURVE` is that curve, kept as a test: a recipe that still
returns the largest size on it is wrong, whatever it returns on a textbook staircase.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from perflab.labs.exercises import ExerciseFailed, _number, _verdict, check_close, record

__all__ = ["CAPACITY_BAND", "H200_FIRST_EDITION_CURVE", "capacity_reference", "check_capacity",
           "check_physical"]

#: The L2 capacity read from a GPU's curve must lie within these fractions of the size the
#: driver reports (``L2_cache_size``): the L2 is two partitions that can each hold a copy of
#: what both halves of the chip read, so the fall can come at half the size; other data in the
#: cache and the recipe's rounding down to a measured size take a little more (chapter 2).
CAPACITY_BAND = (0.4, 1.1)

#: Working-set sizes (bytes) and bandwidths (bytes/s) of the report card's L2 curve on the
#: course's H200 in the run of 3 December 2026 (commit 15861cf): ``dst.copy_(src)`` replayed from
#: a CUDA graph, two sizes per octave from 2 MiB to 512 MiB, the curve of that run's
#: ``fig-lab02-working-set``, read back from the figure to 3 significant digits (the notebook
#: stored the figure, not the numbers). Its dips are the memcpy's (chapter 2's GPU page), its
#: slow small sizes the kernels' start-up.
H200_FIRST_EDITION_CURVE: tuple[tuple[int, ...], tuple[float, ...]] = (
    (2097152, 2965504, 4194304, 5931008, 8388608, 11862016, 16777216, 23728128, 33554432,
     47452160, 67108864, 94904320, 134217728, 189812736, 268435456, 379625472, 536870912),
    (1.79e12, 2.05e12, 2.56e12, 3.16e12, 3.77e12, 4.35e12, 5.08e12, 3.00e12, 5.82e12, 2.75e12,
     3.89e12, 3.96e12, 4.03e12, 2.73e12, 4.17e12, 4.19e12, 4.23e12),
)


def _smooth(values: Sequence[float]) -> list[float]:
    return [statistics.median(values[max(0, i - 1): i + 2]) for i in range(len(values))]


def capacity_reference(sizes: Sequence[float], bandwidths: Sequence[float]) -> float:
    """The recipe of the module docstring: the capacity (bytes) read off a bandwidth curve.

    Args:
        sizes: working sets in bytes, increasing.
        bandwidths: bytes/s at each size (positive).

    Raises:
        ValueError: fewer than 3 points, lengths that differ, sizes not increasing, or a
            bandwidth that is not positive.
    """
    sizes, bws = [float(s) for s in sizes], [float(b) for b in bandwidths]
    if len(sizes) != len(bws) or len(sizes) < 3:
        raise ValueError(f"need at least 3 (size, bandwidth) points, got {len(sizes)} and {len(bws)}")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError("sizes must be strictly increasing")
    if min(bws) <= 0:
        raise ValueError("bandwidths must all be positive")
    smooth = _smooth(bws)
    peak = max(range(len(smooth)), key=smooth.__getitem__)
    beyond = [b for s, b in zip(sizes, smooth) if s >= 4 * sizes[peak]]
    slow = statistics.median(beyond) if beyond else smooth[-1]
    threshold = math.sqrt(smooth[peak] * slow)
    capacity = sizes[peak]
    for s, b in zip(sizes[peak:], smooth[peak:]):
        if b < threshold:
            break
        capacity = s
    return capacity


def check_capacity(capacity_from_curve, sizes: Sequence[float], bandwidths: Sequence[float],
                   what: str = "capacity from your curve") -> bool:
    """Exercise 1's check: the student's function against the recipe, on the student's curve.

    Raises:
        ExerciseFailed: a wrong or missing answer.
    """
    got = capacity_from_curve(list(sizes), list(bandwidths))
    return check_close(got, capacity_reference(sizes, bandwidths), what, rtol=1e-9,
                       hint="smooth with a running median of 3; fast = the smoothed maximum, slow = "
                            "the median from 4x its size on; their geometric mean; the last size "
                            "before the curve first falls below it")


def check_physical(capacity: float, reported: float, what: str = "L2 read from your curve") -> bool:
    """On a GPU: the capacity must lie within :data:`CAPACITY_BAND` of the size the driver
    reports. A correct recipe on a curve that is not the cache's (a probe with dips of its
    own, a start-up left in) fails here, which is the point: the arithmetic is right, the
    measurement is not.

    Raises:
        ExerciseFailed: the capacity is outside the band, or an input is not a positive number.
    """
    c, r = _number(what, capacity), _number("the reported size", reported)
    if c <= 0 or r <= 0:
        raise ExerciseFailed(f"✗ {what}: sizes must be positive, got {c:g} and {r:g}.")
    ratio = c / r
    lo, hi = CAPACITY_BAND
    record(what + " / reported", ratio)
    passed = lo <= ratio <= hi
    _verdict("physical", what, passed, capacity=c, reported=r, band=list(CAPACITY_BAND))
    if passed:
        print(f"✓ {what}: {ratio:.2f} of the {r / 2**20:.0f} MiB the driver reports, within "
              f"{lo:g}-{hi:g}: a physical answer.")
        return True
    raise ExerciseFailed(
        f"✗ {what}: {c / 2**20:.1f} MiB is {ratio:.2f} of the {r / 2**20:.0f} MiB the driver "
        f"reports, outside {lo:g}-{hi:g}: the curve or the recipe reads something other than the "
        "cache (look at the figure: are its smallest sizes its fastest?).")
