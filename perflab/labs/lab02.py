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
from typing import Callable, Mapping, Sequence

from perflab.labs.exercises import ExerciseFailed, _number, _verdict, check_close, record
from perflab.machine.datasheets import DATASHEET_L2_BYTES

__all__ = ["CAPACITY_BAND", "DATASHEET_L2_BYTES", "H100_REFERENCE_CURVE", "H200_FIRST_EDITION_CURVE",
           "capacity_reference", "check_capacity", "check_physical", "check_recipe_steps", "l2_reference",
           "ridge_hint"]

#: The L2 capacity read from a GPU's curve must lie within these fractions of the GPU's L2 (its
#: datasheet figure, :func:`l2_reference`; the size the driver reports where the course has no
#: datasheet figure): the L2 is two partitions that can each hold a copy of
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


#: Working-set sizes (bytes) and bandwidths (bytes/s) of chapter 2's L2 curve (``x * 2`` replayed
#: from CUDA graphs, start-up taken out, median of five rounds) in the reference run
#: gpu-2026-12-06d-d911c2d on an H100 80GB HBM3 (50 MiB of L2): the glued
#: ``gpu_l2_curve_nbytes`` and ``gpu_l2_curve_bytes_per_s`` of ``book/02_hardware_gpu.ipynb``,
#: to 3 significant digits. The recipe reads 32 MiB off it (0.64 of the L2).
H100_REFERENCE_CURVE: tuple[tuple[int, ...], tuple[float, ...]] = (
    (10567680, 13316096, 16777216, 21139456, 26632192, 33554432, 42274816, 53264384, 67108864,
     84553728, 106528768, 134217728, 169103360, 213057536, 268435456, 338206720, 426115072,
     536870912, 676413440, 852230144, 1073741824),
    (7.03e12, 6.79e12, 6.31e12, 6.41e12, 6.34e12, 5.26e12, 3.80e12, 3.28e12, 2.93e12, 2.92e12,
     2.94e12, 2.95e12, 2.97e12, 2.98e12, 2.98e12, 3.00e12, 3.00e12, 3.00e12, 3.01e12, 3.01e12,
     3.02e12),
)


