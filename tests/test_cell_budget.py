"""Cells a reader can take in at once: a budget of code lines per cell, with a ratchet.

A code cell's length is its lines of code, not counting docstrings, comments and blank lines
(:func:`code_lines`). The budget depends on what the cell is (:func:`cell_kind`, CONTRIBUTING.md,
"Cells a reader takes in at once"):

* a visible cell shows one step of the idea: at most :data:`BUDGET` ``["visible"]`` lines;
* a hidden cell (``remove-cell``, ``remove-input``, ``hide-input``) is bookkeeping or a folded
  detail: at most ``["hidden"]`` lines, one call per result (``show``, ``glue_many``, ``compare``);
* a ``#@save`` cell shows a technique whole: at most ``["save"]`` lines.

The cells over budget today wait in ``tests/cell_budget_waiting.py`` (page -> first code line ->
lines), a list that only shrinks: a new cell over budget, a listed cell that grew, and a listed
cell that keeps the budget now (remove it) all fail, and the message prints the page's entries as
they should read.
"""

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import architecture  # noqa: E402
from cell_budget_waiting import OVER_BUDGET  # noqa: E402

BUDGET = {"visible": 30, "hidden": 15, "save": 40}
HIDDEN = {"remove-cell", "remove-input", "hide-input"}
_MAGIC = re.compile(r"^(\s*)[%!].*$", re.M)


def _docstring_lines(tree: ast.AST) -> set[int]:
    """0-based line numbers of the docstrings of a module, its functions and its classes."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            out.update(range(body[0].lineno - 1, body[0].end_lineno))
    return out


def code_lines(source: str) -> list[str]:
    """The lines of ``source`` that count: not blank, not a comment, not in a docstring (magics
    count as one line of code each)."""
    source = _MAGIC.sub(r"\1pass", source)
    lines = source.splitlines()
    try:
        skip = _docstring_lines(ast.parse(source))
    except SyntaxError:          # a cell that is not Python (a lab's stub): count it plainly
        skip = set()
    return [ln for i, ln in enumerate(lines)
            if i not in skip and ln.strip() and not ln.strip().startswith("#")]


def cell_kind(cell) -> str:
    """``"save"`` (a ``#@save`` cell), ``"hidden"`` (tagged remove-cell, remove-input or
    hide-input) or ``"visible"``."""
    if cell.source.lstrip().startswith("#@save"):
        return "save"
    return "hidden" if set(cell.metadata.get("tags", [])) & HIDDEN else "visible"


def over_budget(md: Path) -> dict[str, list[int]]:
    """The cells of one page over their budget: ``{first code line: [lines, ...]}`` (a first
    line shared by several cells lists each, longest first)."""
    nb = jupytext.reads(md.read_text(encoding="utf-8"), fmt="md:myst")
    found: dict[str, list[int]] = defaultdict(list)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        counted = code_lines(cell.source)
        if len(counted) > BUDGET[cell_kind(cell)]:
            found[counted[0].strip()[:70]].append(len(counted))
    return {k: sorted(v, reverse=True) for k, v in found.items()}


def _as_listed(found: dict[str, list[int]]) -> str:
    return "\n".join(f"        {k!r}: {v[0] if len(v) == 1 else v}," for k, v in found.items())


PAGES = [md.relative_to(ROOT).as_posix() for md in architecture.pages(ROOT)]


@pytest.mark.parametrize("page", PAGES)
def test_cells_keep_their_budget_or_wait_in_the_list(page):
    found = over_budget(ROOT / page)
    listed = {k: sorted(v if isinstance(v, list) else [v], reverse=True)
              for k, v in OVER_BUDGET.get(page, {}).items()}
    grew = {k: v for k, v in found.items()
            if k not in listed or len(v) > len(listed[k]) or any(a > b for a, b in zip(v, listed[k]))}
    kept = {k: v for k, v in listed.items() if len(found.get(k, [])) < len(v)}
    assert not grew and not kept, (
        f"{page}: cells over budget (visible {BUDGET['visible']}, hidden {BUDGET['hidden']}, "
        f"#@save {BUDGET['save']} lines of code): new or longer {grew}; within budget now "
        f"{sorted(kept)}. Shorten the new ones (a hidden cell is one call per result: show, "
        f"glue_many, compare); the list only shrinks. Its entry for this page should read:\n"
        f"    {page!r}: {{\n{_as_listed(found)}\n    }},")


def test_the_waiting_list_names_only_pages_that_exist():
    assert sorted(set(OVER_BUDGET) - set(PAGES)) == []


def test_lines_are_counted_without_docstrings_comments_and_blank_lines():
    src = ('#@save perflab.x\n"""The module."""\nimport torch\n\n\ndef f(x):\n'
           '    """Twice x.\n\n    More.\n    """\n    # a comment\n    return 2 * x  # inline\n%time f(1)\n')
    assert code_lines(src) == ["import torch", "def f(x):", "    return 2 * x  # inline", "pass"]
    assert len(code_lines("x = (1,\n     2)\n")) == 2          # a continuation line counts
    cell = type("Cell", (), {})()
    cell.source, cell.metadata = "#@save perflab.x\nx = 1", {}
    assert cell_kind(cell) == "save"
    cell.source, cell.metadata = "glue('a', 1)", {"tags": ["remove-cell"]}
    assert cell_kind(cell) == "hidden"
    cell.metadata = {"tags": ["hide-output"]}
    assert cell_kind(cell) == "visible"
