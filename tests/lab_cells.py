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


def run_reference_cell(nb, monkeypatch, reference_run: bool, committed: dict, mine: dict) -> dict:
    """Execute ``nb``'s closing-table cell (the one naming ``REFERENCE_RUN_ENV``) as the lab's
    reference run (``reference_run``: execute.py's ``PERFLAB_REFERENCE_RUN`` set) or as a
    student's run, with ``committed`` as the committed reference notebook's glued values (its
    run at commit 000…) and ``mine`` as the student's results; returns the cell's namespace."""
    import os

    import perflab
    import perflab.record.provenance as provenance
    monkeypatch.setattr(provenance, "lab_reference", lambda stem: (committed, {"git": "0" * 40}))
    if reference_run:
        monkeypatch.setenv(provenance.REFERENCE_RUN_ENV, "1")
    else:
        monkeypatch.delenv(provenance.REFERENCE_RUN_ENV, raising=False)
    ns = {"perflab": perflab, "os": os, "mine": mine}
    exec(code_cell(nb, "REFERENCE_RUN_ENV"), ns)
    return ns
