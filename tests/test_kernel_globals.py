"""A Triton kernel defined on a page reads its globals (``tl``, ``triton``) from the notebook's
namespace when it is compiled, at its first call, which may come many cells later. A page that
binds one of those names to something else in between breaks the kernel only on a GPU: chapter
10's reference run of 5 December stopped after 201 s with "'Timeline' object has no attribute
'constexpr'", because a loop had named a profiler timeline ``tl``. CI, which has no Triton
kernels to compile, never takes that path; this test reads the pages instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import pytest

from myst_source import HEADER

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([*ROOT.glob("book/*.md"), *ROOT.glob("labs/*.md"), *ROOT.glob("pending/*/*.md")])
MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)


def _trees(md: Path):
    for cell in jupytext.read(md).cells:
        if cell.cell_type == "code":
            try:
                yield ast.parse(MAGIC.sub(r"\1pass", cell.source))
            except SyntaxError:
                continue


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _globals_read(fn: ast.FunctionDef) -> set[str]:
    args = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    local = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - local - args


def _module_level_stores(tree: ast.Module):
    """Every name a statement outside any function or class binds, except imports and the
    course's ``triton_modules()`` helper, which bind the modules themselves."""
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                          ast.Import, ast.ImportFrom)):
            continue
        if (isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                and "triton_modules" in ast.unparse(s.value.func)):
            continue
        for n in ast.walk(s):   # nested statements too (the `if` and `for` of chapter 10)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                yield n.id


def _kernel_globals(md: Path) -> set[str]:
    names: set[str] = set()
    for tree in _trees(md):
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and _is_jit(fn):
                names |= _globals_read(fn)
    return names


def test_the_rule_catches_chapter_10s_timeline(tmp_path):
    md = tmp_path / "page.md"
    md.write_text(HEADER + "\n```{code-cell} ipython3\nimport triton\n"
                  "import triton.language as tl\n\n\n@triton.jit\ndef k(x_ptr, B: tl.constexpr):\n"
                  "    tl.store(x_ptr, tl.arange(0, B))\n```\n\n```{code-cell} ipython3\n"
                  "if True:\n    for key in 'ab':\n        tl = object()\n```\n")
    assert _offences(md) == ["tl"]


def _offences(md: Path) -> list[str]:
    kernel = _kernel_globals(md)
    return sorted({name for tree in _trees(md) for name in _module_level_stores(tree)
                   if name in kernel})


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_rebinds_a_name_its_triton_kernels_read(md):
    bad = _offences(md)
    assert not bad, (f"{md.name} binds {bad} outside a function, and a Triton kernel on the page "
                     "reads them as globals when it is compiled: rename the variable")
