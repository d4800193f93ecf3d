"""Chapter 8's verdicts on one step against another, judged round by round as a ratio of the two.

Chapter 8 predicts ZeRO-1's and FSDP's steps as DDP's step plus a cost (broadcasts, collectives,
copies) minus the Adam time they save. The cost is a few milliseconds of either sign beside
steps of tens of milliseconds, so it cannot be judged as a difference of two noisy steps in
seconds: a band of seconds around a prediction near zero has no relative meaning (around +4 ms
with a half-width of 3 ms it spans 1 to 7 ms, "a factor of 7", and
:func:`perflab.record.claims.judge` refuses it), and the difference of two steps carries the
noise of both. Here the steps, timed in the same interleaved rounds
(:func:`perflab.core.rounds.interleaved`), are divided **round by round** (a drift of the machine
slows both and cancels), and the per-round ratio is compared with the predicted ratio
``1 + cost / base step`` (the base step's median), with a relative band of the step's time
(:func:`perflab.record.claims.compare`: "undecided" when a band's edge lies inside the rounds'
spread). :func:`resolution` says whether that band can tell the step from the base step at all
(it cannot when it holds the ratio 1).
"""

from __future__ import annotations

import statistics
from typing import Sequence

from perflab.core.rounds import Spread, spread
from perflab.core.validate import number
from perflab.record.claims import SPREAD_SUFFIX, Verdict, claim, compare, judge
from perflab.record.numbers import fmt
from perflab.record.provenance import glue

__all__ = ["cost_ratio", "judge_cost", "judge_cost_range", "judge_exposed", "judge_no_sync", "resolution",
           "step_ratio"]


def step_ratio(steps: Sequence[float], base: Sequence[float]) -> Spread:
    """``steps[k] / base[k]`` for every round ``k``: a :class:`~perflab.core.rounds.Spread`.

    Raises:
        ValueError: the two hold different numbers of rounds, or a value that is not finite or a
            base step that is not positive.
    """
    if any(b <= 0 for b in base):
        raise ValueError(f"base steps must be positive seconds, got {list(base)}")
    return spread(steps) / spread(base)


def cost_ratio(base: Sequence[float], cost_s: float) -> float:
    """The ratio of a step predicted as the base step plus ``cost_s`` seconds (of either sign)
    to the base step: ``1 + cost_s / median(base)``.

    Raises:
        ValueError: an empty or non-positive ``base``, a ``cost_s`` that is not finite, or a
            cost that would make the predicted step last no time at all.
    """
    if not base or any(b <= 0 for b in base):
        raise ValueError(f"base must hold positive step times, got {list(base)}")
    number("cost_s", cost_s)
    ratio = 1 + cost_s / statistics.median(base)
    if ratio <= 0:
        raise ValueError(f"a cost of {cost_s} s leaves no step of the base's "
                         f"{statistics.median(base)} s: the prediction is not a time")
    return ratio


def resolution(predicted: float, tolerance: float, what: str, base: str) -> str:
    """Whether a band of ``tolerance`` around the ``predicted`` ratio can tell the step
    (``what``) from the ``base`` step: a sentence naming the band.

    Raises:
        ValueError: a ``predicted`` ratio that is not positive or a tolerance outside (0, 1).
    """
    number("predicted", predicted, above=0)
    number("tolerance", tolerance, above=0, below=1)
    lo, hi = predicted * (1 - tolerance), predicted * (1 + tolerance)
    band = f"{lo:.2f}x to {hi:.2f}x {base}'s step"
    if lo <= 1 <= hi:
        return (f"the band ({band}) holds {base}'s own step: this run cannot tell {what}'s cost "
                "from none, only a miss of the prediction")
    return f"the band ({band}) leaves out {base}'s own step: this run can tell {what} from {base}"


