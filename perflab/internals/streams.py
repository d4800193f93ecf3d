"""A stream of calls, split: the host's time issuing it, the wait for the device, and bursts.

A benchmark that times a stream of calls of one function and synchronizes at the end reports
wall time per call. When the host is the slower side, that wall time is the host's issue time
plus the wait for the last call's kernel; a model that predicts the stream from a host cost
measured elsewhere (bursts from an empty queue, another moment) misses whatever the long
stream adds on the host. Chapter 1 times the two from the same stream, in rounds
(:func:`stream_costs`), and sets the bursts beside them.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch

from perflab.core.rounds import Spread, interleaved
from perflab.core.timing import Stopwatch, synchronize
from perflab.core.validate import positive_int
from perflab.internals.overhead import issue_time

__all__ = ["stream_costs"]


def _collections() -> int:
    """Garbage collections the interpreter has run so far, all generations."""
    return sum(g["collections"] for g in gc.get_stats())


def _stream(fn: Callable[[], object], device: torch.device | str,
            calls: int) -> tuple[float, float, int]:
    """One stream of ``calls`` calls from an empty queue: (host seconds per call before the
    wait, wall seconds per call after it, garbage collections run during it)."""
    synchronize(device)
    before = _collections()
    with Stopwatch() as wall:          # the host clock: no synchronize at the start
        for _ in range(calls):
            fn()
        host = wall.elapsed()          # issued, not yet waited for
        synchronize(device)
    return host / calls, wall.seconds / calls, _collections() - before


def stream_costs(fn: Callable[[], object], device: torch.device | str, calls: int = 50,
                 rounds: int = 8, burst: int = 10) -> dict[str, Spread]:
    """What a stream of calls costs, split into the host's part and the wait, over rounds.

    Each round (:func:`perflab.core.rounds.interleaved`, after one discarded warm-up round)
    times two things, in rotating order: a **stream** of ``calls`` back-to-back calls from an
    empty queue, whose host clock is read once all are issued (before waiting) and again after
    a synchronize; and **bursts** of ``burst`` calls timed by
    :func:`perflab.internals.overhead.issue_time` (the median of five bursts, each from an
    empty queue). The stream's wall time is what a benchmark of the call reports; its host time
    is what the host spent issuing those same calls; the difference is the wait for the device
    at the end. The bursts' median leaves out what happens only now and then in a long stream
    (a garbage collection of the interpreter, counted here too), which the stream's own host
    time includes.

    Args:
        fn: the call (its result is discarded).
        device: where ``fn`` runs (synchronized around each stream and burst).
        calls: calls per stream (>= 1).
        rounds: kept rounds (>= 1; from 8 the spreads are inter-quartile ranges).
        burst: calls per burst (>= 1).

    Returns:
        ``{"stream": …, "burst": …, "host": …, "collections": …}``, each a
        :class:`perflab.core.rounds.Spread` over the rounds: wall seconds per call of the
        stream, host seconds per call of the bursts, host seconds per call of the stream before
        its wait, and garbage collections (all generations) per stream.

    Raises:
        ValueError: ``calls``, ``rounds`` or ``burst`` below 1.
    """
    for name, v in (("calls", calls), ("rounds", rounds), ("burst", burst)):
        positive_int(name, v)
    split: list[tuple[float, float, int]] = []

    def stream() -> float:
        split.append(_stream(fn, device, calls))
        return split[-1][1]

    out = interleaved({"stream": stream,
                       "burst": lambda: issue_time(fn, device, calls=burst)},
                      rounds=rounds, warmup=1)
    kept = split[1:]                   # the warm-up round's stream is discarded
    out["host"] = Spread(tuple(h for h, _, _ in kept))
    out["collections"] = Spread(tuple(float(c) for _, _, c in kept))
    return out
