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
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from perflab.record.numbers import fmt
from perflab.record.provenance import glue

__all__ = ["Column", "markdown", "show"]


@dataclass(frozen=True)
class Column:
    """One column of a table: ``key`` in each row (a dict key, or an index for tuple rows),
    its ``header``, and how its numbers are written (``unit``, ``sig``, ``signed``: see
    :func:`perflab.record.numbers.fmt`; ``unit=None`` writes the value as text)."""

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