def judge_cost(name: str, steps: Sequence[float], base: Sequence[float], cost_s: float,
               tolerance: float, *, bound: str, reason: str | None = None) -> Verdict:
    """Glue, under ``name``, how the per-round ratio of ``steps`` to ``base`` (seconds, same
    interleaved rounds) compares with :func:`cost_ratio` of ``cost_s``, within ``tolerance``
    of the predicted step (:func:`perflab.record.claims.compare`); return the verdict.

    Raises:
        ValueError: see :func:`step_ratio`, :func:`cost_ratio` and ``compare`` (a bad name,
            bound or tolerance, a band wider than a factor of two without ``reason``).
    """
    return compare(name, step_ratio(steps, base), cost_ratio(base, cost_s), tolerance,
                   bound=bound, reason=reason)


def judge_cost_range(name: str, steps: Sequence[float], base: Sequence[float], low_s: float,
                     high_s: float, *, bound: str, reason: str | None = None) -> bool | None:
    """Glue, under ``name``, whether the per-round ratio of ``steps`` to ``base`` lies between
    the ratios of a cost of ``low_s`` and of ``high_s`` seconds (:func:`cost_ratio`): a range
    prediction ("between every collective hidden and none hidden"). True when the rounds' spread
    (:class:`perflab.core.rounds.Spread`: min-max under 8 rounds, else the inter-quartile
    range) lies inside, False when it lies outside, None (undecided) when an edge lies inside it.
    Like :func:`perflab.record.claims.compare`, the sentence is a short phrase for the prose
    ("inside the predicted range (1.04x)"), and the range and the rounds are glued under
    ``name + "_spread"`` for the page's ``{measured}`` note.

    Raises:
        ValueError: ``low_s > high_s``, see :func:`cost_ratio`, or a range wider than a factor of
            two without ``reason`` (:func:`perflab.record.claims.judge`).
    """
    if low_s > high_s:
        raise ValueError(f"low_s must be <= high_s, got {low_s} > {high_s}")
    ratio = step_ratio(steps, base)
    lo, hi = cost_ratio(base, low_s), cost_ratio(base, high_s)
    holds = judge(ratio, lo, hi, reason=reason)
    rounds = f"{ratio.lo:.2f}x to {ratio.hi:.2f}x, {ratio.kind}"
    span = (f"{lo:.2f}x to {hi:.2f}x the base step ({fmt(low_s, 's', signed=True)} to "
            f"{fmt(high_s, 's', signed=True)})")
    # the prose takes the short phrase; the range and the rounds go to its {measured} note
    claim(name, holds, f"inside the predicted range ({ratio.median:.2f}x)",
          f"outside the predicted range ({ratio.median:.2f}x)", bound=bound,
          if_undecided=f"undecided ({ratio.median:.2f}x; the rounds reach across an edge of "
          "the predicted range)")
    glue(name + SPREAD_SUFFIX, f"the rounds {rounds}, against the predicted range, {span}")
    return holds


