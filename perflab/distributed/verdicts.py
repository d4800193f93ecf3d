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

from perflab.core.fits import fit_line
from perflab.core.rounds import Spread, spread
from perflab.core.validate import number
from perflab.record.claims import SPREAD_SUFFIX, Verdict, claim, compare, judge
from perflab.record.numbers import fmt, fmt_range
from perflab.record.provenance import glue

__all__ = ["bucket_slopes", "compare_difference", "cost_ratio", "judge_best_cap",
           "judge_bucket_slope", "judge_cost", "judge_cost_range", "judge_efficiency",
           "judge_exposed", "judge_no_sync", "judge_step_parts", "own_cost_resolution",
           "resolution", "spread_text", "step_ratio"]


def spread_text(value: Spread, unit: str) -> str:
    """``"median (lo to hi, kind)"`` of a :class:`~perflab.core.rounds.Spread`, every number
    written by :func:`perflab.record.numbers.fmt` in ``unit`` (``"x"`` for a ratio)."""
    return f"{fmt(value.median, unit)} ({fmt(value.lo, unit)} to {fmt(value.hi, unit)}, {value.kind})"


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


def compare_difference(name: str, difference: Spread, predicted_s: float, tolerance: float,
                       *, bound: str, reason: str | None = None) -> Verdict:
    """:func:`perflab.record.claims.compare` for a difference of two times taken round by round
    (a step beyond another, a time saved, a slope): the same band, verdict, record and prose
    phrase, but when some rounds are at or below zero the ``name + "_spread"`` note states them
    in seconds and the verdict in words, since a spread of ratios that crosses zero ("-5.3x to
    6.60x the prediction") cannot be read. A median at or below zero is "outside" ("none of the
    positive amount predicted"), as in ``compare``.

    Raises:
        ValueError: see :func:`perflab.record.claims.compare` (a bad name or bound, a
            prediction that is not positive, a tolerance outside (0, 1), a band wider than a
            factor of two without ``reason``).
    """
    if difference.lo > 0:
        return compare(name, difference, predicted_s, tolerance, bound=bound, reason=reason)
    number("predicted_s", predicted_s, above=0)
    number("tolerance", tolerance, above=0, below=1)
    lo, hi = predicted_s * (1 - tolerance), predicted_s * (1 + tolerance)
    holds = judge(difference, lo, hi, reason=reason)     # never True: the rounds reach 0
    ratio = difference.median / predicted_s
    band = f"{fmt(tolerance, '%')}"
    word = {True: "within", False: "outside", None: "undecided"}[holds]
    phrase = ("none of the positive amount predicted" if difference.median <= 0 else
              {True: f"as predicted ({fmt(ratio, 'x')})",
               False: f"outside the {band} band ({fmt(ratio, 'x')})",
               None: f"undecided ({fmt(ratio, 'x')}; the spread crosses the band's edge)"}[holds])
    detail = (f"the rounds ran {fmt_range(difference.lo, difference.hi, 's')} "
              f"({difference.kind}), at or below zero in some, so no ratio to the prediction is "
              f"read from them; against the band of {fmt_range(lo, hi, 's')} (±{band}) around "
              f"the predicted {fmt(predicted_s, 's')}, "
              + {True: "within the band", False: "outside the band",
                 None: "undecided: the rounds reach across the band's edge"}[holds])
    claim(name, holds, phrase, phrase, bound=bound, if_undecided=phrase,
          record={"measured": difference.median, "lo": difference.lo, "hi": difference.hi,
                  "predicted": predicted_s, "tolerance": tolerance, "rounds": difference.n,
                  "verdict_word": word})
    glue(name + SPREAD_SUFFIX, detail)
    out = Verdict(word)
    out.phrase, out.detail, out.ratio = phrase, detail, ratio
    return out


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
    glue(f"{key}_waited_text", spread_text(waited, "s"))
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
    return compare_difference(f"{key}_exposed_sentence", waited, exposed_s, tolerance,
                              bound="host", reason="a difference of two steps, paired by "
                              "round, on ranks that share the host's cores")


