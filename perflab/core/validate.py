"""Argument checks: one place that says what a bad argument is and how the error reads.

Every public function of perflab checks its arguments before doing work and answers a bad one
with a ``ValueError`` that names the argument and shows the value it got, e.g. ``steps must be a
positive integer, got 0``. ``bool`` is refused where an integer is expected (``True`` is an
``int`` to Python, never a count to a reader).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

__all__ = ["integer", "integers", "number", "one_of", "positive", "positive_int"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rule(minimum: int, maximum: int | None, multiple_of: int | None) -> str:
    if minimum == 1 and maximum is None:
        words = "a positive integer"
    elif maximum is None:
        words = f"an integer >= {minimum}"
    else:
        words = f"an integer from {minimum} to {maximum}"
    return words + (f" and a multiple of {multiple_of}" if multiple_of else "")


def integer(name: str, value: Any, minimum: int = 1, maximum: int | None = None,
            multiple_of: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) with ``minimum <= value <= maximum`` and,
    when ``multiple_of`` is given, ``value % multiple_of == 0``.

    Args:
        name: the argument's name as the caller wrote it (it starts the error message).
        value: what the caller passed.
        minimum: smallest allowed value (inclusive).
        maximum: largest allowed value (inclusive), or None for no bound.
        multiple_of: a positive step ``value`` must be a multiple of, or None.

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``value`` breaks the rule; the message reads
            ``"<name> must be <rule>, got <value!r>"``.
    """
    ok = (_is_int(value) and value >= minimum and (maximum is None or value <= maximum)
          and (not multiple_of or value % multiple_of == 0))
    if not ok:
        raise ValueError(f"{name} must be {_rule(minimum, maximum, multiple_of)}, got {value!r}")
    return value


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an integer >= 1 (a count: steps, repeats, elements, bytes).

    Raises:
        ValueError: ``"<name> must be a positive integer, got <value!r>"``.
    """
    return integer(name, value, 1)


def integers(name: str, values: Iterable[Any], minimum: int = 1,
             multiple_of: int | None = None) -> list[int]:
    """``values`` as a list, if it is non-empty and every item passes :func:`integer`.

    Raises:
        ValueError: ``values`` is empty, not iterable, or holds a bad item; the message reads
            ``"<name> must be a non-empty sequence of integers >= <minimum> [that are multiples
            of <k>], got <values!r>"``.
    """
    try:
        items = list(values)
    except TypeError:
        items = []
    if not items or not all(_is_int(v) and v >= minimum and (not multiple_of or v % multiple_of == 0)
                            for v in items):
        rule = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        rule += f" that are multiples of {multiple_of}" if multiple_of else ""
        raise ValueError(f"{name} must be a non-empty sequence of {rule}, got {values!r}")
    return items


def positive(name: str, value: Any) -> float:
    """``value`` as a float, if it is a finite real number > 0 (a time, a rate, a bandwidth).

    Raises:
        ValueError: ``"<name> must be a positive finite number, got <value!r>"`` (also for
            ``bool``, None, NaN and infinities).
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def number(name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
           above: float | None = None, below: float | None = None) -> float:
    """``value`` as a float, if it is a finite real number (numpy's too; not a ``bool``) within
    the bounds given: ``minimum <= value <= maximum`` (inclusive), ``above < value < below``
    (exclusive); a bound left None does not apply.

    Raises:
        ValueError: ``value`` breaks the rule; the message reads
            ``"<name> must be a finite number >= <minimum> and < <below>, got <value!r>"``.
    """
    bounds = [(">=", minimum), (">", above), ("<=", maximum), ("<", below)]
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))
    if ok:
        v = float(value)
        ok = all(b is None or (v >= b if op == ">=" else v > b if op == ">" else
                               v <= b if op == "<=" else v < b) for op, b in bounds)
    if not ok:
        rule = " and ".join(f"{op} {b:g}" for op, b in bounds if b is not None)
        raise ValueError(f"{name} must be a finite number{' ' + rule if rule else ''}, got {value!r}")
    return float(value)


def one_of(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (a mode, a format, a policy).

    Raises:
        ValueError: ``"<name> must be one of <choices>, got <value!r>"``.
    """
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value
