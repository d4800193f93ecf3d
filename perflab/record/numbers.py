"""Numbers as a person writes them: significant digits, a unit, a prefix that fits.

One formatter for every number a reader sees (prose through glue, tables, printed outputs):

    fmt(1.42e9, "B")            -> "1.42 GB"          decimal prefixes (bytes, FLOP, B/s, FLOP/s, Hz, W)
    fmt(2.2e9, "iB")            -> "2.05 GiB"         binary prefixes ("iB", "iB/s")
    fmt(734_577_152, "iB")      -> "701 MiB"
    fmt(0.0123, "s")            -> "12.3 ms"          seconds: ns, µs, ms, s, min, h
    fmt(510_525, "tokens/s")    -> "511k tokens/s"    counts: k, M, B (billion), T
    fmt(0.003, "%", signed=True)-> "+0.3 %"           a fraction, shown in percent
    fmt(0.0, "%", signed=True)  -> "0 %"              never "+0.00 %"
    fmt(2.345, "x")             -> "2.35x"            a ratio
    fmt(1234.5)                 -> "1.23k"            a plain count

``sig`` is the most significant digits shown: trailing zeros are dropped ("1.5 GB", not
"1.50 GB"), and a number is never written in scientific notation or with more digits than it
has significant ones. :data:`BAD_SHAPES` are the shapes a person would not write ("+0.00 %",
"0.0e+00", "2.05e+03 MiB", "734,577,152 bytes", "5.105e+05"): ``fmt`` never produces them, and
the book's tests reject them on every built page (tests/test_reader.py).

Beside ``fmt``: :func:`sig` keeps a fixed count of significant digits with thousands separators
("1,230", "0.0120"; the tables of chapters 5-7 and the check sentences of
:mod:`perflab.record.claims`), :func:`nbytes` writes bytes in binary units with it ("1.50 GiB"),
:func:`fmt_small` writes a number that may be tiny (a rounding difference, a tolerance) with a
power of ten below 0.001 ("4.5 × 10⁻⁷"), and :func:`power10` any number beyond a unit prefix
("3.15 × 10²³").

:func:`format_spec` is Python's ``format(value, spec)`` that never writes a shape of
:data:`BAD_SHAPES`: the book's ``{glue:text}`` roles format through it (``_ext/reader_pages.py``),
so a page's ``:.3g`` of 1,320 reads "1,320", never "1.32e+03".
"""

from __future__ import annotations

import math
import numbers as _numbers
import re
from typing import Callable

__all__ = ["BAD_SHAPES", "fmt", "fmt_range", "fmt_small", "format_spec", "nbytes", "power10", "sig"]

# Shapes of numbers a person would not write, as regular expressions over the text a reader
# reads (the look-behinds keep identifiers out: "arXiv:1604.06174", versions, URLs; a number
# may end a sentence: "within 1.2e-05." is caught, "1.2e-05.3" is not a number).
BAD_SHAPES = {
    "a zero that pretends to precision": r"(?<![\w.:/])[+\-−]?0\.0+\s?%",
    "scientific notation": r"(?<![\w.:/])[+\-−]?\d+(?:\.\d+)?e[+\-−]\d{2,}(?!\w|\.\w)",
    "a byte count in digits": r"(?<![\w.,:/])(?:\d{1,3}(?:,\d{3}){2,}|\d{7,})\s?(?:bytes|B)\b",
    "more digits than a measurement has": r"(?<![\w.:/])\d+\.\d{5,}(?!\w|\.\w)",
    # "1/1.32e+03 of the matrix rate": the shape above leaves a number after "/" alone (URLs)
    "scientific notation in a fraction": r"(?<=\d/)[+\-−]?\d+(?:\.\d+)?e[+\-−]\d{2,}(?!\w|\.\w)",
}

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"),
       (1e-9, "n"), (1e-12, "p"))
_BINARY = ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"), (1, ""))
_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_SECONDS_SMALL = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"), (1e-12, "ps"))
# units written with decimal (SI) prefixes and a space: "1.42 GB", "989 TFLOP/s", "1.83 GHz"
SI_UNITS = ("B", "B/s", "FLOP", "FLOP/s", "FLOPs", "Hz", "W", "J", "bit/s", "b/s")


MAX_DECIMALS = 4  # a fifth decimal is more than any measurement here has (BAD_SHAPES)


def _mantissa(value: float, sig: int) -> str:
    """``value`` with at most ``sig`` significant digits and :data:`MAX_DECIMALS` decimals, no
    exponent, trailing zeros dropped; a value too small for that reads ``<0.0001`` (``>-0.0001``)."""
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    decimals = min(MAX_DECIMALS, max(0, sig - 1 - exponent))
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("0", "-0"):
        bound = f"0.{'0' * (MAX_DECIMALS - 1)}1"
        return f">-{bound}" if value < 0 else f"<{bound}"
    return text