def judge_no_sync(counts: dict, accum: int, buckets: int, no_sync_rounds: Sequence[float],
                  every_rounds: Sequence[float], skipped_s: float,
                  tolerance: float = 0.15, reason: str | None = None) -> Verdict | None:
    """Gradient accumulation with ``no_sync`` judged twice: the all-reduces one accumulation
    ran, counted in a trace (``counts``: ``{"sync_every": n, "no_sync": n}``), against
    ``accum x buckets`` and ``buckets`` (exact: ``no_sync_count_sentence``); and the time it
    saved, round by round (every micro-step synced minus ``no_sync``, the same interleaved
    rounds), against ``skipped_s``, the predicted cost of the skipped syncs, within
    ``tolerance`` of it (``no_sync_sentence``, ``bound="host"``). The saving is judged, not the
    remainder of the step: the remainder's ratio moved with the step's other work (review of
    run 07ca410, finding 8). Glues ``no_sync_saved_text`` (the median of the rounds; their spread goes into
    ``no_sync_sentence_spread``) and
    ``no_sync_ratio`` (the accumulation's time with ``no_sync`` over without); ``reason`` is
    passed to ``compare`` (a band wider than a factor of two needs one). The band is fixed by
    the caller, not widened with the prediction's own noise (a band that grows with the noise
    could hardly fail): where the rounds of the time saved reach across an edge of it, the
    verdict is "undecided", which says so. No time verdict (a sentence saying so) when the
    model predicts no saving. Returns the time verdict.

    Raises:
        ValueError: an ``accum`` or ``buckets`` below 1, rounds of different lengths, or see
            :func:`perflab.record.claims.compare`.
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
    saved = spread(e - n for e, n in zip(every_rounds, no_sync_rounds))
    glue("no_sync_saved_text", fmt(saved.median, "s"))   # the prose's; the spread: the note's
    if not skipped_s > 0:
        glue("no_sync_sentence", "no comparison: the model predicts no saving")
        glue("no_sync_sentence" + SPREAD_SUFFIX, "no band: the model predicts no saving")
        return None
    return compare_difference("no_sync_sentence", saved, skipped_s, tolerance, bound="host",
                              reason=reason)

def judge_efficiency(key: str, measured: Sequence[float], predicted: Sequence[float],
                     tolerance: float = 0.15, *, nothing_exposed: Sequence[float],
                     none_hidden: Sequence[float]) -> Verdict:
    """DDP's scaling efficiency judged round by round: each round's measured efficiency over
    the one predicted from the same round's steps, against 1 within ``tolerance``
    (``bound="host"``). Glues ``{key}_efficiency`` (the median), ``{key}_efficiency_text`` (the
    median and spread, :func:`spread_text`: a single round's efficiency, as high as 1.55 in run 07ca410, is not a
    result) and ``{key}_efficiency_sentence`` with its ``_spread``.

    The prediction's one modelled term, the exposed communication, may be a few per cent of the
    step, and then the band holds the efficiencies the model would predict without it too:
    ``nothing_exposed`` (per round, ``t1 / t_alone``) and ``none_hidden`` (per round, every
    bucket's all-reduce after the backward). ``{key}_efficiency_resolution`` says, from the
    medians of their per-round ratios to ``predicted``, whether the band leaves each out, i.e.
    whether this verdict can tell the model from them (as :func:`judge_exposed`'s resolution
    does for the exposed time alone).

    Raises:
        ValueError: rounds of different lengths, a prediction that is not positive, or see
            :func:`perflab.record.claims.compare`.
    """
    rounds = (measured, predicted, nothing_exposed, none_hidden)
    if len({len(r) for r in rounds}) != 1 or any(p <= 0 for p in predicted):
        raise ValueError(f"measured, predicted, nothing_exposed and none_hidden must hold the "
                         f"same rounds, predictions positive; got {[list(r) for r in rounds]}")
    number("tolerance", tolerance, above=0, below=1)
    eff = spread(measured)
    glue(f"{key}_efficiency", eff.median)
    glue(f"{key}_efficiency_text", spread_text(eff, ""))
    glue(f"{key}_efficiency_resolution",
         _efficiency_resolution(predicted, tolerance, nothing_exposed, none_hidden))
    return compare(f"{key}_efficiency_sentence", spread(m / p for m, p in zip(measured, predicted)),
                   1.0, tolerance, bound="host")


def _efficiency_resolution(predicted: Sequence[float], tolerance: float,
                          nothing_exposed: Sequence[float], none_hidden: Sequence[float]) -> str:
    """Whether a band of ``tolerance`` around each round's ``predicted`` efficiency leaves out
    the efficiencies predicted with nothing exposed and with nothing hidden (the same rounds):
    a sentence. Each alternative is placed by the median of its per-round ratio to
    ``predicted``; one inside ``1 ± tolerance`` cannot be told from the model by the band.

    Raises:
        ValueError: rounds of different lengths or predictions that are not positive.
    """
    if len({len(predicted), len(nothing_exposed), len(none_hidden)}) != 1 or any(
            p <= 0 for p in predicted):
        raise ValueError("predicted, nothing_exposed and none_hidden must hold the same rounds, "
                         "predictions positive")
    parts, told = [], []
    for what, alt in (("nothing exposed", nothing_exposed), ("nothing hidden", none_hidden)):
        ratio = statistics.median(a / p for a, p in zip(alt, predicted))
        out = not 1 - tolerance <= ratio <= 1 + tolerance
        told.append(out)
        parts.append(f"{'leaves out' if out else 'holds'} the efficiency predicted with {what} "
                     f"({fmt(statistics.median(alt))}, {fmt(ratio, 'x')} the prediction)")
    band = f"the band of ±{fmt(tolerance, '%')}"
    if all(told):
        verdict = "this verdict can tell the model from both"
    elif told[1]:
        verdict = "this verdict can tell the model from nothing hidden, not from nothing exposed"
    elif told[0]:
        verdict = "this verdict can tell the model from nothing exposed, not from nothing hidden"
    else:
        verdict = ("this verdict cannot tell the model from either; it tests the steps the "
                   "prediction is made of, not the exposed time")
    return f"{band} {parts[0]} and {parts[1]}: {verdict}"


def judge_step_parts(key: str, step_rounds: Sequence[float], products_s: float,
                     products_predicted_s: float, rest_predicted_s: float,
                     products_tolerance: float = 0.10,
                     rest_tolerance: float = 0.5) -> tuple[Verdict, Verdict]:
    """One step judged in two parts, so that neither hides in a band as wide as the other: its
    matrix products, timed alone (``products_s``, seconds), against their prediction
    ``products_predicted_s`` within ``products_tolerance`` (``{key}_products_sentence``,
    ``bound="device"``); and the rest of the step, measured round by round as each round's
    step (``step_rounds``, seconds) minus the products timed alone, against the model's
    ``rest_predicted_s`` within ``rest_tolerance`` (``{key}_rest_sentence``,
    ``bound="device"``). Glues ``{key}_rest_text`` (the rest's median), ``{key}_rest_share``
    and ``{key}_rest_share_text`` (the median of the rest over the step, per round: the share
    of the step the products' verdict does not cover, as measured).

    Returns:
        ``(products verdict, rest verdict)``.

    Raises:
        ValueError: no rounds, a time that is not positive, or see
            :func:`perflab.record.claims.compare`.
    """
    number("products_s", products_s, above=0)
    number("products_predicted_s", products_predicted_s, above=0)
    number("rest_predicted_s", rest_predicted_s, above=0)
    if not step_rounds or any(t <= 0 for t in step_rounds):
        raise ValueError(f"step_rounds must hold positive seconds, got {list(step_rounds)}")
    rest = spread(t - products_s for t in step_rounds)
    share = statistics.median((t - products_s) / t for t in step_rounds)
    glue(f"{key}_rest_text", fmt(rest.median, "s"))
    glue(f"{key}_rest_share", share)
    glue(f"{key}_rest_share_text", fmt(share, "%"))
    products = compare(f"{key}_products_sentence", products_s, products_predicted_s,
                       products_tolerance, bound="device")
    return products, compare_difference(
        f"{key}_rest_sentence", rest, rest_predicted_s, rest_tolerance, bound="device",
        reason="a difference of the step and its products timed apart, against passes "
               "modelled at the copy rate")


def own_cost_resolution(cost: Spread, expected: float) -> str:
    """Whether rounds of DDP alone over the plain step (``cost``, a per-round ratio) can resolve
    DDP's own cost, ``expected`` (a ratio above 1, from a batch where it was resolved): a
    sentence. They cannot when half the spread's width exceeds ``expected - 1``, whatever the
    median says (review of run 07ca410, finding 5: 0.875x, then 1.059x, was noise).

    Raises:
        ValueError: an ``expected`` that is not a positive number.
    """
    number("expected", expected, above=0)
    width = (cost.hi - cost.lo) / 2
    if width >= abs(expected - 1):
        return (f"that work would add {fmt(expected - 1, '%')} to this step, less than half the "
                f"width of the spread of DDP alone over the plain step, {fmt(2 * width, '%')} of "
                "it: these rounds cannot resolve it")
    return (f"that work would add {fmt(expected - 1, '%')} to this step, more than half the width "
            f"of the spread of DDP alone over the plain step, {fmt(2 * width, '%')} of it: these "
            "rounds resolve it")


def bucket_slopes(rounds_by_cap: dict, buckets_by_cap: dict) -> Spread:
    """Seconds each extra bucket added to the step, one least-squares slope per round: the
    step of every cap (``rounds_by_cap[cap]``, seconds per round, the same rounds) against its
    number of buckets (``buckets_by_cap[cap]``).

    Raises:
        ValueError: fewer than two distinct bucket counts, or caps with different rounds.
    """
    caps = list(rounds_by_cap)
    n = [float(buckets_by_cap[c]) for c in caps]
    if len(set(n)) < 2:
        raise ValueError(f"a slope needs two bucket counts or more, got {n}")
    if len({len(rounds_by_cap[c]) for c in caps}) != 1:
        raise ValueError("every cap must hold the same rounds")
    return spread(fit_line(n, steps).slope
                  for steps in zip(*(rounds_by_cap[c] for c in caps)))


def judge_bucket_slope(name: str, rounds_by_cap: dict, buckets_by_cap: dict,
                       per_bucket_s: float, tolerance: float = 0.5) -> Verdict:
    """The step's cost of one more bucket (:func:`bucket_slopes`, round by round) against the
    model's ``per_bucket_s`` (a start-up alpha per bucket, paid in the step), within
    ``tolerance`` (``bound="host"``). Glues ``{name}_slope_text`` and ``name`` (with its
    ``_spread``): the whole sweep judged, not only its best cap (review of run 07ca410,
    finding 7: the steps differed by ten times what the models told the caps apart by).

    Raises:
        ValueError: see :func:`bucket_slopes` and :func:`perflab.record.claims.compare`.
    """
    number("per_bucket_s", per_bucket_s, above=0)
    slope = bucket_slopes(rounds_by_cap, buckets_by_cap)
    glue(f"{name}_slope_text", spread_text(slope, "s"))
    return compare_difference(name, slope, per_bucket_s, tolerance, bound="host",
                              reason="a slope fitted over a few caps in every round, on "
                              "ranks whose gloo threads share the backward's cores")


def judge_best_cap(name: str, rounds_by_cap: dict, predicted_by_cap: dict, within_s: float,
                   margin: float = 0.05):
    """The overlap model's verdict on a bucket sweep: the caps the model cannot tell from its
    best (predicted exposed time within ``within_s`` seconds of the least) are all predicted;
    per round, the fastest of them over the fastest step of any cap, judged against
    ``1 + margin`` (``bound="host"``). Glues ``name`` and ``{name}_tied_text``; returns the
    claim's sentence.

    Raises:
        ValueError: caps with different rounds, or a negative ``within_s``.
    """
    number("within_s", within_s, minimum=0)
    caps = list(rounds_by_cap)
    if len({len(rounds_by_cap[c]) for c in caps}) != 1:
        raise ValueError("every cap must hold the same rounds")
    best = min(predicted_by_cap[c] for c in caps)
    tied = [c for c in caps if predicted_by_cap[c] - best <= within_s]
    glue(f"{name}_tied_text", ", ".join(fmt(float(c), sig=4) for c in tied))
    fastest = [min(r) for r in zip(*(rounds_by_cap[c] for c in caps))]
    r = spread(min(t) / f for t, f in zip(zip(*(rounds_by_cap[c] for c in tied)), fastest))
    rounds = f"{r.lo:.2f}x to {r.hi:.2f}x, {r.kind}"
    glue(name + SPREAD_SUFFIX, f"the predicted caps' fastest step over each round's fastest "
                               f"step: {rounds}, against at most {1 + margin:.2f}x")
    return claim(name, judge(r, high=1 + margin),
                 f"the predicted caps ran within {fmt(margin, '%')} of each round's fastest cap "
                 f"({rounds})",
                 f"the predicted caps ran more than {fmt(margin, '%')} slower than each round's "
                 f"fastest cap ({rounds})", bound="host",
                 if_undecided=f"undecided: the predicted caps ran {rounds} each round's fastest "
                 f"step, across the {fmt(margin, '%')} that counts as good as the fastest")
