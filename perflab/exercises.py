"""Checks for lab exercises: each says in one sentence what passed or what is wrong.

A check prints ``"✓ <what>: ..."`` and returns True when the answer is right, and raises
:class:`ExerciseFailed` (an ``AssertionError``, so nbgrader's autograder counts it as a failed
test) with ``"✗ <what>: ..."`` otherwise. Checks of speed compare ratios measured in the same run,
never absolute times.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

__all__ = ["ExerciseFailed", "check_choice", "check_close", "check_ratio_at_least", "check_true", "overlay_table"]


class ExerciseFailed(AssertionError):
    """An exercise's answer is wrong; the message says what and, where possible, why."""


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return repr(x)


def _number(name: str, value: Any) -> float:
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ {name}: no answer yet (the value is {value!r}).")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ExerciseFailed(f"✗ {name}: expected a number, got {type(value).__name__} {value!r}.") from None
    if not math.isfinite(v):
        raise ExerciseFailed(f"✗ {name}: the answer is {v}, not a finite number.")
    return v


def check_close(got: Any, expected: float, what: str, rtol: float = 0.01, hint: str = "") -> bool:
    """Pass when ``got`` is within relative tolerance ``rtol`` of ``expected``.

    Raises:
        ExerciseFailed: wrong, missing or non-numeric answer.
        ValueError: ``rtol`` negative.
    """
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    g = _number(what, got)
    e = float(expected)
    if math.isclose(g, e, rel_tol=rtol, abs_tol=0.0 if e else 1e-12):
        print(f"✓ {what}: {_fmt(g)} is right.")
        return True
    off = (g / e) if e else float("inf")
    msg = f"✗ {what}: got {_fmt(g)}, expected {_fmt(e)} (±{rtol:.0%}); yours is {off:.3g}x the answer."
    raise ExerciseFailed(msg + (f" Hint: {hint}" if hint else ""))


def check_choice(got: Any, expected: Any, what: str, choices: Iterable[Any] | None = None, hint: str = "") -> bool:
    """Pass when ``got == expected``; ``choices`` (if given) lists the valid answers.

    Raises:
        ExerciseFailed: wrong answer, or one that is not among ``choices``.
    """
    choices = list(choices) if choices is not None else None
    if choices is not None and got not in choices:
        raise ExerciseFailed(f"✗ {what}: {got!r} is not one of {choices}.")
    if got == expected:
        print(f"✓ {what}: {got!r} is right.")
        return True
    raise ExerciseFailed(f"✗ {what}: got {got!r}, expected {expected!r}." + (f" Hint: {hint}" if hint else ""))


def check_true(condition: bool, passed: str, failed: str) -> bool:
    """Pass when ``condition`` holds; print ``passed`` or raise with ``failed`` (one sentence each).

    Raises:
        ExerciseFailed: ``condition`` is false.
    """
    if condition:
        print(f"✓ {passed}")
        return True
    raise ExerciseFailed(f"✗ {failed}")


def check_ratio_at_least(numerator: float, denominator: float, minimum: float, what: str) -> bool:
    """Pass when ``numerator / denominator >= minimum`` (both measured in the same run).

    Raises:
        ExerciseFailed: the ratio is below ``minimum`` or an input is not a positive number.
    """
    n = _number(what, numerator)
    d = _number(what, denominator)
    if d <= 0 or n <= 0:
        raise ExerciseFailed(f"✗ {what}: both measurements must be positive, got {_fmt(n)} and {_fmt(d)}.")
    ratio = n / d
    if ratio >= minimum:
        print(f"✓ {what}: ratio {ratio:.3g} ≥ {minimum:.3g}.")
        return True
    raise ExerciseFailed(f"✗ {what}: ratio {ratio:.3g} is below the required {minimum:.3g}.")


def overlay_table(rows: Iterable[tuple[str, float | None, float | None, str]]) -> str:
    """A plain-text table of ``(quantity, yours, reference, unit)`` with the ratio yours/reference.

    Missing values print as ``—``. Returns the table as a string (print it).
    """
    lines = [f"{'quantity':38s} {'yours':>12s} {'reference':>12s} {'ratio':>7s}  unit"]
    for name, mine, ref, unit in rows:
        m = "—" if mine is None else f"{mine:.4g}"
        r = "—" if ref is None else f"{ref:.4g}"
        q = "—" if (mine is None or not ref) else f"{mine / ref:.2f}"
        lines.append(f"{name:38s} {m:>12s} {r:>12s} {q:>7s}  {unit}")
    return "\n".join(lines)
