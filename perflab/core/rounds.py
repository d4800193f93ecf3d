"""Measurements with a spread: interleaved rounds.

One timing of A and one of B, taken one after the other, differ by whatever changed in between:
the GPU's clock under its power cap, another process on the host, the allocator's state. A
verdict drawn from them can flip on the next run of the same page (the course's second run of
4 December 2026 flipped 18). The remedy is old and simple: measure in **rounds**, each round
running every variant once (A, B, C, then B, C, A, ...: the order rotates, so no variant always
runs first), and report each quantity as the median over rounds with its spread. A ratio of two
variants is taken round by round (A's round k over B's round k), so a drift that slows both
cancels.

:class:`Spread` holds the per-round values; :func:`interleaved` runs the rounds;
:func:`perflab.record.claims.compare` and :func:`perflab.record.claims.judge` take a
:class:`Spread` and say "undecided" when a band's edge lies inside it.

The spread is the range (min–max) over fewer than 8 rounds and the inter-quartile range from 8
rounds on (a single stray round then no longer decides); :attr:`Spread.kind` says which.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from perflab.core.validate import integer, positive_int

__all__ = ["IQR_FROM", "Spread", "interleaved", "spread"]

#: From this many rounds on, a spread is the inter-quartile range rather than the range.
IQR_FROM = 8


@dataclass(frozen=True)
class Spread:
    """Per-round values of one measured quantity (any unit), with their median and spread.

    Attributes:
        values: one value per round, in round order (at least one, all finite).

    Raises:
        ValueError: no values, or a value that is not a finite number.
    """

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        vals = tuple(self.values)
        if not vals:
            raise ValueError("values must hold at least one round")
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"values must be finite numbers, got {v!r}")
        object.__setattr__(self, "values", tuple(float(v) for v in vals))

    @property
    def n(self) -> int:
        """Number of rounds."""
        return len(self.values)

    @property
    def median(self) -> float:
        """Median over the rounds."""
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        """Low end of the spread: the minimum (under :data:`IQR_FROM` rounds) or the first
        quartile."""
        if self.n < IQR_FROM:
            return min(self.values)
        return statistics.quantiles(self.values, n=4, method="inclusive")[0]

    @property
    def hi(self) -> float:
        """High end of the spread: the maximum or the third quartile (see :attr:`lo`)."""
        if self.n < IQR_FROM:
            return max(self.values)
        return statistics.quantiles(self.values, n=4, method="inclusive")[2]

    @property
    def kind(self) -> str:
        """What :attr:`lo`..:attr:`hi` is, in words: ``"min–max over 5 rounds"`` or
        ``"inter-quartile range over 9 rounds"``."""
        what = "min–max" if self.n < IQR_FROM else "inter-quartile range"
        return f"{what} over {self.n} round{'s' if self.n != 1 else ''}"

    @property
    def relative_width(self) -> float:
        """``(hi - lo) / |median|`` (inf for a zero median with a non-zero width)."""
        width = self.hi - self.lo
        if self.median == 0:
            return 0.0 if width == 0 else math.inf
        return width / abs(self.median)

    def _paired(self, other: "Spread | float", op: Callable[[float, float], float]) -> "Spread":
        if isinstance(other, Spread):
            if other.n != self.n:
                raise ValueError(f"a paired operation needs the same rounds, got {self.n} and "
                                 f"{other.n}")
            return Spread(tuple(op(a, b) for a, b in zip(self.values, other.values)))
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        return Spread(tuple(op(a, float(other)) for a in self.values))

    def __truediv__(self, other: "Spread | float") -> "Spread":
        """Round by round: ``(A / B).values[k] == A.values[k] / B.values[k]`` (or a constant)."""
        return self._paired(other, lambda a, b: a / b)

    def __rtruediv__(self, other: float) -> "Spread":
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        return Spread(tuple(float(other) / a for a in self.values))

    def __mul__(self, other: "Spread | float") -> "Spread":
        return self._paired(other, lambda a, b: a * b)

    __rmul__ = __mul__

    def __sub__(self, other: "Spread | float") -> "Spread":
        return self._paired(other, lambda a, b: a - b)

    def __add__(self, other: "Spread | float") -> "Spread":
        return self._paired(other, lambda a, b: a + b)

    __radd__ = __add__

    def map(self, fn: Callable[[float], float]) -> "Spread":
        """``fn`` applied to every round's value."""
        return Spread(tuple(fn(v) for v in self.values))

    def __float__(self) -> float:
        return float(self.median)

    def __repr__(self) -> str:
        return (f"Spread(median={self.median:.4g}, {self.lo:.4g}–{self.hi:.4g}, "
                f"{self.kind})")


def spread(values: Iterable[float]) -> Spread:
    """A :class:`Spread` of the given per-round values (see its errors)."""
    return Spread(tuple(values))


def interleaved(work: Mapping[str, Callable[[], float]], rounds: int = 5,
                warmup: int = 1) -> dict[str, Spread]:
    """Measure every variant once per round, all variants in a round before the next round.

    Round ``r`` runs the variants in their given order rotated by ``r`` (A, B, C; B, C, A; ...),
    so none is always first or last. Each callable performs one measurement and returns its
    value (seconds per step, bytes, a rate): time it inside with the course's timers (which mark
    their timed windows for the samplers). ``warmup`` rounds run first and are discarded
    (compilation, allocator growth, the first clock ramp).

    Args:
        work: ``{name: callable}``, at least one, callables of no argument returning a finite
            number.
        rounds: kept rounds (>= 1; 5 gives a min–max range, 8 and more an IQR).
        warmup: discarded rounds before them (>= 0).

    Returns:
        ``{name: Spread}`` in the order of ``work``.

    Raises:
        ValueError: an empty ``work``, ``rounds`` < 1, ``warmup`` < 0, or a callable that
            returns something other than a finite number.
    """
    if not work:
        raise ValueError("work must name at least one variant")
    positive_int("rounds", rounds)
    integer("warmup", warmup, minimum=0)
    names = list(work)
    kept: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            value = work[name]()
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"variant {name!r} returned {value!r}, not a finite number")
            if r >= warmup:
                kept[name].append(float(value))
    return {name: Spread(tuple(kept[name])) for name in names}
