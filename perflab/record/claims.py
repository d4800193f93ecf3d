"""Claims about measurements that cannot contradict the measurements.

A sentence such as "the fused kernel is about as fast as one unary operator" is a claim about
numbers the same page measured. Typed by hand, it goes stale the first time a run comes out
differently. Two tools keep prose honest:

* :func:`claim` chooses the sentence from the data and glues it, so the page says whatever the
  run supports (``{glue:text}`name``` in the prose).
* :func:`expect` records a predicate behind a sentence that stays typed ("the knee lies between
  32 and 64"): it glues ``True``/``False`` under ``expect_<name>``, and the book's tests fail
  when any committed notebook holds an expectation that its own run contradicts
  (:func:`failed_expectations`).

:func:`compare` is the claim behind every prediction: it glues the sentence that says how a
measurement compares with the number predicted for it, two-sided (a measurement far *below* its
prediction is a miss too), and returns whether it falls inside the stated band.

:func:`relation` turns two measured values into words ("2.3x faster than", "about the same as")
with a stated tolerance, for use inside :func:`claim` or glued sentences.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from perflab.record.numbers import sig
from perflab.record.provenance import glue, read_glued

__all__ = ["EXPECT_PREFIX", "Sentence", "claim", "compare", "expect", "failed_expectations",
           "relation"]

EXPECT_PREFIX = "expect_"


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


def claim(name: str, holds: bool, if_true: str, if_false: str) -> Sentence:
    """Glue, under ``name``, the sentence the data supports, and return it.

    The prose quotes it with ``{glue:text}`name```; the returned :class:`Sentence` shows nothing
    on a cell's last line, so the sentence appears once on the page.

    Args:
        name: glue name (a Python identifier).
        holds: the predicate, evaluated on this run's measurements.
        if_true, if_false: the sentence for each outcome (non-empty).

    Raises:
        ValueError: a bad name, an empty sentence, or a ``holds`` that is not a bool.
    """
    _check_name(name)
    holds = _as_bool(holds)
    if not if_true or not if_false:
        raise ValueError("if_true and if_false must both be non-empty sentences")
    text = Sentence(if_true if holds else if_false)
    glue(name, str(text))
    return text


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
    if quantity not in ("time", "rate", "size"):
        raise ValueError(f"quantity must be 'time', 'rate' or 'size', got {quantity!r}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
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


def compare(name: str, measured: float, predicted: float, tolerance: float = 0.25) -> bool:
    """Glue, under ``name``, how ``measured`` compares with ``predicted``; True when it is within
    ``tolerance`` (relative, both sides) of it.

    The sentence is a clause to follow a glued measurement: ``"within 25 % of the prediction
    (0.93x it)"`` or ``"1.7x the prediction, outside its 25 % band"``. A miss is a miss on either
    side: a step predicted at 2 ms that takes 0.5 ms means the model is wrong as surely as one
    that takes 8 ms. The caller explains a miss with an experiment on the page; this function
    only reports it.

    Args:
        name: glue name (a Python identifier).
        measured, predicted: finite numbers of the same unit, ``predicted`` positive (a
            measurement at or below zero is reported as a miss, never an error: a saving that
            did not happen is a result).
        tolerance: half-width of the band, relative to ``predicted`` (0 < tolerance < 1).

    Raises:
        ValueError: a bad name, a value that is not finite, a prediction that is not positive,
            or a tolerance outside (0, 1).
    """
    _check_name(name)
    for label, v in (("measured", measured), ("predicted", predicted)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                or not math.isfinite(v):
            raise ValueError(f"{label} must be a finite number, got {v!r}")
    if predicted <= 0:
        raise ValueError(f"predicted must be positive, got {predicted!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    if measured <= 0:       # a saving that did not happen, a time that did not grow
        claim(name, False, "unused", "none of the positive amount predicted")
        return False
    ratio = float(measured) / float(predicted)
    holds = abs(ratio - 1) <= tolerance
    band = f"{tolerance:.0%}".replace("%", " %")
    claim(name, holds, f"within {band} of the prediction ({_ratio_words(ratio)}x it)",
          f"{_ratio_words(ratio)}x the prediction, outside its {band} band")
    return holds