def l2_reference(name: str, driver_bytes: float) -> tuple[float, str]:
    """The L2 size a capacity read from a curve is checked against, and whose figure it is:
    ``(bytes, "the datasheet")`` for a GPU in
    :data:`perflab.machine.datasheets.DATASHEET_L2_BYTES` (the whitepapers' figures, sources
    there), else
    ``(driver_bytes, "the driver")`` (``L2_cache_size``).

    Raises:
        ValueError: ``name`` not a string, or ``driver_bytes`` not a positive number.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be the device's name (a string), got {name!r}")
    if isinstance(driver_bytes, bool) or not isinstance(driver_bytes, (int, float)) \
            or not driver_bytes > 0:
        raise ValueError(f"driver_bytes must be a positive number, got {driver_bytes!r}")
    if name in DATASHEET_L2_BYTES:
        return float(DATASHEET_L2_BYTES[name][0]), "the datasheet"
    return float(driver_bytes), "the driver"


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


#: Two made-up curves (KiB sizes 1 ... 2048, bandwidths in any unit) that the recipe's steps exist
#: for: a fall that recovers (the walk stops at the first fall) and a stray fast last point (the
#: end points are smoothed too). A student's one measured curve is smooth and shows neither.
RECIPE_CURVES = {
    "a fall that recovers": [100] * 4 + [20] * 3 + [90] * 3 + [20] * 2,
    "a stray last point": [100] * 6 + [20] * 5 + [150],
}


def check_recipe_steps(capacity_from_curve) -> bool:
    """Exercise 1's check of the recipe's smoothing and first-fall steps: ``capacity_from_curve``
    on each of :data:`RECIPE_CURVES` equals :func:`capacity_reference` there (8 KiB and 32 KiB).

    Raises:
        ExerciseFailed: a curve's capacity differs (the message names the curve).
        TypeError: ``capacity_from_curve`` is not callable.
    """
    if not callable(capacity_from_curve):
        raise TypeError(f"capacity_from_curve must be a function, got {type(capacity_from_curve).__name__}")
    sizes = [2**10 * 2**k for k in range(12)]
    for what, bws in RECIPE_CURVES.items():
        check_close(capacity_from_curve(sizes, bws), capacity_reference(sizes, bws),
                    f"capacity of {what}", rtol=1e-9, hint="smooth the end points too (the median "
                    "of the two values there); the last size before the FIRST fall")
    return True


def check_physical(capacity: float, reported: float, what: str = "L2 read from your curve",
                   source: str = "the driver") -> bool:
    """On a GPU: the capacity must lie within :data:`CAPACITY_BAND` of the GPU's L2,
    ``reported`` bytes as ``source`` gives it (:func:`l2_reference`: the datasheet's figure, or
    the driver's). A correct recipe on a curve that is not the cache's (a probe with dips of its
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
        print(f"✓ {what}: {ratio:.2f} of the {r / 2**20:.0f} MiB {source} gives, within "
              f"{lo:g}-{hi:g}: a physical answer.")
        return True
    raise ExerciseFailed(
        f"✗ {what}: {c / 2**20:.1f} MiB is {ratio:.2f} of the {r / 2**20:.0f} MiB {source} "
        f"gives, outside {lo:g}-{hi:g}: the curve or the recipe reads something other than the "
        "cache (look at the figure: are its smallest sizes its fastest?).")


def _near(ratio: float, factor: float, rtol: float = 0.03) -> bool:
    return factor > 0 and abs(ratio / factor - 1) <= rtol


def ridge_hint(card: Mapping[str, float], cuda: bool) -> Callable[[float], str]:
    """Exercise 2's hint for a wrong ridge point, chosen by the ratio of the answer to the
    right one (:func:`perflab.labs.exercises.check_close` calls it with that ratio): a power of
    1000 is a unit prefix converted on one side only; on a CPU, the ratio of the card's two copy
    bandwidths is the 1-thread one taken for the all-thread one; 2 (or 1/2) is the copy
    bandwidth halved (or doubled) although the card counts bytes read plus written; anything
    else names the two values of the card the ridge divides. ``card`` is the report card's
    values by name (the lab's ``m``).
    """
    rate, bandwidth = (("matmul_tflops_bf16", "gpu_copy_bandwidth_TBps") if cuda else
                       ("cpu_matmul_gflops_fp32", "cpu_memory_bandwidth_GBps"))
    plain = (f"the card's {rate} over its {bandwidth}, each in its unit converted to FLOP/s "
             "and bytes/s, as the card reports them")

    def hint(ratio: float) -> str:
        found = []
        k = round(math.log(ratio, 1000)) if ratio > 0 else 0
        if k and _near(ratio, 1000.0 ** k):
            found.append(f"a factor of {1000.0 ** k:g} is a unit prefix converted on one side "
                         "only: FLOP/s over bytes/s, both in base units (or both with the same "
                         "prefix)")
        one = card.get("cpu_memory_bandwidth_1thread_GBps")
        if not cuda and one and card.get(bandwidth) and _near(ratio, card[bandwidth] / one):
            found.append("that is the ratio of the card's two copy bandwidths: the ridge divides "
                         f"by the all-thread one, {bandwidth}, since the product runs on all "
                         "cores and they share the memory")
        if _near(ratio, 2.0):
            found.append("twice the ridge: the copy bandwidth halved? The card counts bytes read "
                         "plus written, the bytes a FLOP-per-byte ridge divides by: use it as "
                         "it reports it")
        if _near(ratio, 0.5):
            found.append("half the ridge: the copy bandwidth doubled (it already counts read "
                         "plus write), or the rate halved?")
        return "; ".join(found) + "." if found else plain + "."

    return hint