def judge_exposed(key: str, ddp_rounds: Sequence[float], alone_rounds: Sequence[float],
                  exposed_s: float, none_hidden_s: float, tolerance: float = 0.5) -> Verdict | None:
    """DDP's exposed time judged round by round: what DDP's step took beyond DDP alone (the
    same model on a process group of its rank alone) in each round, against the modelled
    ``exposed_s``, within ``tolerance`` of it, ``bound="host"``.

    Glues ``{key}_waited_text`` (median and spread of the per-round differences),
    ``{key}_exposed_text``, ``{key}_none_hidden_text`` (``none_hidden_s``: every bucket's
    all-reduce after the backward), ``{key}_exposed_resolution`` (whether the band leaves out
    the time with nothing hidden, i.e. whether these rounds can tell overlap from none) and
    ``{key}_exposed_sentence``; returns the verdict (None, with a sentence, when the model
    exposes nothing: a relative band around 0 has no width).

    Raises:
        ValueError: rounds of different lengths or not finite, a negative time, a tolerance
            outside (0, 1).
    """
    number("tolerance", tolerance, above=0, below=1)
    number("exposed_s", exposed_s, minimum=0)
    number("none_hidden_s", none_hidden_s, minimum=0)
    if len(ddp_rounds) != len(alone_rounds):
        raise ValueError(f"ddp_rounds and alone_rounds must hold the same rounds, got "
                         f"{len(ddp_rounds)} and {len(alone_rounds)}")
    waited = spread(d - a for d, a in zip(ddp_rounds, alone_rounds))
    glue(f"{key}_waited_text", f"{fmt(waited.median, 's')} ({fmt(waited.lo, 's')} to "
                               f"{fmt(waited.hi, 's')}, {waited.kind})")
    glue(f"{key}_exposed_text", fmt(exposed_s, "s"))
    glue(f"{key}_none_hidden_text", fmt(none_hidden_s, "s"))
    tells = not exposed_s * (1 - tolerance) <= none_hidden_s <= exposed_s * (1 + tolerance)
    glue(f"{key}_exposed_resolution",
         "the band leaves out the exposed time with nothing hidden: the rounds can tell overlap "
         "from none" if tells else "the band holds the exposed time with nothing hidden too: here "
         "the rounds cannot tell overlap from none")
    if exposed_s <= 0:
        glue(f"{key}_exposed_sentence", "no comparison: the model exposes nothing")
        glue(f"{key}_exposed_sentence{SPREAD_SUFFIX}", "no band: the model exposes nothing")
        return None
    return compare(f"{key}_exposed_sentence", waited, exposed_s, tolerance, bound="host",
                   reason="a difference of two steps, paired by round, on ranks that share the "
                          "host's cores")


def judge_no_sync(counts: dict, accum: int, buckets: int, no_sync_rounds: Sequence[float],
                  every_rounds: Sequence[float], skipped_s: float,
                  tolerance: float = 0.15) -> Verdict | None:
    """Gradient accumulation with ``no_sync`` judged twice: the all-reduces one accumulation
    ran, counted in a trace (``counts``: ``{"sync_every": n, "no_sync": n}``), against
    ``accum x buckets`` and ``buckets`` (exact: ``no_sync_count_sentence``); and the per-round
    ratio of the two accumulations' times against ``1 - skipped_s / step``
    (:func:`judge_cost`, ``no_sync_sentence``, ``bound="host"``), with ``no_sync_ratio`` and
    ``no_sync_predicted_text`` glued. No time verdict (a sentence saying so) when the model
    predicts no saving or one of 90 % of the step or more. Returns the time verdict.

    Raises:
        ValueError: an ``accum`` or ``buckets`` below 1, or see :func:`judge_cost`.
    """
    if accum < 1 or buckets < 1:
        raise ValueError(f"accum and buckets must be >= 1, got {accum} and {buckets}")
    want = {"sync_every": accum * buckets, "no_sync": buckets}
    claim("no_sync_count_sentence", dict(counts) == want,
          f"the traces count {want['sync_every']} all-reduces when every micro-step syncs and "
          f"{buckets} with no_sync: {accum - 1} of {accum} syncs skipped, as predicted",
          f"the traces count {counts.get('sync_every')} and {counts.get('no_sync')} all-reduces, "
          f"not the predicted {want['sync_every']} and {buckets}", bound="exact")
    glue("no_sync_ratio", step_ratio(no_sync_rounds, every_rounds).median)
    if not 0 < skipped_s < 0.9 * statistics.median(every_rounds):
        glue("no_sync_predicted_text", "no ratio")
        glue("no_sync_sentence", "no comparison: the model predicts no saving, or one as long as "
                                 "the step")
        glue("no_sync_sentence" + SPREAD_SUFFIX, "no band: the model predicts no saving, or one "
                                                 "as long as the step")
        return None
    glue("no_sync_predicted_text", f"{cost_ratio(every_rounds, -skipped_s):.3f}×")
    return judge_cost("no_sync_sentence", no_sync_rounds, every_rounds, -skipped_s, tolerance,
                      bound="host")
