"""Lab 1's checks: a timer of your own against the library's, under load."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from perflab.labs.exercises import ExerciseFailed, _number, record

__all__ = ["check_timer", "timer_tolerance"]


def timer_tolerance(ratios: Sequence[float], floor: float = 0.15, cap: float = 1.0) -> float:
    """The relative tolerance for a timer comparison, from the spread of repeated trials.

    ``ratios`` are (your time / library time) of alternating trials on the same kernel. The
    tolerance is four times the median absolute deviation of their logarithms (a noise estimate
    that one outlier cannot move), at least ``floor`` and at most ``cap``: a quiet machine gets
    ``floor``, a loaded one a wider band (on a 2-core machine with a load average of 10, single
    trials of a 0.3 ms kernel swing 100x when a time slice is lost), and no amount of noise lets a
    timer that is off by more than ``1 + cap`` (a factor of 2 by default) pass. The wrong timers
    this guards against are off by far more: a host clock without events or synchronization on a
    GPU reads the launch, 10-100x too low.

    Raises:
        ValueError: fewer than 3 ratios, or one that is not positive.
    """
    if len(ratios) < 3:
        raise ValueError(f"ratios needs at least 3 trials, got {len(ratios)}")
    if any(not (r > 0) for r in ratios):
        raise ValueError(f"ratios must all be positive, got {list(ratios)}")
    logs = [math.log(r) for r in ratios]
    mid = statistics.median(logs)
    mad = statistics.median(abs(x - mid) for x in logs)
    return min(cap, max(floor, math.expm1(4 * mad)))

def check_timer(mine_s: Sequence[float], library_s: Sequence[float], what: str = "your timer") -> bool:
    """Pass when your timer agrees with a reference timer over alternating trials on one kernel.

    Use a reference that times calls the same way (:func:`perflab.core.timing.event_timer`): on a
    shared CPU, ``torch.utils.benchmark``'s long blocks of back-to-back calls were measured
    10-100x slower than a right 30-call median timer at a load average of 8 on 2 cores.

    ``mine_s[i]`` and ``library_s[i]`` are the medians the two timers reported in trial ``i``
    (seconds; the trials alternate, so a burst of load hits both alike). The best (smallest)
    time of each timer is compared, since other programs only ever slow a trial down: the ratio
    of the two bests, or else the median of the per-trial ratios (one lucky trial of one timer
    moves the first, not the second: a 2-core CI machine once read 0.68x for a right timer
    whose paired trials agreed), must lie within :func:`timer_tolerance` (from the per-trial
    ratios) of 1. A wrong timer is off by 8x or more in both.

    Raises:
        ExerciseFailed: the timers disagree (the message says whether yours reads too low: no
            synchronization / events, or too high: no warm-up), or an input is not a positive number.
        ValueError: the two lists differ in length or hold fewer than 3 trials.
    """
    if len(mine_s) != len(library_s):
        raise ValueError(f"mine_s has {len(mine_s)} trials, library_s {len(library_s)}")
    mine = [_number(what, m) for m in mine_s]
    lib = [_number(what, m) for m in library_s]
    if min(mine) <= 0 or min(lib) <= 0:
        raise ExerciseFailed(f"✗ {what}: every time must be positive, got {mine}.")
    ratios = [m / b for m, b in zip(mine, lib)]
    tol = timer_tolerance(ratios)
    ratio = min(mine) / min(lib)
    # the median of the paired ratios is a second estimate of the same number: one lucky trial
    # of either timer (faster than all of the other's) moves the ratio of the bests, not it
    paired = statistics.median(ratios)
    record(what, ratio)
    inside = lambda r: 1 / (1 + tol) <= r <= 1 + tol
    if not inside(ratio) and inside(paired):
        ratio = paired
    if inside(ratio):
        print(f"✓ {what} agrees with the reference timer: best of {len(ratios)} trials {ratio:.3f}x its time "
              f"(tolerance ±{tol:.0%} from their spread).")
        return True
    why = ("it reads too low: on a GPU, record CUDA events (or synchronize) so the kernel, not its launch, is timed"
           if ratio < 1 else "it reads too high: run the warm-up calls before timing, and time only fn()")
    raise ExerciseFailed(f"✗ {what} reports {ratio:.3g}x the reference timer's time (tolerance ±{tol:.0%}): {why}.")
