"""A table of measurements in one call: formatted as a person writes numbers, shown once, glued.

    from perflab.record.tables import Column, show

    show(rows, [Column("rung", "rung"),
                Column("tokens_per_s", "tokens/s", unit="tokens/s"),
                Column("peak_bytes", "peak memory", unit="iB"),
                Column("speedup", "vs baseline", unit="x")],
         glue_prefix="gpt2_speed")

displays a Markdown table (each number through :func:`perflab.record.numbers.fmt`) and glues
every cell of every row under ``<glue_prefix>_<row>_<column>`` (the number) and
``<glue_prefix>_<row>_<column>_text`` (the text the table shows), where ``<row>`` is the row's
first column made a name (``"fp32 eager"`` -> ``fp32_eager``). Prose quotes a cell with
``{glue:text}`gpt2_speed_fp32_eager_tokens_per_s_text``` and tests read the numbers back with
:func:`perflab.record.provenance.read_glued`. It returns None, so the table is shown once even on a
cell's last line.

Two more calls of the same kind, so that a bookkeeping cell is the idea plus one line:

* :func:`glue_many` glues every field of one result (a dict, or a dataclass such as a run's
  result) under ``<prefix>_<field>``, and the fields given a unit also as text
  (``<prefix>_<field>_text``, written by ``fmt``);
* :func:`glue_table` glues (and shows) a table whose cells are already text, under one name, for
  ``{glue:md}`name``` in the prose.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from perflab.record.numbers import fmt, format_spec
from perflab.record.provenance import glue

__all__ = ["Column", "glue_many", "glue_table", "markdown", "show", "text_table"]


@dataclass(frozen=True)
class Column:
    """One column of a table: ``key`` in each row (a dict key, or an index for tuple rows),
    its ``header``, and how its numbers are written (``unit``, ``sig``, ``signed``: see
    :func:`perflab.record.numbers.fmt`; ``unit=None`` writes the value as text, a number as
    Python writes it unless that is a shape a person would not write:
    :func:`perflab.record.numbers.format_spec`)."""

    key: str | int
    header: str
    unit: str | None = None
    sig: int = 3
    signed: bool = False

    def text(self, value: Any) -> str:
        """The cell as the table shows it ("–" for None)."""
        if value is None:
            return "–"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if self.unit is not None and not isinstance(value, str):
            return fmt(value, self.unit, self.sig, self.signed)
        if isinstance(value, numbers.Real):   # no unit: as Python writes it, never 1.32e-05
            return format_spec(value)
        return str(value)


def _column(spec) -> Column:
    """A :class:`Column` from a Column, a key (its own header) or a tuple of Column's fields."""
    if isinstance(spec, Column):
        return spec
    if isinstance(spec, str):
        return Column(spec, spec)
    return Column(*spec)


def _name(text: Any) -> str:
    """A row label or column key made a glue name part: ``"fp32 eager"`` -> ``fp32_eager``."""
    name = re.sub(r"[^0-9a-zA-Z]+", "_", str(text)).strip("_").lower()
    return name or "row"