def _round_sig(value: float, sig: int) -> float:
    if value == 0:
        return 0.0
    return round(value, sig - 1 - math.floor(math.log10(abs(value))))


def _scaled(value: float, table, sig: int) -> tuple[str, str]:
    """Mantissa and prefix from ``table`` (``(factor, prefix)``, largest first) such that the
    rounded mantissa lies in [1, 1000) (or the smallest prefix; zero takes the unprefixed one)."""
    if _round_sig(value, sig) == 0:
        return "0", next(prefix for factor, prefix in table if factor == 1)
    for factor, prefix in table:
        # the mantissa as written decides (2**30 bytes is "1 GiB", not "1024 MiB")
        if abs(_round_sig(value / factor, sig)) >= 1:
            return _mantissa(value / factor, sig), prefix
    factor, prefix = table[-1]
    return _mantissa(value / factor, sig), prefix


def fmt(value: float, unit: str = "", sig: int = 3, signed: bool = False) -> str:
    """``value`` (in the unit's base: bytes, seconds, FLOP/s, a fraction for ``"%"``) written
    with at most ``sig`` significant digits and the prefix that keeps it between 1 and 1000.

    Args:
        value: a finite real number (numpy and torch scalars too).
        unit: ``"B"``, ``"B/s"``, ``"FLOP"``, ``"FLOP/s"``, ``"Hz"``, ``"W"`` (decimal prefixes);
            ``"iB"``, ``"iB/s"`` (binary prefixes: KiB, MiB, GiB); ``"s"`` (ns to hours);
            ``"%"`` (``value`` is a fraction: 0.94 -> "94 %"); ``"x"`` (a ratio: "2.35x");
            ``""`` (a plain count: "1.23k"); any other unit is a count of it ("511k tokens/s").
        sig: the most significant digits to show (>= 1).
        signed: write "+" before a positive value (differences); zero is written "0".

    Raises:
        ValueError: a value that is not a finite real number (a failed measurement is never
            printed as a number), or ``sig`` < 1.
    """
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, _numbers.Real) or not math.isfinite(value):
        raise ValueError(f"fmt needs a finite real number, got {value!r}")
    if not isinstance(sig, int) or sig < 1:
        raise ValueError(f"sig must be an integer >= 1, got {sig!r}")
    value = float(value)
    sign = "+" if signed and _round_sig(value, sig) > 0 else ""
    if unit == "%":
        return f"{sign}{_mantissa(value * 100, sig)} %"
    if unit == "x":
        return f"{sign}{_mantissa(value, sig)}x"
    if unit == "s":
        magnitude = abs(_round_sig(value, sig))
        if magnitude >= 3600:
            return f"{sign}{_mantissa(value / 3600, sig)} h"
        if magnitude >= 60:
            return f"{sign}{_mantissa(value / 60, sig)} min"
        mantissa, name = _scaled(value, _SECONDS_SMALL, sig)
        return f"{sign}{mantissa} {name}"
    if unit in ("iB", "iB/s"):
        mantissa, prefix = _scaled(value, _BINARY, sig)
        return f"{sign}{mantissa} {prefix}{unit[1:]}"
    if unit in SI_UNITS:
        mantissa, prefix = _scaled(value, _SI, sig)
        return f"{sign}{mantissa} {prefix}{unit}"
    mantissa, prefix = _scaled(value, _COUNT, sig)
    return f"{sign}{mantissa}{prefix}" + (f" {unit}" if unit else "")


def fmt_range(lo: float, hi: float, unit: str = "", sig: int = 3,
              write: Callable[[float], str] | None = None) -> str:
    """A spread's ends as a reader reads them: ``"336 ms–349 ms"``, or the one value when the
    ends are equal at the shown precision (``"336 ms"``, never ``"336 ms–336 ms"``), or
    ``"-215 µs to +19 µs"`` when an end is negative (a dash after a minus misleads).

    Args:
        lo, hi: the ends (finite; ``lo <= hi``).
        unit, sig: as :func:`fmt` (ignored when ``write`` is given).
        write: how to write one end (e.g. ``lambda r: f"{r:.2f}x"``); default :func:`fmt`.

    Raises:
        ValueError: an end that is not finite, or ``lo > hi``.
    """
    for label, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, bool) or not isinstance(v, _numbers.Real) or not math.isfinite(v):
            raise ValueError(f"fmt_range needs finite numbers, got {label}={v!r}")
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got lo={lo!r} > hi={hi!r}")
    one = write or (lambda v: fmt(v, unit, sig))
    a, b = one(lo), one(hi)
    if a == b:
        return a
    if lo < 0:
        return f"{one(lo)} to {fmt(hi, unit, sig, signed=True) if write is None else b}"
    return f"{a}–{b}"


