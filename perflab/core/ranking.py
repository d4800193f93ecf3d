"""Which of several variants measured in the same rounds is ahead, and whether every round agrees.

A median's order alone can be an accident of one round; chapter 2's matmul sizes name a size only
when it led in every round of :func:`perflab.core.rounds.interleaved`.
"""

from __future__ import annotations

from typing import Mapping

from perflab.core.rounds import Spread

__all__ = ["leader", "outranked"]


def leader(spreads: Mapping[object, Spread]) -> tuple[object, bool]:
    """The variant with the highest median, and whether it led in every round.

    "Led in every round" compares round by round (``spreads[a].values[k] >
    spreads[b].values[k]`` for every other ``b`` and every round ``k``), so a drift that moves
    all variants alike does not decide it; a leader whose lead some round reverses is the
    median's leader only, and a verdict that rests on it is undecided. Ties of the median go to
    the first variant in the mapping's order.

    Args:
        spreads: ``{name: Spread}`` of one quantity (larger is better: a rate, an efficiency),
            at least one, all with the same number of rounds (measured in the same rounds,
            e.g. by :func:`interleaved`).

    Returns:
        ``(name, led_in_every_round)``; a single variant leads in every round.

    Raises:
        ValueError: an empty mapping, a value that is not a Spread, or Spreads of different
            numbers of rounds.
    """
    if not spreads:
        raise ValueError("spreads must name at least one variant")
    for name, s in spreads.items():
        if not isinstance(s, Spread):
            raise ValueError(f"spreads[{name!r}] must be a Spread, got {type(s).__name__}")
    counts = {s.n for s in spreads.values()}
    if len(counts) > 1:
        raise ValueError(f"spreads must hold the same number of rounds, got {sorted(counts)}")
    top = max(spreads, key=lambda name: spreads[name].median)
    led = all(a > b for other, s in spreads.items() if other != top
              for a, b in zip(spreads[top].values, s.values))
    return top, led


def outranked(spreads: Mapping[object, Spread], name: object) -> list[object]:
    """The variants that beat ``name`` in every round, best median first.

    The question a page asks of one variant ("did the fastest size also use its cycles best?")
    is settled either way round by round: True when ``name`` led every round
    (:func:`leader`), False when another variant beat it in every round (this list is not
    empty), undecided otherwise. It does not need the others ranked among themselves: two
    sizes that trade places from round to round can both beat ``name`` in every round.

    Args:
        spreads: as for :func:`leader` (larger is better, the same rounds for all).
        name: a key of ``spreads``.

    Returns:
        The names of the variants whose value exceeds ``name``'s in every round, ordered by
        median, highest first (empty when none does).

    Raises:
        ValueError: as :func:`leader`, or ``name`` not among ``spreads``.
    """
    leader(spreads)                               # the same checks of the mapping
    if name not in spreads:
        raise ValueError(f"name {name!r} is not among spreads ({list(spreads)})")
    mine = spreads[name].values
    beat = [other for other, s in spreads.items() if other != name
            and all(a > b for a, b in zip(s.values, mine))]
    return sorted(beat, key=lambda other: -spreads[other].median)