def markdown(rows: Sequence[Mapping | Sequence], columns: Sequence[Column | str | tuple]) -> str:
    """The Markdown text of the table (columns with a unit right-aligned).

    Raises:
        ValueError: a number that :func:`perflab.record.numbers.fmt` refuses (NaN, infinite).
    """
    cols = [_column(c) for c in columns]
    head = "| " + " | ".join(c.header for c in cols) + " |"
    rule = "|" + "|".join("---:" if c.unit is not None else "---" for c in cols) + "|"
    body = ["| " + " | ".join(c.text(row[c.key]).replace("|", "\\|") for c in cols) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def show(rows: Sequence[Mapping | Sequence], columns: Sequence[Column | str | tuple],
         glue_prefix: str | None = None) -> None:
    """Display ``rows`` as one table and, with ``glue_prefix``, glue every cell (module
    docstring). Returns None: the table is shown once, even on a cell's last line.

    Raises:
        ValueError: no columns, a row without a column's key, two rows with the same name
            (their glue names would collide), or a bad ``glue_prefix``.
    """
    from IPython.display import Markdown, display  # optional (the `book` extra): notebooks only

    cols = [_column(c) for c in columns]
    if not cols:
        raise ValueError("columns must name at least one column")
    for i, row in enumerate(rows):
        for c in cols:
            try:
                row[c.key]
            except (KeyError, IndexError, TypeError):
                raise ValueError(f"row {i} has no column {c.key!r}") from None
    if glue_prefix is not None:
        if not (isinstance(glue_prefix, str) and glue_prefix.isidentifier()):
            raise ValueError(f"glue_prefix must be a Python identifier, got {glue_prefix!r}")
        names = [_name(row[cols[0].key]) for row in rows]
        if len(set(names)) != len(names):
            raise ValueError(f"two rows share a name ({names}): their glued cells would collide")
        for row, name in zip(rows, names):
            for c in cols[1:]:
                value = row[c.key]
                if value is None:
                    continue
                base = f"{glue_prefix}_{name}_{_name(c.key)}"
                if isinstance(value, numbers.Real) and not isinstance(value, bool):
                    glue(base, value)
                glue(base + "_text", c.text(value))
    display(Markdown(markdown(rows, cols)))


def glue_many(prefix: str, values: Mapping[str, Any] | Any, units: Mapping[str, str] | None = None,
              sig: int = 3) -> None:
    """Glue every field of one result in one call::

        glue_many("gpt2_plain", {"step_s": plain.step_s, "mfu": mfu, "rung": plain.rung["name"]},
                  units={"step_s": "s", "mfu": "%"})
        # prose: {glue:text}`gpt2_plain_mfu_text` ("53.2 %"); tests and labs: gpt2_plain_mfu

    ``values`` is a mapping or a dataclass instance (its fields, in order). Each entry is glued
    under ``<prefix>_<key>`` (the key made a name as :func:`show` makes one: ``"fp32 eager"`` ->
    ``fp32_eager``); a number whose key ``units`` names is also glued as text,
    ``<prefix>_<key>_text`` = :func:`perflab.record.numbers.fmt` ``(value, unit, sig)``. A None is
    skipped (a quantity this run did not measure, as :func:`show` leaves its cell empty). Returns
    None, so the cell shows nothing.

    Raises:
        ValueError: ``prefix`` not an identifier; a value that is not a number, a string, a bool
            or None (a list or a table: use :func:`show` or :func:`glue_table`); a unit for a key
            that ``values`` lacks; two keys with the same name; a number that is not finite.
    """
    if not (isinstance(prefix, str) and prefix.isidentifier()):
        raise ValueError(f"prefix must be a Python identifier, got {prefix!r}")
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        values = {f.name: getattr(values, f.name) for f in dataclasses.fields(values)}
    if not isinstance(values, Mapping):
        raise ValueError(f"values must be a mapping or a dataclass instance, got "
                         f"{type(values).__name__}")
    units = dict(units or {})
    unknown = sorted(set(units) - set(values))
    if unknown:
        raise ValueError(f"units names keys that values lacks: {unknown}")
    names = {key: _name(key) for key in values}
    if len(set(names.values())) != len(names):
        raise ValueError(f"two keys share a name ({sorted(names.values())}): their glues would "
                         "collide")
    plain = {}
    for key, value in values.items():          # every value checked before anything is glued
        if value is None:
            continue
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()               # a numpy or torch scalar
        if not isinstance(value, (numbers.Real, str)):
            raise ValueError(f"values[{key!r}] is a {type(value).__name__}: glue_many glues "
                             "numbers and strings (a table: show or glue_table)")
        if key in units and isinstance(value, (str, bool)):
            raise ValueError(f"units[{key!r}]: values[{key!r}] is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"values[{key!r}] is {value}: the measurement failed")
        plain[key] = value
    for key, value in plain.items():
        base = f"{prefix}_{names[key]}"
        glue(base, value)
        if key in units:
            glue(base + "_text", fmt(value, units[key], sig))


def text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table of cells already written as text: ``columns`` headers, ``rows`` of cells
    (``str(cell)`` each), and ``align`` one letter per column (``l`` or ``r``; default: the
    first column left, the rest right). :func:`markdown` is the one that formats numbers.

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
    """Build :func:`text_table`'s table, glue it under ``name`` (for ``{glue:md}`name```) and
    return it as an IPython ``Markdown`` object.

    Raises:
        ValueError: what :func:`text_table` or :func:`perflab.record.provenance.glue` raise.
    """
    from IPython.display import Markdown  # optional (the `book` extra): only notebooks glue tables

    table = Markdown(text_table(columns, rows, align))
    glue(name, table)
    return table
