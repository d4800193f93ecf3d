"""Comparing two versions of one work on a machine that drifts and is shared: paired blocks.

Timing A and then B and dividing compares the machine at two moments as much as the two
versions: a GPU that heats up lowers its clock under its power cap, and a shared CI machine's
load comes in bursts. Two answers, both built on :mod:`perflab.core.timing`'s clocks:

* :func:`paired_ratio` times A and B in back-to-back blocks, alternating which goes first, and
  takes the median of the pairs' ratios: a burst slows both blocks of a pair alike.
* :func:`order_effect` reads an ABBA design (A, B, then B, A): did the two timers differ, or did
  whichever ran later read slower?

All times are in **seconds**; this module reads no clock itself (``Stopwatch`` does).
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch

from perflab.core.timing import Stopwatch, timed_window
from perflab.core.validate import number, positive, positive_int

__all__ = ["order_effect", "paired_ratio"]


def order_effect(first: tuple[float, float], second: tuple[float, float],
                 tolerance: float = 0.01) -> str:
    """Whether two timers differ because of the timer or because of the order they ran in.

    Run timers A and B on the same work twice, in the order A, B and then B, A (an ABBA
    design). ``first = (a, b)`` are the times of the first run (A ran first), ``second = (a, b)``
    of the second (A ran last). If the machine drifts (a GPU heating up and lowering its clock
    under its power cap), whichever timer runs later reads slower, so A/B flips side between the
    runs; if one timer measures differently, A/B stays on one side.

    Args:
        first: ``(a_seconds, b_seconds)`` with A run before B (positive).
        second: ``(a_seconds, b_seconds)`` with A run after B (positive).
        tolerance: relative difference counted as "the same" (>= 0).

    Returns:
        ``"later slower"`` (A/B below 1 - tolerance when A ran first and above 1 + tolerance
        when it ran last), ``"earlier slower"`` (the reverse), ``"a slower"`` or
        ``"b slower"`` (the same side in both runs), or ``"same"`` (otherwise).

    Raises:
        ValueError: a time that is not positive, or a negative tolerance.
    """
    number("tolerance", tolerance, minimum=0)
    for label, pair in (("first", first), ("second", second)):
        if len(pair) != 2 or not all(v > 0 for v in pair):
            raise ValueError(f"{label} must be two positive times, got {pair!r}")
    r1, r2 = first[0] / first[1], second[0] / second[1]
    lo, hi = 1 - tolerance, 1 + tolerance
    if r1 < lo and r2 > hi:
        return "later slower"
    if r1 > hi and r2 < lo:
        return "earlier slower"
    if r1 > hi and r2 > hi:
        return "a slower"
    if r1 < lo and r2 < lo:
        return "b slower"
    return "same"


def paired_ratio(base: Callable[[], object], candidate: Callable[[], object],
                 device: torch.device | str = "cpu", pairs: int = 15,
                 block_s: float = 0.01,
                 cpu_threads: int | None = None) -> tuple[float, tuple[float, ...]]:
    """How many times faster ``candidate`` is than ``base``, robust to a shared machine's load.

    Each *pair* times a block of ``base`` calls and a block of ``candidate`` calls back to back
    (alternating which goes first), the device synchronized around each block; the ratio of a
    pair is (base seconds per call) / (candidate seconds per call), and the result is the median
    over ``pairs`` pairs. A busy machine's load comes in bursts that slow both blocks of a pair
    alike, where the best of a few separate runs of each can land in different bursts (a 2-core
    CI machine read an 8 -> 16 batch change, about 2x, as above 3x that way). Every block runs
    the same number of calls, chosen after a warm-up block of two calls each so that a block of ``base``
    lasts about ``block_s`` seconds.

    Args:
        base, candidate: callables of no argument (the slow and the fast version of one work).
        device: where they run (synchronized around each block on CUDA).
        pairs: number of pairs (odd keeps the median one of them), >= 1.
        block_s: seconds a block of ``base`` should last, > 0.
        cpu_threads: on a CPU, the intra-op threads torch uses while timing (restored after);
            None keeps the current setting. One thread makes a comparison of per-call overhead
            immune to another process on the machine: with every core busy elsewhere, torch's
            worker threads of a large operator wait on each other, and a 2-core CI machine read
            a batch-1024 evaluation 4x *slower* than batch 8 that way.

    Returns:
        ``(median ratio, every pair's ratio)``.

    Raises:
        ValueError: ``pairs`` < 1, ``block_s`` <= 0 or ``cpu_threads`` < 1.
    """
    positive_int("pairs", pairs)
    positive("block_s", block_s)
    if cpu_threads is not None:
        positive_int("cpu_threads", cpu_threads)
    dev = torch.device(device)
    if dev.type == "cpu" and cpu_threads is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(cpu_threads)
        try:
            return paired_ratio(base, candidate, dev, pairs, block_s)
        finally:
            torch.set_num_threads(before)

    def block(fn: Callable[[], object], calls: int) -> float:
        with Stopwatch(dev) as sw:
            for _ in range(calls):
                fn()
        return sw.seconds / calls

    block(base, 2), block(candidate, 2)
    calls = max(1, int(block_s / block(base, 2)))
    ratios = []
    with timed_window(dev):
        for i in range(pairs):
            if i % 2:
                cand = block(candidate, calls)
                ratios.append(block(base, calls) / cand)
            else:
                ratios.append(block(base, calls) / block(candidate, calls))
    return statistics.median(ratios), tuple(ratios)
