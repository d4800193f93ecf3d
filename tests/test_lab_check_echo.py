"""A lab's check cell prints its ✓ line and nothing else: a cell whose last statement is a
bare ``check_...(...)`` call must end with ``;``, or Jupyter echoes the check's return value
(lab 4 printed a stray ``True`` under exercise 1's two ✓ lines: reader review M2)."""

import ast
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.md"))


def echoed_checks(text: str) -> list[str]:
    """The code cells of a MyST notebook whose value Jupyter would display: the last
    statement is a call of a ``check...`` function and the cell does not end with ``;``."""
    found = []
    for cell in jupytext.reads(text, fmt="md:myst").cells:
        if cell.cell_type != "code":
            continue
        src = "\n".join(line for line in cell.source.splitlines()
                        if not re.match(r"\s*[%!]", line))
        try:
            body = ast.parse(src).body
        except SyntaxError:
            continue
        if not body or not isinstance(body[-1], ast.Expr) or not isinstance(body[-1].value, ast.Call):
            continue
        func = body[-1].value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        code = re.sub(r"#[^\n]*", "", src).rstrip()
        if name.startswith("check") and not code.endswith(";"):
            found.append(ast.get_source_segment(src, body[-1])[:80])
    return found


def test_the_rule_finds_an_echoed_check():
    cell = "```{code-cell} ipython3\ncheck_true(\n    x,\n    'a', 'b',\n)\n```\n"
    assert echoed_checks(cell) and not echoed_checks(cell.replace(")\n```", ");\n```"))


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_no_check_cell_echoes_its_return_value(lab):
    assert echoed_checks(lab.read_text(encoding="utf-8")) == []
