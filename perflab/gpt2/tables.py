"""Chapter 10's tables (bookkeeping: the page shows the table, not its assembly).

:func:`ladder_table` (the speed ladder: tokens/s, MFU, ratios, peak memory, compilation, clock),
:func:`saving_table` (each predicted rung's saving, split into kernels and gaps) and
:func:`memory_table` (the memory ladder), as Markdown; :func:`previous` names the rung before.
"""

from __future__ import annotations

from typing import Sequence

from perflab.core.rounds import Spread
from perflab.gpt2.breakdown import timeline_spread
from perflab.memory.snapshots import allocation_timeline, name_allocation, peak_blocks
from perflab.record.claims import judge
from perflab.record.numbers import fmt, fmt_range

__all__ = ["previous", "ladder_table", "saving_table", "noise_half_width", "saving_verdict",
           "saving_text", "measurable", "memory_table", "step_peak", "peak_sentence"]


def _md(header: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> str:
    """A Markdown table: the first ``right`` columns left-aligned, the others right-aligned."""
    align = ["---" if i < right else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def previous(names: Sequence[str], name: str) -> str:
    """The rung before ``name`` in ``names``.

    Raises:
        ValueError: ``name`` is the first or not in ``names``.
    """
    i = list(names).index(name)
    if i == 0:
        raise ValueError(f"{name!r} is the first rung: it has no previous one")
    return list(names)[i - 1]


def ladder_table(results: dict, peak_sheet: float | None, peak_meas: float,
                 own: dict) -> str:
    """Chapter 10's speed-ladder table (Markdown): tokens/s, MFU against the datasheet's bf16
    peak (else the measured bf16 ceiling), MFU against the ceiling of the rung's own matmul
    format (``own``: ``{precision: FLOP/s}``), ratios to the previous rung and the baseline,
    peak memory and the median SM clock over its maximum (seven columns: the page's width)."""
    names = list(results)
    first = results[names[0]]
    rows, prev = [], None
    for name in names:
        r = results[name]
        mine = own.get(r.rung["precision"]) or peak_meas
        rows.append([
            name, fmt(r.tokens_per_s, "tokens/s").replace(" tokens/s", ""),
            fmt(r.mfu(peak_sheet or peak_meas), "%"), fmt(r.mfu(mine), "%", sig=2),
            fmt(r.tokens_per_s / (prev or r.tokens_per_s), "x"),
            fmt(r.tokens_per_s / first.tokens_per_s, "x"),
            "-" if r.peak_bytes is None else fmt(r.peak_bytes, "iB"),
            "-" if r.clock_fraction is None else f"{r.clock_fraction:.2f}"])
        prev = r.tokens_per_s
    return _md(["rung", "tokens/s", "MFU", "of own ceiling (unscaled)", "vs previous", "vs baseline",
                "peak memory", "SM clock / max"], rows)


def _direction(fell: float, amount: str) -> str:
    """``"a fall of 200 µs"`` or ``"a rise of 300 µs"``: a change in words whose number is
    never signed against its word (the reader's review: "fell by +200 µs")."""
    return f"a {'fall' if fell >= 0 else 'rise'} of {amount}"


def _change(what: str, fell: float, noise: float) -> str:
    """``what`` fell or rose by ``|fell|`` seconds, or was unchanged within ``noise``.

    One sign convention throughout (the table's "fell in" columns too): ``fell`` > 0 is a
    fall; the sentence says the direction in words and the amount unsigned.
    """
    if abs(fell) <= noise:
        return (f"{what} was unchanged within the noise ({_direction(fell, fmt(abs(fell), 's'))}, "
                f"inside the saving's ±{fmt(noise, 's')})")
    return f"{what} {'fell' if fell > 0 else 'rose'} by {fmt(abs(fell), 's')}"


def _change_spread(what: str, fell: Spread) -> str:
    """``what`` fell or rose by its median over the profiled rounds, with their spread in the
    same sense as the word ("rose by 98 µs (19 µs to 215 µs, ...)"), or was unchanged within
    the noise when the rounds' spread reaches zero (same sign convention as :func:`_change`)."""
    kind = fell.kind.replace("round", "profiled pair")
    if fell.lo <= 0 <= fell.hi:
        return (f"{what} was unchanged within the noise ({_direction(fell.median, fmt(abs(fell.median), 's'))}"
                f" at the median; its profiled steps from {_direction(fell.lo, fmt(abs(fell.lo), 's'))}"
                f" to {_direction(fell.hi, fmt(abs(fell.hi), 's'))}, {kind})")
    lo, hi = sorted((abs(fell.lo), abs(fell.hi)))
    spread = fmt_range(lo, hi, "s")
    return (f"{what} {'fell' if fell.median > 0 else 'rose'} by "
            f"{fmt(abs(fell.median), 's')} ({spread}, {kind})")


def noise_half_width(saved: Spread) -> float:
    """Half the width of the spread that grades a saving, ``(saved.hi - saved.lo) / 2`` (the
    inter-quartile range from :data:`perflab.core.rounds.IQR_FROM` rounds, else min to max):
    the yardstick under which a change of kernel or idle time is "unchanged within the
    noise". It is the same statistic as the saving's verdict uses, so a change the size of a
    saving graded as real is never called noise (the 6 Dec review found ±4.35 ms, half the
    whole range of 8 rounds, beside a saving graded on an IQR of ±1.19 ms).

    Raises:
        TypeError: ``saved`` is not a :class:`Spread`.
    """
    if not isinstance(saved, Spread):
        raise TypeError(f"saved must be a Spread, got {type(saved).__name__}")
    return (saved.hi - saved.lo) / 2


def measurable(saved: Spread) -> bool | None:
    """Did the rounds measure a saving? True when the whole spread (its inter-quartile range
    from 8 rounds, else min to max) lies above zero, False when it lies below (the change cost
    time), None when it reaches zero: no measurable change.

    It is :func:`perflab.record.claims.judge` ``(saved, low=0)`` but for one edge: ``judge``'s
    band is closed, so a spread whose lower end is exactly zero lies inside ``[0, inf)`` and
    would be True, while a saving whose rounds reach zero is no measurable change (None).

    Raises:
        TypeError: ``saved`` is not a :class:`Spread`.
    """
    if not isinstance(saved, Spread):
        raise TypeError(f"saved must be a Spread, got {type(saved).__name__}")
    return None if saved.lo == 0 else judge(saved, low=0.0)


def saving_text(saved: Spread, short: bool = False) -> str:
    """A measured saving per step (seconds, a :class:`Spread`) in words, by the sign of its
    whole spread (:func:`measurable`), never a negative number called a saving (run f96650c
    printed "it saved -449 µs a step"): ``"saved 2.73 ms a step (1.99 ms–2.96 ms)"``, ``"cost
    1.2 ms a step (…)"`` when the whole spread lies below zero, ``"no measurable change (a
    median of -449 µs; its rounds from -2.67 ms to +1.08 ms)"`` when it reaches zero. Ranges
    are :func:`perflab.record.numbers.fmt_range`'s. ``short``: a table's cell, the amount
    alone (``"2.73 ms"``, ``"a loss of 1.2 ms"``, ``"no measurable change"``).

    Raises:
        TypeError: ``saved`` is not a :class:`Spread`.
    """
    kept = measurable(saved)
    span = fmt_range(saved.lo, saved.hi, "s")
    if kept is None:
        return ("no measurable change" if short else
                f"no measurable change (a median of {fmt(saved.median, 's', signed=True)}; "
                f"its rounds from {span})")
    if kept is False:
        lost = fmt_range(-saved.hi, -saved.lo, "s")
        return (f"a loss of {fmt(-saved.median, 's')}" if short else
                f"cost {fmt(-saved.median, 's')} a step ({lost})")
    return fmt(saved.median, "s") if short else f"saved {fmt(saved.median, 's')} a step ({span})"


def saving_table(results: dict, predicted: dict, paired: dict | None = None) -> tuple[str, dict]:
    """Each predicted rung's saving against its prediction, with its spread, and where it came
    from in the profiled steps.

    For every ``name`` in ``predicted`` (seconds saved per step, predicted from the profile of
    the rung before), the measured saving is ``paired[name]["saved"]`` where ``paired`` is
    given (:func:`perflab.gpt2.train.train_pairs`: the two rungs side by side in interleaved
    rounds, the saving round by round), else the previous rung's seconds per step minus this
    one's, window by window (both trained with the same ``windows``: a :class:`Spread` over
    them). Where it came from is read from the two rungs' profiled steps alone (their
    :class:`perflab.gpt2.breakdown.Timeline`): the change of the profiled step's window splits
    exactly into the change of the kernels' busy time and the change of the idle time between
    them, each a fall (positive: time saved, the same sign as the saving). A change no larger
    than half the spread that grades the saving (:func:`noise_half_width`: the same statistic,
    the inter-quartile range from 8 rounds) is stated as unchanged within the noise, never as
    a fall or a rise. Returns the Markdown table and ``{key: (name, saved
    Spread, cause)}``, ``key`` the first word of the name, lower case (``"fused"``,
    ``"fp8"``...; ``"bf16 residual"`` is ``"residual"``, ``"one graph per step"`` ``"step"``,
    ``"CUDA graphs"`` ``"graphs"``). The verdict against the prediction is the page's.

    Where ``paired[name]`` holds ``"profiles"`` (``train_pairs(..., profiles=k)``: the two
    rungs' steps profiled side by side in ``k`` interleaved rounds), the split is read from
    them instead, round by round (:func:`perflab.gpt2.breakdown.timeline_spread`): each fall
    is the median over the rounds, and a fall whose rounds' spread reaches zero is unchanged
    within the noise; the ladder's ``results`` then need no timeline.

    The last column is the rate against the rung before: the pair's median of ``before /
    after`` round by round where ``paired[name]`` holds both step times (``train_pairs``), else
    the two ladder results' ratio. A rung timed only in a pair, beside the ladder's last (an
    experiment not adopted into the ladder), may be missing from ``results`` when its pair has
    both step times and profiles.

    Raises:
        ValueError: a predicted rung, or the rung before it, has no profile (no paired
            profiles, and trained without ``profile=True``: no timeline), the two were timed
            in different numbers of windows, ``paired`` lacks a predicted rung, or a rung
            missing from ``results`` has no pair with both step times and profiles.
    """
    names = list(results)
    rows, out = [], {}
    keys = {"bf16 residual": "residual", "one graph per step": "step", "CUDA graphs": "graphs",
            "rows in L2": "rows"}
    what = "measured"
    for name, pred in predicted.items():
        pair = (paired or {}).get(name, {})
        profiled = pair.get("profiles")
        timed = "before" in pair and "after" in pair     # the pair's own step times
        if name not in names:           # an experiment timed only beside the last rung
            if not (timed and profiled is not None):
                raise ValueError(f"results: no rung {name!r}; a rung outside the ladder "
                                 "needs its pair's rounds (before, after) and profiles")
            before = after = None
        else:
            before, after = results[previous(names, name)], results[name]
        for r in (before, after):
            if r is not None and profiled is None and r.extra.get("timeline") is None:
                raise ValueError(f"results: rung {r.rung['name']!r} has no profiled timeline; "
                                 f"train it with profile=True (it is {name!r} or the rung before)")
        if paired is not None:
            if name not in paired:
                raise ValueError(f"paired: no interleaved rounds for {name!r}")
            saved = paired[name]["saved"]
            what = f"measured ({saved.n} interleaved rounds)"
        else:
            wb = before.extra.get("window_step_s") or [before.step_s]
            wa = after.extra.get("window_step_s") or [after.step_s]
            if len(wb) != len(wa):
                raise ValueError(f"results: {name!r} and the rung before were timed in "
                                 f"{len(wa)} and {len(wb)} windows; time them alike")
            saved = Spread(tuple(b - a for b, a in zip(wb, wa)))
            what = f"measured ({len(wa)} windows)"
        if profiled is not None:             # interleaved profiled steps, round by round
            fell = {w: timeline_spread(profiled["before"], w)
                    - timeline_spread(profiled["after"], w)
                    for w in ("window_s", "busy_s", "idle_s")}
            window, busy, gaps = (fell[w].median for w in ("window_s", "busy_s", "idle_s"))
            kernels = _change_spread("the kernels' own time", fell["busy_s"])
            idle = _change_spread("the idle time between them", fell["idle_s"])
        else:
            tb, ta = before.extra["timeline"], after.extra["timeline"]
            window, busy, gaps = (tb.window_s - ta.window_s, tb.busy_s - ta.busy_s,
                                  tb.idle_s - ta.idle_s)
            # the statistic that grades the saving, not a looser one
            noise = noise_half_width(saved)
            kernels = _change("the kernels' own time", busy, noise)
            idle = _change("the idle time between them", gaps, noise)
        cause = f"in the profiled steps {kernels} and {idle}"
        out[keys.get(name, name.split()[0].lower())] = (name, saved, cause)
        # the rate against the rung before: the pair's rounds where it has them (the
        # ladder's sequential bursts differ by a few % from run to run)
        ratio = ((pair["before"] / pair["after"]).median if timed
                 else after.tokens_per_s / before.tokens_per_s)
        # the range in the sense of its word: a loss's range is of the loss (positive)
        lo, hi = (-saved.hi, -saved.lo) if measurable(saved) is False else (saved.lo, saved.hi)
        rows.append([name, fmt(pred, "s"),
                     f"{saving_text(saved, short=True)} ({fmt_range(lo, hi, 's')})",
                     fmt(window, "s"), fmt(busy, "s"), fmt(gaps, "s"),
                     fmt(ratio, "x")])
    return _md(["rung", "predicted saving per step", what, "profiled step fell by",
                "in kernels", "in gaps", "rate vs the rung before"], rows), out


def saving_verdict(saved: Spread, predicted: float, tolerance: float, *,
                   at_most: bool, at_least: float | None = None,
                   spread: Spread | None = None,
                   spread_of: str | None = None) -> tuple[bool | None, str, str, str, str]:
    """How a measured saving (seconds per step, a :class:`Spread`) compares with its prediction,
    in seconds: ``(holds, if_true, if_false, if_undecided, detail)``, the first four for
    :func:`perflab.record.claims.claim`: short phrases for the prose ("as predicted (0.93x)",
    "outside its band", "undecided (the spread crosses the band's edge)"); ``detail`` states
    the band and the measured spread, for the page's ``{measured}`` note (glued as the claim's
    ``<name>_spread``, as :func:`perflab.record.claims.compare` does).

    A two-sided prediction's band is ``predicted x (1 ± tolerance)``. An ``at_most`` prediction
    (an upper bound) needs a lower edge too, ``at_least`` (seconds, from 0 up to ``predicted``:
    the least the change should save, e.g. the idle time the profiles say it removed), so that
    a rung that saves nothing or loses time cannot pass: its band is ``at_least x (1 -
    tolerance)`` to ``predicted x (1 + tolerance)``. The claim holds when the whole spread lies
    in the band, fails when none of it does, and is undecided otherwise. ``detail`` gives the
    band and the spread in seconds; a ratio to the prediction is given only when the whole
    spread is positive (a ratio range that crosses zero says nothing).

    A two-sided prediction read from several profiled steps carries their ``spread`` (a
    :class:`Spread` of the prediction, one value per profiled pair, ``predicted`` its median):
    its band is then ``spread.lo x (1 - tolerance)`` to ``spread.hi x (1 + tolerance)``, the
    prediction's own uncertainty beside the tolerance of its model. A prediction whose range
    comes from something else (a quantity it could not read, taken at both its possible ends)
    says what in ``spread_of`` (a phrase: "between the ceiling's clock and the burst's"), which
    ``detail`` quotes instead of "over N profiled pairs".

    Raises:
        ValueError: a prediction that is not positive, a tolerance outside (0, 1), an
            ``at_most`` prediction without ``at_least`` (or one outside [0, predicted]), an
            ``at_least`` for a two-sided prediction, or a ``spread`` for an ``at_most`` one,
            not a Spread, or one that does not hold ``predicted`` between its ends;
            ``spread_of`` without a ``spread``, or not a non-empty string.
    """
    if not predicted > 0:
        raise ValueError(f"predicted must be > 0 seconds, got {predicted}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must lie in (0, 1), got {tolerance}")
    if at_most and (at_least is None or not 0 <= at_least <= predicted):
        raise ValueError(f"at_least must lie in [0, predicted = {predicted}] seconds for an "
                         f"at_most prediction (its band's lower edge), got {at_least}")
    if not at_most and at_least is not None:
        raise ValueError("at_least is the lower edge of an at_most prediction; a two-sided "
                         "prediction's band is predicted x (1 ± tolerance)")
    if spread is not None:
        if at_most or not isinstance(spread, Spread):
            raise ValueError("spread must be a Spread, and only for a two-sided prediction")
        if not spread.lo <= predicted <= spread.hi:
            raise ValueError(f"spread ({spread.lo} to {spread.hi}) must hold predicted "
                             f"= {predicted}")
    if spread_of is not None and (spread is None or not isinstance(spread_of, str)
                                  or not spread_of.strip()):
        raise ValueError(f"spread_of must be a non-empty phrase, and only with a spread; got "
                         f"{spread_of!r}")
    high = (spread.hi if spread is not None else predicted) * (1 + tolerance)
    low = (at_least if at_most else spread.lo if spread is not None
           else predicted) * (1 - tolerance)
    if saved.lo >= low and saved.hi <= high:
        holds = True
    elif saved.lo > high or saved.hi < low:
        holds = False
    else:
        holds = None
    band = fmt_range(low, high, "s")        # the page's one style of range
    if at_most:
        band += (f": at least {fmt(at_least, 's')} less {tolerance:.0%}, at most the bound "
                 f"plus {tolerance:.0%}")
    elif spread is not None:
        over = spread_of or f"over {spread.n} profiled pairs"
        band += (f": the prediction's {fmt_range(spread.lo, spread.hi, 's')} {over}, "
                 f"{tolerance:.0%} either way")
    band = band.replace("%", " %")
    spread = f"{fmt_range(saved.lo, saved.hi, 's')}"
    if saved.n > 1:
        spread += f", {saved.kind}"
    ratio = (f"; {fmt(saved.median / predicted, 'x')} the prediction"
             if saved.lo > 0 else "")
    # the prose takes a short phrase, the band and the rounds go to its {measured} note
    short = f" ({fmt(saved.median / predicted, 'x')})" if saved.lo > 0 else ""
    return (holds, f"as predicted{short}", f"outside its band{short}",
            "undecided (the spread crosses the band's edge)",
            f"measured {spread}{ratio}, against its band of {band}")


def memory_table(results: dict) -> str:
    """Chapter 10's memory-ladder table (Markdown): peak memory, step time and the loss after
    the last step of each rung. (Whether the rungs train the same model is checked on their
    gradients, not here: AdamW's first updates do not depend on the gradients' scale, so equal
    losses after a step or two cannot catch an accumulation that mis-scales them.)"""
    rows = []
    for name, r in results.items():
        rows.append([name, "-" if r.peak_bytes is None else fmt(r.peak_bytes, "iB"),
                     fmt(r.step_s, "s"), f"{r.losses[-1]:.4f}"])
    return _md(["rung", "peak memory", "step", "loss after the last step"], rows)


def step_peak(snapshot: dict, known: dict[str, int], device_index: int = 0) -> dict:
    """Where one recorded step's memory peaked, from its allocator snapshot
    (:func:`perflab.memory.snapshots.record_snapshot`, ``train(..., snapshot=...)``).

    ``before`` is what was allocated when recording began (the snapshot's live blocks at its
    end less the trace's net change: weights, optimizer state, anything the step found),
    ``added`` the most the step allocated above it (:func:`allocation_timeline`'s highest
    level), ``peak`` their sum; ``live`` the blocks the step allocated that were alive at that
    peak (:func:`perflab.memory.snapshots.peak_blocks`), grouped by the tensor of ``known``
    (``{name: bytes}``) whose size each matches within 1 % (allocator rounding; else
    ``"other"``): ``[(name, count, bytes)]``, the most bytes first.

    Raises:
        ValueError: no trace for ``device_index``, an empty trace, or no ``segments``.
    """
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        raise ValueError("the snapshot has no segments (not a CUDA memory snapshot)")
    times, levels = allocation_timeline(snapshot, device_index)
    if not levels:
        raise ValueError("the snapshot's trace holds no allocation or free")
    at_end = sum(b["size"] for seg in segments if seg.get("device", 0) == device_index
                 for b in seg.get("blocks", []) if b.get("state") == "active_allocated")
    before = at_end - levels[-1]
    added = max(max(levels), 0)
    groups: dict[str, list[int]] = {}
    for b in peak_blocks(snapshot, times[0], device_index):
        name = name_allocation(b["size"], known) or "other"
        g = groups.setdefault(name, [0, 0])
        g[0], g[1] = g[0] + 1, g[1] + b["size"]
    live = sorted(((n, c, t) for n, (c, t) in groups.items()), key=lambda g: -g[2])
    return {"before": before, "added": added, "peak": before + added, "live": live}


def peak_sentence(label: str, peak: dict, top: int = 4) -> str:
    """One clause for a :func:`step_peak`: what the step found allocated, what its peak added,
    and the largest groups of blocks alive at that peak."""
    parts = [f"{c} x {n} ({fmt(t, 'iB')})" if c > 1 else f"{n} ({fmt(t, 'iB')})"
             for n, c, t in peak["live"][:top]]
    return (f"{label}: {fmt(peak['before'], 'iB')} allocated before the step, its peak "
            f"{fmt(peak['added'], 'iB')} above that, the largest blocks alive there "
            + (", ".join(parts) if parts else "none"))