# ---------------------------------------------------------------------------------------------
# fixed significant digits (the tables of chapters 5-7 and the sentences of record.claims), and
# numbers beyond any unit prefix, written with a power of ten

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


def fmt_small(x: float, digits: int = 2) -> str:
    """A number that may be tiny (a rounding difference, a tolerance) as a person writes it:
    ``fmt_small(4.5e-7) == "4.5 × 10⁻⁷"``, ``fmt_small(0.0123) == "0.012"``,
    ``fmt_small(0) == "0"``; never
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
    ``3.15e+23``. Unlike :func:`fmt_small`, the power of ten is written whatever the size.

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


# ---------------------------------------------------------------------------------------------
# Python's format specifications, as a person writes the number

_SPEC = re.compile(r"^(?:.?[<>=^])?(?P<sign>[+\- ]?)z?#?0?\d*[,_]?(?:\.(?P<precision>\d+))?"
                   r"(?P<type>[bcdeEfFgGnosxX%]?)$")
_EXPONENT = re.compile(r"\d[eE][+\-]?\d")
_ZERO_PERCENT = re.compile(r"^\s*[+\- ]?0(?:\.0+)?%\s*$")
_BAD = [re.compile(rx) for rx in BAD_SHAPES.values()]


def _unwritten(text: str) -> bool:
    """True when a person would not write ``text`` (an exponent, or a shape of
    :data:`BAD_SHAPES`, alone or after "1/")."""
    return bool(_EXPONENT.search(text)) or any(rx.search(t) for rx in _BAD for t in (text, f"1/{text}"))


def format_spec(value, spec: str = "") -> str:
    """``format(value, spec)`` as a person writes the number: what Python would write in a
    shape of :data:`BAD_SHAPES` (an exponent, more than four decimals, a zero percentage with
    false precision) is written otherwise; everything else is Python's.

    ``format_spec(1320.4, ".3g") == "1,320"`` (Python: ``1.32e+03``);
    ``format_spec(1.32e-5, ".2g") == "1.3 × 10⁻⁵"``; ``format_spec(0.0123, ".2e") == "0.0123"``;
    ``format_spec(0.0, "+.2%") == "0%"`` (Python: ``+0.00%``); ``format_spec(3.1415926,
    ".7f") == "3.1416"``; ``format_spec(0.127, ".1%") == "12.7%"`` as Python writes it.

    The significant digits are the spec's (``.3g``: 3; ``.2e``: 3; no precision: 6 for ``g``,
    3 for a bare float's repr); a fixed-point spec (``f``, ``%``) keeps at most
    :data:`MAX_DECIMALS` decimals. A number is then written in digits with thousands separators
    (:func:`sig`, trailing zeros dropped as ``g`` does) where that has at most four decimals
    and no exponent, else with a power of ten (:func:`power10`). Width and alignment are dropped
    from a number so rewritten (it is read inline, not in a column). Values that are not real
    numbers (strings, booleans) are formatted by Python unchanged.

    Raises:
        ValueError: what ``format(value, spec)`` raises.
    """
    m = _SPEC.match(spec)
    kind = m.group("type") if m else ""
    if isinstance(value, bool) or not isinstance(value, _numbers.Real):
        return format(value, spec)
    if kind in ("e", "E", "f", "F", "g", "G", "n", "%"):
        value = float(value)
    elif kind in ("b", "c", "d", "o", "x", "X"):
        value = int(value)
    text = format(value, spec)
    if m is None or not math.isfinite(value):
        return text
    if kind == "%" and _ZERO_PERCENT.match(text):
        return "0%"
    if not _unwritten(text):
        return text
    precision = m.group("precision")
    if kind in ("f", "F", "%") and precision is not None and int(precision) > MAX_DECIMALS:
        at = m.start("precision")
        fixed = format(value, spec[:at] + str(MAX_DECIMALS) + spec[m.end("precision"):])
        if not _unwritten(fixed) and (value == 0 or re.search(r"[1-9]", fixed)):
            return fixed
    if kind in ("e", "E"):
        digits = int(precision if precision is not None else 6) + 1
    elif kind in ("g", "G", "n"):
        digits = max(1, int(precision)) if precision is not None else 6
    else:
        digits = 3
    if kind == "%":
        value *= 100
    unit = "%" if kind == "%" else ""
    sign = "+" if m.group("sign") == "+" and value > 0 else ""
    if value == 0:
        return "0" + unit
    if abs(value) < 1e15:
        written = sig(value, digits)
        if "." in written:
            written = written.rstrip("0").rstrip(".")
        if not _unwritten(written):
            return sign + written + unit
    return sign + power10(value, digits) + unit
