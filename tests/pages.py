"""Test helper: which notebook sources the tests execute on a CPU (one answer for every test).

* the labs of ``labs/``, except a lab whose revised source waits in ``pending/labs/`` (the page
  in the book keeps its older run on show, code and outputs frozen together; its revised source
  is the one to test), plus every lab waiting in ``pending/labs/``;
* the chapters likewise: ``tests/test_chapters.py`` executes each ``book/*.md`` source except
  those whose revised source waits in ``pending/book/`` (:func:`archived_notebooks`), and
  ``tests/test_pending.py`` executes every source in ``pending/book/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perflab.record import runs  # noqa: E402


def _sources(folder: str) -> list[Path]:
    live = [p for p in sorted((ROOT / folder).glob("*.md"))
            if runs.is_myst_notebook(p) and runs.pending_replacement(p) is None]
    waiting = [p for p in runs.pending_sources(ROOT) if p.parent == ROOT / runs.PENDING / folder]
    return sorted(live + waiting, key=lambda p: p.name)


def lab_sources() -> list[Path]:
    """Every lab a CPU run should execute, in lab order (see the module docstring)."""
    return _sources("labs")


def pending_chapters() -> list[Path]:
    """The chapter sources waiting in ``pending/book/``."""
    return [p for p in runs.pending_sources(ROOT) if p.parent == ROOT / runs.PENDING / "book"]


def archived_notebooks() -> list[Path]:
    """``.ipynb`` files of the book whose revised source waits in ``pending/``: they show an
    older run, whose code no longer runs against today's perflab, and are not executed."""
    out = []
    for folder in ("book", "labs"):
        for md in sorted((ROOT / folder).glob("*.md")):
            if runs.is_myst_notebook(md) and runs.pending_replacement(md) is not None:
                out.append(md.with_suffix(".ipynb"))
    return out
