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
spread). :func:`resolution` says whether the measured rounds tell the step from the base step
at all (they cannot when their spread holds the ratio 1). Differences of two times taken round
by round (a time saved, a slope, a step beyond another) go to ``compare(..., unit="s")``, which
states rounds that reach zero in seconds.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from perflab.core.rounds import Spread, spread
from perflab.core.validate import number
from perflab.record.claims import SPREAD_SUFFIX, Verdict, claim, compare, judge
from perflab.record.numbers import fmt, fmt_range
from perflab.record.provenance import glue

__all__ = ["bucket_slopes", "cost_ratio", "efficiency_against_model", "judge_best_cap",
           "judge_bucket_slope", "judge_cost", "judge_cost_range", "judge_exposed", "judge_hidden_share",
           "judge_no_sync", "judge_step_parts", "own_cost_resolution", "resolution",
           "spread_text", "step_ratio", "theil_sen"]


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


def resolution(measured: Spread, what: str, base: str) -> str:
    """Whether the per-round ratio of the step (``what``) to the ``base`` step, ``measured``
    (:func:`step_ratio`), tells the two apart: a sentence. It does when the rounds' spread
    (min-max under 8 rounds, else the inter-quartile range) leaves out 1. Decided from the
    measured rounds, not from where a band around the prediction falls: a predicted cost near
    the band's half-width would otherwise turn the sentence over with a slightly different
    prediction (review of run 439fc20, finding 10).

    Raises:
        ValueError: ``measured`` is not a :class:`~perflab.core.rounds.Spread`.
    """
    if not isinstance(measured, Spread):
        raise ValueError(f"measured must be a Spread of per-round ratios, got {measured!r}")
    ends = f"{measured.lo:.2f}x to {measured.hi:.2f}x"
    if measured.lo <= 1 <= measured.hi:
        return (f"the rounds' ratio of {what}'s step to {base}'s ({ends}) holds 1: this run "
                f"cannot tell {what}'s step from {base}'s")
    return (f"the rounds' ratio of {what}'s step to {base}'s ({ends}) leaves out 1: this run "
            f"tells {what}'s step from {base}'s")


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
                  exposed_s: float, none_hidden_s: float, tolerance: float = 0.5,
                  judged: bool = True) -> Verdict | None:
    """DDP's exposed time judged round by round: what DDP's step took beyond DDP alone (the
    same model on a process group of its rank alone) in each round, against the modelled
    ``exposed_s``, within ``tolerance`` of it, ``bound="host"``.

    Glues ``{key}_waited_text`` (the median of the per-round differences; their spread goes
    into the ``_spread`` note),
    ``{key}_exposed_text``, ``{key}_none_hidden_text`` (``none_hidden_s``: every bucket's
    all-reduce after the backward), ``{key}_exposed_resolution`` (whether the band leaves out
    the time with nothing hidden, i.e. whether these rounds can tell overlap from none) and
    ``{key}_exposed_sentence``; returns the verdict (None, with a sentence, when the model
    exposes nothing: a relative band around 0 has no width). ``judged=False`` (the caller's
    choice, made before the rounds are read: a batch whose modelled exposed time is a small
    part of a step that scatters by many times it) glues the rounds as a measurement, with no
    verdict: a claim that is undecided in every run says nothing (review of run 439fc20,
    finding 14).

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
    glue(f"{key}_waited_text", fmt(waited.median, "s"))   # its spread: the _spread note
    glue(f"{key}_exposed_text", fmt(exposed_s, "s"))
    glue(f"{key}_none_hidden_text", fmt(none_hidden_s, "s"))
    tells = not exposed_s * (1 - tolerance) <= none_hidden_s <= exposed_s * (1 + tolerance)
    glue(f"{key}_exposed_resolution",
         "the band leaves out the exposed time with nothing hidden: the rounds can tell overlap "
         "from none" if tells else "the band holds the exposed time with nothing hidden too: here "
         "the rounds cannot tell overlap from none")
    if exposed_s <= 0 or not judged:
        why = ("the model exposes nothing" if exposed_s <= 0 else
               f"its rounds scatter over {fmt(waited.hi - waited.lo, 's')}, against a band "
               f"{fmt(2 * tolerance * exposed_s, 's')} wide")
        glue(f"{key}_exposed_sentence", f"no comparison: {why}")
        glue(f"{key}_exposed_sentence{SPREAD_SUFFIX}",
             f"not judged ({why}): the rounds ran {fmt_range(waited.lo, waited.hi, 's')} "
             f"({waited.kind})")
        return None
    return compare(f"{key}_exposed_sentence", waited, exposed_s, tolerance, bound="host",
                   unit="s", reason="a difference of two steps, paired by round, on ranks "
                   "that share the host's cores")


def judge_hidden_share(key: str, ddp_rounds: Sequence[float], alone_rounds: Sequence[float],
                       comm_rounds: Sequence[float], exposed_s: float,
                       none_hidden_s: float):
    """Whether DDP's overlap hid its communication, judged on a quantity whose rounds resolve it
    where the exposed time's own band cannot (a modelled 1 ms against rounds that scatter over
    6 ms: issue 39): per round, what DDP's step took beyond DDP alone over what DDP's buckets'
    all-reduces took alone in the same round (``comm_rounds``: issued as DDP issues them, no
    backward), the **share of the communication the step still paid**. The model predicts
    ``exposed_s / none_hidden_s``; with nothing hidden the share is 1. The claim (``bound="host"``)
    is that the share lies nearer the model's than nothing hidden: below their midpoint, ``(1 +
    predicted) / 2``; "undecided" when the rounds' spread reaches across it. Glues
    ``{key}_hidden_share_text`` (the median share), ``{key}_hidden_predicted_text``,
    ``{key}_hidden_sentence`` and its ``_spread``; returns the claim's sentence.

    Raises:
        ValueError: rounds of different lengths, a time that is not positive, or an
            ``exposed_s`` outside ``[0, none_hidden_s]``.
    """
    number("none_hidden_s", none_hidden_s, above=0)
    number("exposed_s", exposed_s, minimum=0, maximum=none_hidden_s)
    if not len(ddp_rounds) == len(alone_rounds) == len(comm_rounds):
        raise ValueError("ddp_rounds, alone_rounds and comm_rounds must hold the same rounds")
    if any(c <= 0 for c in comm_rounds):
        raise ValueError(f"comm_rounds must be positive seconds, got {list(comm_rounds)}")
    share = spread((d - a) / c for d, a, c in zip(ddp_rounds, alone_rounds, comm_rounds))
    predicted = exposed_s / none_hidden_s
    edge = (1 + predicted) / 2
    glue(f"{key}_hidden_share_text", fmt(share.median, "%"))
    glue(f"{key}_hidden_predicted_text", fmt(predicted, "%"))
    rounds = f"{fmt(share.lo, '%')} to {fmt(share.hi, '%')}, {share.kind}"
    glue(f"{key}_hidden_sentence{SPREAD_SUFFIX}",
         f"the share per round {rounds}, against {fmt(predicted, '%')} modelled and 100 % with "
         f"nothing hidden; the claim's edge, halfway, is {fmt(edge, '%')}")
    return claim(f"{key}_hidden_sentence", judge(share, high=edge),
                 f"nearer the model than nothing hidden ({fmt(share.median, '%')})",
                 f"nearer nothing hidden than the model ({fmt(share.median, '%')})",
                 bound="host", if_undecided=f"undecided ({fmt(share.median, '%')}; the rounds "
                 "reach across the halfway mark)")


def judge_no_sync(counts: dict, accum: int, buckets: int, no_sync_rounds: Sequence[float],
                  every_rounds: Sequence[float], predicted_rounds: Sequence[float],
                  tolerance: float = 0.15, reason: str | None = None) -> Verdict | None:
    """Gradient accumulation with ``no_sync`` judged twice: the all-reduces one accumulation
    ran, counted in a trace (``counts``: ``{"sync_every": n, "no_sync": n}``), against
    ``accum x buckets`` and ``buckets`` (exact: ``no_sync_count_sentence``); and the time it
    saved, round by round (every micro-step synced minus ``no_sync``), against the saving
    predicted **in the same round** (``predicted_rounds``, seconds: ``accum - 1`` times what
    DDP added to one micro-step over the plain module's, timed in the same interleaved
    rounds), each round's saving over its own prediction judged against 1 within
    ``tolerance`` (``no_sync_sentence``, ``bound="host"``). A prediction taken from another
    task's rounds carried that task's noise, wider than the band it fed (review of run
    439fc20, finding 2). Glues ``no_sync_saved_text`` and ``no_sync_skipped_text`` (the
    medians of the saving and of its prediction), ``no_sync_ratio`` (the accumulation's time
    with ``no_sync`` over without) and ``no_sync_sentence`` with its ``_spread``. The band is
    fixed by the caller: where the rounds reach across an edge of it, the verdict is
    "undecided". No time verdict (a sentence saying so) when some round predicts no saving.
    Returns the time verdict.

    Raises:
        ValueError: an ``accum`` or ``buckets`` below 1, rounds of different lengths, or see
            :func:`perflab.record.claims.compare`.
    """
    if accum < 1 or buckets < 1:
        raise ValueError(f"accum and buckets must be >= 1, got {accum} and {buckets}")
    if not len(no_sync_rounds) == len(every_rounds) == len(predicted_rounds):
        raise ValueError("no_sync_rounds, every_rounds and predicted_rounds must hold the same "
                         "rounds")
    want = {"sync_every": accum * buckets, "no_sync": buckets}
    claim("no_sync_count_sentence", dict(counts) == want,
          f"the traces count {want['sync_every']} all-reduces when every micro-step syncs and "
          f"{buckets} with no_sync: {accum - 1} of {accum} syncs skipped, as predicted",
          f"the traces count {counts.get('sync_every')} and {counts.get('no_sync')} all-reduces, "
          f"not the predicted {want['sync_every']} and {buckets}", bound="exact")
    glue("no_sync_ratio", step_ratio(no_sync_rounds, every_rounds).median)
    saved = spread(e - n for e, n in zip(every_rounds, no_sync_rounds))
    predicted = spread(predicted_rounds)
    glue("no_sync_saved_text", fmt(saved.median, "s"))   # the prose's; the spread: the note's
    glue("no_sync_skipped_text", fmt(predicted.median, "s"))
    if not min(predicted.values) > 0:
        glue("no_sync_sentence", "no comparison: in some rounds DDP's micro-step was no slower "
             "than the plain one, so no saving was predicted")
        glue("no_sync_sentence" + SPREAD_SUFFIX, "no band: the predictions ran "
             f"{fmt_range(predicted.lo, predicted.hi, 's')} ({predicted.kind})")
        return None
    return compare("no_sync_sentence", saved / predicted, 1.0, tolerance, bound="host",
                   reason=reason)


def efficiency_against_model(key: str, measured: Sequence[float],
                             predicted: Sequence[float]) -> Spread:
    """DDP's scaling efficiency against its prediction, round by round, as a measurement with
    no verdict. Each round's prediction is ``t1 / (t_alone + exposed)`` from the same round's
    steps, and its measurement ``t1 / t_ddp``, so their ratio is ``(t_alone + exposed) /
    t_ddp``: the exposed time's miss, diluted by the step. A band around it tests the steps it
    is made of more than the overlap, and sat on its edge in run 439fc20
    (``runs/2026-12-07d-439fc20.json``, ``ddp_efficiency_sentence``; review finding 1); the
    exposed time is judged alone instead (:func:`judge_exposed`). Glues ``{key}_efficiency``
    (the median), ``{key}_efficiency_text`` (median and spread, :func:`spread_text`: one
    round's efficiency is no result, see ``runs/2026-12-07b-07ca410.json``) and
    ``{key}_efficiency_ratio_text`` (the per-round ratio to the prediction, with its spread);
    returns that ratio.

    Raises:
        ValueError: rounds of different lengths or a prediction that is not positive.
    """
    if len(measured) != len(predicted) or any(p <= 0 for p in predicted):
        raise ValueError(f"measured and predicted must hold the same rounds, predictions "
                         f"positive; got {list(measured)} and {list(predicted)}")
    eff = spread(measured)
    ratio = spread(m / p for m, p in zip(measured, predicted))
    glue(f"{key}_efficiency", eff.median)
    glue(f"{key}_efficiency_text", spread_text(eff, ""))
    glue(f"{key}_efficiency_ratio_text", spread_text(ratio, "x"))
    return ratio


def judge_step_parts(key: str, step_rounds: Sequence[float], products_rounds: Sequence[float],
                     products_predicted_s: float, other_rounds: Sequence[float],
                     rest_predicted_s: float, products_tolerance: float = 0.10,
                     rest_tolerance: float = 0.25) -> tuple[Verdict, Verdict]:
    """One step judged in two parts, so that neither hides in a band as wide as the other: its
    matrix products timed alone, in rounds (``products_rounds``, seconds: a layer's products
    summed per round), against their prediction ``products_predicted_s`` within
    ``products_tolerance`` (``{key}_products_sentence``, ``bound="device"``); and the rest of
    the step **as the profiler measured it**, every kernel and copy that is not a matrix
    product, per profiled step (``other_rounds``, seconds), against the model's
    ``rest_predicted_s`` within ``rest_tolerance`` (``{key}_rest_sentence``,
    ``bound="device"``). The step minus the products timed alone is a difference of two large
    numbers that also holds the products' slowdown inside the step and the gaps between
    kernels (review of run 439fc20, finding 3): it is glued as a measurement only,
    ``{key}_rest_text`` (its median), ``{key}_rest_share`` and ``{key}_rest_share_text`` (the
    median of it over the step, per round).

    Returns:
        ``(products verdict, rest verdict)``.

    Raises:
        ValueError: no rounds, a time that is not positive, or see
            :func:`perflab.record.claims.compare`.
    """
    number("products_predicted_s", products_predicted_s, above=0)
    number("rest_predicted_s", rest_predicted_s, above=0)
    for label, rounds in (("step_rounds", step_rounds), ("products_rounds", products_rounds),
                          ("other_rounds", other_rounds)):
        if not rounds or any(t <= 0 for t in rounds):
            raise ValueError(f"{label} must hold positive seconds, got {list(rounds)}")
    products = spread(products_rounds)
    rest = spread(t - products.median for t in step_rounds)
    share = statistics.median((t - products.median) / t for t in step_rounds)
    glue(f"{key}_rest_text", fmt(rest.median, "s"))
    glue(f"{key}_rest_share", share)
    glue(f"{key}_rest_share_text", fmt(share, "%"))
    return (compare(f"{key}_products_sentence", products, products_predicted_s,
                    products_tolerance, bound="device"),
            compare(f"{key}_rest_sentence", spread(other_rounds), rest_predicted_s,
                    rest_tolerance, bound="device"))


def own_cost_resolution(cost: Spread, expected: float) -> str:
    """Whether rounds of DDP alone over the plain step (``cost``, a per-round ratio) can resolve
    DDP's own cost, ``expected`` (a ratio above 1, from a batch where it was resolved): a
    sentence. They cannot when half the spread's width exceeds ``expected - 1``, whatever the
    median says (the medians of two runs of one source fell on either side of 1:
    ``runs/2026-12-07b-07ca410.json``, review finding 5). The sentence names the half-width it
    compares.

    Raises:
        ValueError: an ``expected`` that is not a positive number.
    """
    number("expected", expected, above=0)
    half = (cost.hi - cost.lo) / 2
    tells = half < abs(expected - 1)
    return (f"that work would add {fmt(expected - 1, '%')} to this step, "
            f"{'more' if tells else 'less'} than half the width of the spread of DDP alone over "
            f"the plain step ({fmt(half, '%')}): these rounds "
            f"{'resolve it' if tells else 'cannot resolve it'}")


def theil_sen(x: Sequence[float], y: Sequence[float]) -> float:
    """The Theil-Sen slope of ``y`` against ``x``: the median of the slopes of every pair of
    points with different ``x``. Over a few points one stray value (a round at four times the
    others') moves a least-squares slope wherever it likes; it moves this one by a pair or two.

    Raises:
        ValueError: lengths that differ, or fewer than two distinct ``x``.
    """
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    pairs = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x))
             if x[j] != x[i]]
    if not pairs:
        raise ValueError(f"a slope needs two distinct x, got {list(x)}")
    return statistics.median(pairs)


def bucket_slopes(rounds_by_cap: dict, buckets_by_cap: dict) -> Spread:
    """Seconds each extra bucket added to the step, one :func:`theil_sen` slope per round: the
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
    return spread(theil_sen(n, steps) for steps in zip(*(rounds_by_cap[c] for c in caps)))


def judge_bucket_slope(name: str, rounds_by_cap: dict, buckets_by_cap: dict,
                       predicted_by_cap: dict, tolerance: float = 0.5) -> Verdict | None:
    """The step's cost of one more bucket (:func:`bucket_slopes`, round by round) against the
    slope of the model's own steps (``predicted_by_cap``, seconds per cap) fitted the same way
    (:func:`theil_sen`), within ``tolerance`` (``bound="host"``): slope against slope. The
    start-up model pays every bucket's alpha *and* the last bucket's transfer, which differs
    from cap to cap, so its slope is not alpha (review of run 439fc20, finding 6).

    A model whose per-bucket term was itself timed in the same rounds (``predicted_by_cap[cap]``
    a list, one modelled step per round) is judged **round by round**: each round's slope minus
    the model's slope in that round, added to the model's median slope, against that median, so
    the term's own scatter is in the judged spread instead of only its median (review g, S4). A
    difference, not a ratio: one round whose timed term is near zero or below would turn a ratio
    over. Glues ``{name}_slope_text``, ``{name}_model_slope_text`` (with its spread when per
    round) and ``name`` (with its ``_spread``); None (a sentence saying so) when the model's
    (median) slope is not positive.

    Raises:
        ValueError: see :func:`bucket_slopes` and :func:`perflab.record.claims.compare`; per-round
            predictions whose rounds differ from the steps'.
    """
    slope = bucket_slopes(rounds_by_cap, buckets_by_cap)
    caps = list(rounds_by_cap)
    counts = [float(buckets_by_cap[c]) for c in caps]
    per_round = all(isinstance(predicted_by_cap[c], (list, tuple)) for c in caps)
    if per_round:
        if {len(predicted_by_cap[c]) for c in caps} != {len(slope.values)}:
            raise ValueError(f"predicted_by_cap must hold one step per round "
                             f"({len(slope.values)}) for every cap")
        models = spread(theil_sen(counts, [float(v) for v in steps])
                        for steps in zip(*(predicted_by_cap[c] for c in caps)))
        model = models.median
        glue(f"{name}_model_slope_text", spread_text(models, "s"))
        positive = model > 0
    else:
        model = theil_sen(counts, [float(predicted_by_cap[c]) for c in caps])
        glue(f"{name}_model_slope_text", fmt(model, "s", signed=model < 0))
        positive = model > 0
    glue(f"{name}_slope_text", spread_text(slope, "s"))
    if not positive:
        glue(name, "no comparison: the model's steps do not grow with the buckets")
        glue(name + SPREAD_SUFFIX, f"not judged: the rounds' slopes ran "
             f"{fmt_range(slope.lo, slope.hi, 's')} ({slope.kind})")
        return None
    reason = ("a slope fitted over a few caps in every round, on ranks whose gloo threads share "
              "the backward's cores")
    if per_round:   # each round's slope, less that round's model's excess over the median
        slope = spread(s - m + model for s, m in zip(slope.values, models.values))
    return compare(name, slope, model, tolerance, bound="host", unit="s", reason=reason)


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
