"""Test helper: find a lab's code cells by a piece of their source (one home for the lab tests)."""

from __future__ import annotations


def code_cells(nb, needle: str) -> list[str]:
    """Sources of the code cells of ``nb`` (a jupytext/nbformat notebook) containing ``needle``."""
    return [c.source for c in nb.cells if c.cell_type == "code" and needle in c.source]


def code_cell(nb, needle: str) -> str:
    """The one code cell containing ``needle``; fails the test when there are none or several."""
    cells = code_cells(nb, needle)
    assert len(cells) == 1, f"expected one code cell containing {needle!r}, found {len(cells)}"
    return cells[0]
