"""Claims about measurements that cannot contradict the measurements.

A sentence such as "the fused kernel is about as fast as one unary operator" is a claim about
numbers the same page measured. Typed by hand, it goes stale the first time a run comes out
differently. Three tools keep prose honest:

* :func:`claim` chooses the sentence from the data and glues it, so the page says whatever the
  run supports (``{glue:text}`name``` in the prose).
* :func:`expect` records a predicate behind a sentence that stays typed ("the knee lies between
  32 and 64"): it glues ``True``/``False`` under ``expect_<name>``, and the book's tests fail
  when any committed notebook holds an expectation that its own run contradicts
  (:func:`failed_expectations`).
* :func:`compare` is the claim behind every prediction: it glues the sentence that says how a
  measurement compares with the number predicted for it, two-sided.
* :func:`reach` is the claim about a spread itself ("the cycles per product move by less than a
  tenth from burst to burst"): true when the rounds stay inside a band, false when they reach
  past an edge.

**Verdicts that survive a second run.** A measured quantity has a spread (its values over
interleaved rounds, :class:`perflab.core.rounds.Spread`). :func:`compare` and :func:`judge`
take it: a verdict is "within" the band only when the whole spread is, "outside" only when the
whole spread is, and **"undecided"** when a band's edge lies inside the spread: the run cannot
tell, and the sentence says so instead of tossing a coin that the next run may toss the other
way. A band's width comes from the prediction's stated uncertainty: ``tolerance`` has no
default, and a band wider than a factor of two (a measurement could be half or double its
prediction and still "agree") needs a written ``reason``.

**One pass.** A quantity that cannot be measured in rounds (a cold read happens once; a
measurement too slow to repeat in the page's time) is declared with ``single_pass=True``: the
verdict is drawn from one value, without a spread, and its sentence says so (:data:`ONE_PASS`),
so a reader knows that a second run may well draw it the other way. The record stores
``"single_pass": true``.

**Bound.** Every claim declares what sets the quantity it judges (``bound=``): ``"device"``
(the GPU's or the CPU's arithmetic and memory: a second run on another machine of the same kind
must give the same verdict), ``"host"`` (the host CPU's per-call cost, its scheduler, its disk:
it moves between hosts, and the status page shows both runs' values) or ``"exact"`` (a count,
a byte size, a shape: no measurement noise at all). The verdict, the bound and the numbers are
stored with the glued sentence (:data:`VERDICT_MIME`), so ``scripts/compare_runs.py`` can tell a
verdict that flipped from a sentence that only changed its numbers.

:func:`relation` turns two measured values into words ("2.3x faster than", "about the same as")
with a stated tolerance, for use inside :func:`claim` or glued sentences.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from perflab.core.rounds import Spread
from perflab.core.validate import number, one_of
from perflab.record.numbers import fmt, fmt_range, sig
from perflab.record.provenance import glue, read_glued

__all__ = ["BOUNDS", "EXPECT_PREFIX", "MAX_BAND_FACTOR", "ONE_PASS", "SPREAD_SUFFIX", "VERDICT_MIME",
           "Sentence", "Verdict",
           "claim", "compare", "expect", "failed_expectations", "judge", "not_compared",
           "reach", "read_verdicts", "relation"]

EXPECT_PREFIX = "expect_"

#: What may set a claimed quantity (see the module docstring).
BOUNDS = ("device", "host", "exact")

#: Widest band (high edge over low edge) a claim may use without a written reason.
MAX_BAND_FACTOR = 2.0

#: The mime type under which a claim's verdict is stored beside its glued sentence.
VERDICT_MIME = "application/vnd.perflab.verdict+json"

#: :func:`compare` glues its short verdict under ``name`` (for the running prose) and the
#: measurement against its band under ``name + SPREAD_SUFFIX`` (for a ``{measured}`` note).
SPREAD_SUFFIX = "_spread"

#: What a single-pass verdict's sentence adds (``single_pass=True``): one value, no spread.
ONE_PASS = "one pass, no spread"


def _check_name(name: Any) -> str:
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"name must be a Python identifier, got {name!r}")
    return name


def _as_bool(holds: Any) -> bool:
    # numpy.bool_ (from comparing numpy scalars) counts; 1, "yes" or None do not
    if not isinstance(holds, (bool, np.bool_)):
        raise ValueError(f"holds must be a bool, got {type(holds).__name__}")
    return bool(holds)


class Sentence(str):
    """A claim's sentence: a ``str`` that a notebook does not display on its own.

    A cell ending in ``claim(...)`` would otherwise show the sentence as the cell's result, and
    the reader would read it twice: there, and where the prose quotes it. ``print`` it (or put
    it in a Markdown output) to show it on purpose.
    """

    def _ipython_display_(self) -> None:
        return None


class Verdict(str):
    """A comparison's outcome: ``"within"``, ``"outside"`` or ``"undecided"`` (a ``str``).

    ``bool(verdict)`` is True only for ``"within"``; :attr:`holds` is True, False or None
    (undecided). One returned by :func:`compare` also has ``phrase``, ``detail`` and ``ratio``
    (see there).
    """

    def __new__(cls, word: str) -> "Verdict":
        if word not in ("within", "outside", "undecided"):
            raise ValueError(f"a verdict is 'within', 'outside' or 'undecided', got {word!r}")
        return super().__new__(cls, word)

    @property
    def holds(self) -> bool | None:
        """True (within), False (outside) or None (undecided)."""
        return {"within": True, "outside": False}.get(str(self))

    def __bool__(self) -> bool:
        return str(self) == "within"

    def _ipython_display_(self) -> None:
        return None


class _Claimed:
    """What :func:`claim` glues: the sentence as text, and the verdict as JSON beside it."""

    def __init__(self, text: str, record: dict[str, Any]):
        self.text, self.record = text, record

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        return {"text/plain": repr(self.text), VERDICT_MIME: self.record}


def _check_bound(bound: Any) -> str:
    return one_of("bound", bound, BOUNDS)


def _number(label: str, v: Any) -> float:
    return number(label, v)


def _values(label: str, v: Any) -> tuple[float, float, float, Spread | None]:
    """``(median, lo, hi, spread)`` of a number or a :class:`Spread`."""
    if isinstance(v, Spread):
        return v.median, v.lo, v.hi, v
    x = _number(label, v)
    return x, x, x, None


def claim(name: str, holds: bool | None, if_true: str, if_false: str, *, bound: str,
          if_undecided: str | None = None, record: dict[str, Any] | None = None,
          single_pass: bool = False) -> Sentence:
    """Glue, under ``name``, the sentence the data supports, and return it.

    The prose quotes it with ``{glue:text}`name```; the returned :class:`Sentence` shows nothing
    on a cell's last line, so the sentence appears once on the page. The verdict (true, false
    or undecided), ``bound`` and ``record`` are stored beside the sentence (:data:`VERDICT_MIME`)
    for the comparison of two runs.

    Args:
        name: glue name (a Python identifier).
        holds: the predicate on this run's measurements; None when the measurement cannot
            decide it (:func:`judge` returns None when a threshold lies inside a spread).
        if_true, if_false: the sentence for each outcome (non-empty).
        bound: ``"device"``, ``"host"`` or ``"exact"`` (:data:`BOUNDS`): what sets the
            quantity the claim judges.
        if_undecided: the sentence when ``holds`` is None (required then).
        record: extra JSON-ready facts stored with the verdict (numbers compared, band).
        single_pass: the predicate was decided from one measured value, without rounds: the
            sentence gets `` (one pass, no spread)`` (:data:`ONE_PASS`) before its closing
            period, and the record ``"single_pass": true``.

    Raises:
        ValueError: a bad name or bound, an empty sentence, a ``holds`` that is neither a bool
            nor None, or an undecided claim without ``if_undecided``.
    """
    _check_name(name)
    _check_bound(bound)
    if holds is not None:
        holds = _as_bool(holds)
    if not if_true or not if_false:
        raise ValueError("if_true and if_false must both be non-empty sentences")
    if holds is None and not if_undecided:
        raise ValueError(f"claim {name!r} is undecided (holds is None): give if_undecided, the "
                         "sentence that says the measurement cannot tell")
    text = if_true if holds else if_false if holds is False else if_undecided
    if single_pass:
        text = _one_pass(text)
        record = {**(record or {}), "single_pass": True}
    text = Sentence(text)
    verdict = {True: "true", False: "false", None: "undecided"}[holds]
    glue(name, _Claimed(str(text), {"verdict": verdict, "bound": bound, **(record or {})}))
    return text


def _one_pass(text: str) -> str:
    """``text`` with `` (one pass, no spread)`` before its closing period, if it has one."""
    stop = "." if text.endswith(".") else ""
    return f"{text[:len(text) - len(stop)]} ({ONE_PASS}){stop}"


def expect(name: str, holds: bool, statement: str) -> None:
    """Record that the typed ``statement`` holds on this run (glued as ``expect_<name>``).

    The notebook keeps running when it does not (a reader still sees the numbers), but
    :func:`failed_expectations` reports it and the book's tests fail, so the prose must be
    rewritten (or the sentence generated with :func:`claim`) before the run can be committed.
    A one-line note is printed when the expectation fails.

    Returns None on purpose: a cell that ends in ``expect(...)`` prints nothing (a returned
    bool would show up on the page as a stray ``True``).

    Raises:
        ValueError: a bad name, an empty statement, or a ``holds`` that is not a bool.
    """
    _check_name(name)
    if not statement:
        raise ValueError("statement must be a non-empty sentence")
    holds = _as_bool(holds)
    glue(EXPECT_PREFIX + name, holds)
    if not holds:
        print(f"Expectation {name!r} does not hold on this run: {statement}")


def failed_expectations(notebook: str | os.PathLike) -> list[str]:
    """Names of the expectations glued False in an executed notebook (empty when all hold).

    Raises:
        FileNotFoundError: no such notebook.
    """
    glued = read_glued(notebook)
    return sorted(k[len(EXPECT_PREFIX):] for k, v in glued.items()
                  if k.startswith(EXPECT_PREFIX) and v is not True and str(v) != "True")


def relation(a: float, b: float, quantity: str = "time", tolerance: float = 0.1) -> str:
    """Words comparing measured ``a`` with ``b``: ``"2.3x faster than"``, ``"about the same as"``.

    Args:
        a, b: two positive measurements of the same kind.
        quantity: ``"time"`` (smaller is faster), ``"rate"`` (larger is faster) or ``"size"``
            (larger/smaller).
        tolerance: relative difference under which the two count as "about the same" (>= 0).

    Raises:
        ValueError: a value that is not positive and finite, an unknown ``quantity`` or a
            negative ``tolerance``.
    """
    for label, v in (("a", a), ("b", b)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{label} must be a positive finite number, got {v!r}")
    one_of("quantity", quantity, ("time", "rate", "size"))
    number("tolerance", tolerance, minimum=0)
    ratio = a / b
    if abs(ratio - 1) <= tolerance:
        return "about the same as"
    if quantity == "size":
        return f"{ratio:.1f}x larger than" if ratio > 1 else f"{1 / ratio:.1f}x smaller than"
    faster = ratio < 1 if quantity == "time" else ratio > 1
    factor = max(ratio, 1 / ratio)
    return f"{factor:.1f}x {'faster' if faster else 'slower'} than"


def _ratio_words(ratio: float) -> str:
    return f"{ratio:.2f}" if 0.1 <= ratio < 10 else sig(ratio, 2)


def _band_check(low: float, high: float, reason: str | None, what: str) -> None:
    if low > 0 and high / low > MAX_BAND_FACTOR and not reason:
        raise ValueError(f"{what} spans a factor of {high / low:.2g} (more than "
                         f"{MAX_BAND_FACTOR:g}): such a band can hardly fail; narrow it or give "
                         "the reason it must be this wide (reason=...)")


def judge(value: float | Spread, low: float | None = None, high: float | None = None, *,
          reason: str | None = None) -> bool | None:
    """Whether ``value`` lies in ``[low, high]``: True when all of its spread does, False when
    none of it does, None (undecided) when an edge lies inside the spread.

    For a plain number it is a plain comparison. Pass the result to :func:`claim` (``holds``);
    a threshold claim ("faster than 2x") is ``judge(speedup, low=2.0)``.

    Args:
        value: a number or a :class:`perflab.core.rounds.Spread`.
        low, high: the edges (either may be None for a one-sided test; not both).
        reason: why a two-sided band wider than a factor of two is right (required then).

    Raises:
        ValueError: both edges None, ``low > high``, a value that is not finite, or a band
            wider than :data:`MAX_BAND_FACTOR` without a reason.
    """
    if low is None and high is None:
        raise ValueError("judge needs low, high or both")
    if low is not None:
        low = _number("low", low)
    if high is not None:
        high = _number("high", high)
    if low is not None and high is not None:
        if low > high:
            raise ValueError(f"low must be <= high, got {low} > {high}")
        _band_check(low, high, reason, "the band [low, high]")
    _, lo, hi, _ = _values("value", value)
    inside_lo = low is None or lo >= low
    inside_hi = high is None or hi <= high
    if inside_lo and inside_hi:
        return True
    if (low is not None and hi < low) or (high is not None and lo > high):
        return False
    return None


def compare(name: str, measured: float | Spread, predicted: float, tolerance: float, *,
            bound: str, reason: str | None = None, single_pass: bool = False,
            unit: str | None = None) -> Verdict:
    """Glue, under ``name``, how ``measured`` compares with ``predicted``, and return the
    :class:`Verdict`.

    The band is ``predicted × (1 ± tolerance)``. With a :class:`perflab.core.rounds.Spread`
    the verdict is "within" only when the whole spread lies in the band, "outside" when none
    of it does, and "undecided" when an edge of the band lies inside the spread.

    Two texts are glued. Under ``name``, a short phrase for the running prose, after a glued
    measurement: ``"as predicted (0.93x)"``, ``"outside the 25 % band (1.70x)"`` or
    ``"undecided (1.22x; the spread crosses the band's edge)"`` (the ratio is the median over
    the prediction). Under ``name + "_spread"`` (:data:`SPREAD_SUFFIX`), the measurement against
    its band, for the page's folded ``{measured}`` note, never the prose: ``"0.93x the
    prediction (0.90–0.96x, min–max over 5 rounds), against its band of 0.75–1.25x
    (±25 %)"``.
    A miss is a miss on either side. The caller explains a miss with an experiment on the page;
    this function only reports it.

    The returned :class:`Verdict` also carries ``phrase`` (the short phrase), ``detail`` (the
    note's sentence) and ``ratio`` (median over prediction), for a table of several verdicts.

    Args:
        name: glue name (a Python identifier).
        measured: a number or a Spread of the same unit as ``predicted`` (a median at or below
            zero is reported as a miss, never an error: a saving that did not happen is a
            result).
        predicted: positive finite number.
        tolerance: half-width of the band relative to ``predicted`` (0 < tolerance < 1), from
            the prediction's stated uncertainty; no default.
        bound: ``"device"``, ``"host"`` or ``"exact"`` (see the module docstring).
        reason: required when the band spans more than a factor of two (tolerance > 1/3).
        single_pass: ``measured`` is one value from one pass, with no rounds to give it a
            spread: both texts say so (``"as predicted (1.02x, one pass, no spread)"``) and the
            record stores ``"single_pass": true``.
        unit: the unit of ``measured`` (:func:`perflab.record.numbers.fmt`'s: ``"s"``), for
            a difference of two times taken round by round (a step beyond another, a time
            saved, a slope). With it, a spread whose rounds reach zero or below is stated in
            that unit in the ``_spread`` note, with the verdict in words ("the rounds ran
            -5.3 ms to +6.6 ms ... undecided: the rounds reach across the band's edge"), since
            a spread of ratios that crosses zero ("-5.3x to 6.60x the prediction") cannot be
            read. Without it such a spread is written as ratios (``"-0.17x to 2.74x"``).

    Raises:
        ValueError: a bad name or bound, a value that is not finite, a prediction that is not
            positive, a tolerance outside (0, 1), a too-wide band without a reason, or
            ``single_pass`` with a measurement of several rounds.
    """
    _check_name(name)
    _check_bound(bound)
    med, lo, hi, spread = _values("measured", measured)
    if single_pass and spread is not None and spread.n > 1:
        raise ValueError(f"compare {name!r}: single_pass with a spread of {spread.n} rounds; "
                         "a measurement with rounds is no single pass")
    predicted = _number("predicted", predicted)
    number("predicted", predicted, above=0)
    number("tolerance", tolerance, above=0, below=1)
    _band_check(1 - tolerance, 1 + tolerance, reason, f"a ±{tolerance:.0%} band")
    record = {"measured": med, "lo": lo, "hi": hi, "predicted": predicted,
              "tolerance": tolerance, "rounds": spread.n if spread else 1}
    if single_pass:
        record["single_pass"] = True
    once = f", {ONE_PASS}" if single_pass else ""
    band = f"{tolerance:.0%}".replace("%", " %")
    if med <= 0:        # a saving that did not happen, a time that did not grow
        none = str(claim(name, False, "unused", "none of the positive amount predicted",
                         bound=bound, single_pass=single_pass,
                         record={**record, "verdict_word": "outside"}))
        detail = (f"{'one pass' if once else 'a median'} of {_ratio_words(med / predicted)}x "
                  f"the prediction{' (no spread)' if once else ''}, against its "
                  f"band of {_ratio_words(1 - tolerance)}–{_ratio_words(1 + tolerance)}x "
                  f"(±{band})")
        glue(name + SPREAD_SUFFIX, detail)
        return _verdict("outside", none, detail, med / predicted)
    ratio, r_lo, r_hi = med / predicted, lo / predicted, hi / predicted
    rounds = ""
    if spread is not None and spread.n > 1:
        # a spread that crosses zero reads "-0.17x to 2.74x" (a dash after a minus misleads)
        # ends equal at the shown precision are one value, not "1.00–1.00x"
        ends = fmt_range(r_lo, r_hi, write=lambda r: f"{_ratio_words(r)}x")
        if r_lo >= 0:                                   # "0.95–1.10x", the unit once
            ends = ends.replace("x–", "–", 1)
        rounds = (f"{ends}, {spread.kind}" if ends != f"{_ratio_words(r_lo)}x" else
                  f"the same in each of {spread.n} rounds")
    low, high = 1 - tolerance, 1 + tolerance
    holds = (True if low <= r_lo and r_hi <= high else
             False if r_hi < low or r_lo > high else None)
    word = {True: "within", False: "outside", None: "undecided"}[holds]
    edge = low if r_lo < low <= r_hi else high
    r = f"{_ratio_words(ratio)}x"
    phrase = {True: f"as predicted ({r}{once})", False: f"outside the {band} band ({r}{once})",
              None: f"undecided ({r}; the spread crosses the band's edge)"}[holds]
    if unit is not None and spread is not None and lo <= 0:
        detail = _crossing_sentence(spread, predicted, tolerance, band, unit, holds)
    else:
        detail = _spread_sentence(r, rounds or (ONE_PASS if once else ""), band, low, high,
                                  edge if holds is None else None)
    claim(name, holds, phrase if holds else "-", phrase if holds is False else "-",
          if_undecided=phrase, bound=bound, record={**record, "verdict_word": word})
    glue(name + SPREAD_SUFFIX, detail)
    return _verdict(word, phrase, detail, ratio)


def reach(name: str, spread: Spread, low: float, high: float, *, bound: str,
          if_inside: str, if_beyond: str, unit: str = "x") -> Sentence:
    """Glue, under ``name``, whether the rounds of ``spread`` stay inside ``[low, high]``, and
    return the sentence.

    :func:`compare` and :func:`judge` ask where a quantity lies, and a band's edge inside its
    spread leaves them undecided. Some claims are about the spread itself: "the cycles one
    product takes move by less than a tenth from burst to burst" is judged on how far the
    rounds reach, so it has two outcomes and no undecided one: true when the spread (the IQR
    from 8 rounds, min–max below) lies inside the band, false when it reaches past an edge.
    The spread's median is usually fixed by design (ratios to their own median read 1).
    Under ``name + SPREAD_SUFFIX`` it glues the note ``"0.98–1.06x (IQR over 8 rounds),
    against its band of 0.90–1.10x: inside"``.

    Args:
        name: glue name (a Python identifier).
        spread: the rounds (a :class:`perflab.core.rounds.Spread` of at least 2 values, in the
            band's unit: a ratio when the band is ``0.9, 1.1``).
        low, high: the band's edges, finite, ``0 < low < high``; a band wider than a factor
            of two is refused (:data:`MAX_BAND_FACTOR`): it could hardly fail. The edge test
            is exact (no undecided zone): ``scripts/compare_runs.py`` warns of a quartile near
            an edge.
        bound: ``"device"``, ``"host"`` or ``"exact"`` (:data:`BOUNDS`).
        if_inside, if_beyond: the sentence for each outcome (non-empty).
        unit: written after each number of the note (``"x"`` for ratios, ``""`` for none).

    Raises:
        ValueError: a bad name or bound, a ``spread`` that is not a Spread of at least two
            rounds, edges that are not finite or not ``0 < low < high``, a band wider than
            :data:`MAX_BAND_FACTOR`, or an empty sentence.
    """
    _check_name(name)
    _check_bound(bound)
    if not isinstance(spread, Spread) or spread.n < 2:
        raise ValueError(f"reach {name!r}: spread must be a Spread of at least 2 rounds (a "
                         f"reach needs rounds), got {spread!r}")
    low, high = _number("low", low), _number("high", high)
    if not 0 < low < high:
        raise ValueError(f"reach {name!r}: need 0 < low < high (a band of positive values, "
                         f"whose width is a factor), got low={low}, high={high}")
    _band_check(low, high, None, "the band [low, high]")
    inside = low <= spread.lo and spread.hi <= high
    ends = fmt_range(spread.lo, spread.hi, write=lambda r: f"{_ratio_words(r)}{unit}")
    glue(name + SPREAD_SUFFIX,
         f"{ends} ({spread.kind}), against its band of {_ratio_words(low)}{unit}–"
         f"{_ratio_words(high)}{unit}: {'inside' if inside else 'reaching past an edge'}")
    return claim(name, inside, if_inside, if_beyond, bound=bound,
                 record={"lo": spread.lo, "hi": spread.hi, "band_lo": low, "band_hi": high,
                         "rounds": spread.n, "measured": spread.median})


def _verdict(word: str, phrase: str, detail: str, ratio: float) -> Verdict:
    out = Verdict(word)
    out.phrase, out.detail, out.ratio = phrase, detail, ratio
    return out


def _crossing_sentence(spread: Spread, predicted: float, tolerance: float, band: str,
                       unit: str, holds: bool | None) -> str:
    """The ``_spread`` note of a difference whose rounds reach zero or below (``unit`` given to
    :func:`compare`): the rounds and the band in ``unit``, the verdict in words."""
    lo, hi = predicted * (1 - tolerance), predicted * (1 + tolerance)
    return (f"the rounds ran {fmt_range(spread.lo, spread.hi, unit)} ({spread.kind}), at or "
            "below zero in some, so no ratio to the prediction is read from them; against the "
            f"band of {fmt_range(lo, hi, unit)} (±{band}) around the predicted "
            f"{fmt(predicted, unit)}, "
            + {True: "within the band", False: "outside the band",
               None: "undecided: the rounds reach across the band's edge"}[holds])


def _spread_sentence(ratio: str, rounds: str, band: str, low: float, high: float,
                     edge: float | None) -> str:
    """What :func:`compare` glues under ``<name>_spread``: the measurement against its band,
    for the folded "How this was measured" note (``{measured}``), not the running prose."""
    out = f"{ratio} the prediction" + (f" ({rounds})" if rounds else "")
    out += f", against its band of {_ratio_words(low)}–{_ratio_words(high)}x (±{band})"
    if edge is not None:
        out += f"; the band's edge at {_ratio_words(edge)}x lies inside the spread"
    return out


def not_compared(*names: str, why: str) -> None:
    """Glue ``why`` under each name and its ``<name>_spread``: what a page says where a
    :func:`compare` could not run (no GPU, no ``ncu``), so that the prose and the ``{measured}``
    note that quote both still build.

    Raises:
        ValueError: no name, a name that is not a Python identifier, or a ``why`` that is not
            a string (it may be empty where the prose says why in a sentence of its own).
    """
    if not names:
        raise ValueError("not_compared needs at least one claim name")
    for name in names:
        _check_name(name)
    if not isinstance(why, str):
        raise ValueError(f"why must be the text to show instead, got {why!r}")
    for name in names:
        glue(name, why)
        glue(name + SPREAD_SUFFIX, why)


def read_verdicts(notebook: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The verdict records of every claim glued in an executed notebook:
    ``{name: {"verdict": "true"|"false"|"undecided", "bound": ..., ...}}`` (claims glued
    before verdicts were stored are absent).

    Raises:
        FileNotFoundError: no such notebook.
    """
    nb = json.loads(Path(notebook).read_text())
    out: dict[str, dict[str, Any]] = {}
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            record = output.get("data", {}).get(meta.get("mime_prefix", "") + VERDICT_MIME)
            if isinstance(record, dict):
                out[meta["name"]] = record
    return out
