"""Tables and numbers for the page: one call builds a Markdown table and glues it.

Bookkeeping, kept out of the chapters' cells: a cell computes rows of values, and
:func:`glue_table` turns them into one Markdown table glued under a name (shown in the prose with
``{glue:md}`name```). :func:`sig` and :func:`nbytes` write a number with three significant
digits and a unit, never as ``2.05e+03 MiB`` or ``734,577,152 bytes``; :func:`small` and
:func:`power10` write a number beyond any unit prefix with a power of ten (``3.15 × 10²³``).

How this differs from :func:`perflab.record.numbers.fmt` (numbers with a unit prefix, "1.42 GB")
and :func:`perflab.record.tables.show` (a table from rows and column specs): ``sig`` keeps a
fixed count of significant digits with thousands separators ("1,230", "0.0120"), the style of
the tables of chapters 5-7 and of the check sentences (:mod:`perflab.record.claims`), and
``glue_table`` glues a table whose cells are already formatted.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from perflab.record.provenance import glue

__all__ = ["glue_table", "markdown", "nbytes", "power10", "sig", "small"]

_BYTE_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def _check(x: float, digits: int) -> None:
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if not math.isfinite(x):
        raise ValueError(f"x must be finite, got {x}")


def sig(x: float, digits: int = 3, unit: str = "") -> str:
    """``x`` with ``digits`` significant digits, thousands separated, no exponent below 1e15:
    ``sig(1234.5) == "1,230"``, ``sig(0.012345) == "0.0123"``, ``sig(0) == "0"``.

    Raises:
        ValueError: ``x`` not finite or ``digits`` < 1.
    """
    _check(x, digits)
    if x == 0:
        text = "0"
    else:
        decimals = digits - 1 - math.floor(math.log10(abs(x)))
        text = f"{round(x, decimals):,.{max(decimals, 0)}f}"
    return f"{text} {unit}".rstrip() if unit else text


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def small(x: float, digits: int = 2) -> str:
    """A number that may be tiny (a rounding difference, a tolerance) as a person writes it:
    ``small(4.5e-7) == "4.5 × 10⁻⁷"``, ``small(0.0123) == "0.012"``, ``small(0) == "0"``; never
    ``4.5e-07`` or ``0.00000045``.

    Raises:
        ValueError: ``x`` not finite or ``digits`` < 1.
    """
    _check(x, digits)
    if x == 0 or abs(x) >= 1e-3:
        return sig(x, digits)
    mantissa, exponent = _decompose(x, digits)
    return _times_ten(f"{mantissa:.{digits - 1}f}", exponent)


def _decompose(x: float, digits: int) -> tuple[float, int]:
    """``(mantissa, exponent)`` with ``x == mantissa × 10**exponent``, the mantissa rounded to
    ``digits`` significant digits and in [1, 10) in magnitude (``x`` non-zero)."""
    exponent = math.floor(math.log10(abs(x)))
    mantissa = round(x / 10**exponent, digits - 1)
    if abs(mantissa) >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return mantissa, exponent


def _times_ten(head: str, exponent: int) -> str:
    return f"{head} × 10{str(exponent).translate(_SUPERSCRIPT)}"


def power10(x: float, digits: int = 3) -> str:
    """``x`` written with a power of ten, as a person writes a number too large or too small
    for a unit prefix (a training run's FLOPs, a float format's range):
    ``power10(3.15e23) == "3.15 × 10²³"``, ``power10(3.4028e38, 2) == "3.4 × 10³⁸"``,
    ``power10(1.1755e-38) == "1.18 × 10⁻³⁸"``, ``power10(1e6) == "1 × 10⁶"``; at most
    ``digits`` significant digits, trailing zeros dropped, ``power10(0) == "0"``. Never
    ``3.15e+23``. Unlike :func:`small`, the power of ten is written whatever the size.

    Raises:
        ValueError: ``x`` not finite or ``digits`` < 1.
    """
    _check(x, digits)
    if x == 0:
        return "0"
    mantissa, exponent = _decompose(x, digits)
    head = f"{mantissa:.{digits - 1}f}"
    if "." in head:
        head = head.rstrip("0").rstrip(".")
    return _times_ten(head, exponent)


def nbytes(n: float, digits: int = 3) -> str:
    """Bytes in the largest binary unit that keeps the value at or above 1: ``"1.50 GiB"``,
    ``"32.0 MiB"``, ``"512 B"``; negative values keep their sign."""
    mag = abs(n)
    for size, unit in _BYTE_UNITS:
        if mag >= size:
            return sig(n / size, digits, unit)
    return sig(n, digits, "B")


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table: ``columns`` headers, ``rows`` of cells (``str(cell)`` each), and ``align``
    one letter per column (``l`` or ``r``; default: the first column left, the rest right).

    Raises:
        ValueError: a row of another length than ``columns``, or a bad ``align``.
    """
    align = align or "l" + "r" * (len(columns) - 1)
    if len(align) != len(columns) or set(align) - {"l", "r"}:
        raise ValueError(f"align must be one l or r per column, got {align!r}")
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    for k, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"row {k} has {len(row)} cells for {len(columns)} columns")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def glue_table(name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
               align: str | None = None):
    """Build :func:`markdown`'s table, glue it under ``name`` (for ``{glue:md}`name```) and
    return it as an IPython ``Markdown`` object."""
    from IPython.display import Markdown  # optional: only notebooks glue tables

    table = Markdown(markdown(columns, rows, align))
    glue(name, table)
    return table
