"""Every page the course download ships starts on a CPU: its imports exist and its first code cell runs.

The download (``pytorch-performance-course.zip``, ``_ext/reader_pages.BUNDLE_FILES``) and the
student edition ship the chapter and lab sources whose README promises that each runs on a
laptop CPU. A page whose code imports a module that the package no longer has (the first
editions of chapter 8 and lab 8 imported ``perflab.parallel`` and five other removed modules)
fails the reader at its first cell, and nothing else in the tests saw it while its committed
notebook stayed frozen. Here, in the installed environment (no new virtual environment), one
process imports every name that any code cell of any shipped page imports, then runs each
shipped page's first code cell (its imports and set-up) in the page's own folder on a CPU. Of
the later cells, the ``perflab`` imports are checked: optional packages (``triton`` behind a
GPU check) and files a page writes for itself are not the download's promise.
``scripts/execute.py --check`` lists the same pages (:data:`SHIPPED`).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
import execute  # noqa: E402
import reader_pages  # noqa: E402

#: the notebook sources among the download's files (``book/*.md``, ``labs/*.md``)
SHIPPED = tuple(g for g in reader_pages.BUNDLE_FILES if g.endswith(".md"))
PAGES = sorted({p for g in SHIPPED for p in ROOT.glob(g) if execute.runs.is_myst_notebook(p)})


def _imports(source: str, everything: bool = True) -> list[tuple[str, str | None]]:
    """``(module, name or None)`` for the absolute imports of a code cell: of ``perflab`` at any
    depth (a removed module must fail wherever the page imports it), and with ``everything`` of
    any other package too (a page's first cell, which runs whole anyway). Later cells import
    optional packages behind a capability check (``triton`` under ``requires_gpu``) or files the
    page writes itself; those are the page's own business."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: the lines that parse are not our concern
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.module, a.name) for a in node.names if a.name != "*"]
    return [(m, n) for m, n in found if everything or m == "perflab" or m.startswith("perflab.")]


def _code(page: Path) -> list[str]:
    return [c.source for c in jupytext.read(page).cells if c.cell_type == "code"]


def test_the_download_ships_the_pages_that_execute_checks():
    assert PAGES, "no notebook sources among the download's files"
    assert set(SHIPPED) == set(execute.SHIPPED_PAGES), (
        "scripts/execute.py --check must cover every page the download ships: "
        f"download {SHIPPED}, execute.py {execute.SHIPPED_PAGES}")
    checked = {p.resolve() for p in execute.default_notebooks(pending=True, shipped=True)}
    assert {p.resolve() for p in PAGES} <= checked
    # the first editions of chapter 8 and lab 8 are gone from the book
    for page in PAGES:
        assert not (ROOT / "pending" / page.relative_to(ROOT)).exists(), \
            f"{page.relative_to(ROOT)} ships while its revision waits in pending/"


def test_the_download_ships_every_script_module_execute_imports():
    """The download's README runs ``scripts/execute.py``; the modules beside it that it imports
    (``preimport``) must ship too, or a reader's run stops at its imports."""
    shipped = {p.resolve() for g in reader_pages.BUNDLE_FILES for p in ROOT.glob(g)}
    tree = ast.parse((ROOT / "scripts" / "execute.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    beside = [ROOT / "scripts" / f"{m}.py" for m in sorted(names) if (ROOT / "scripts" / f"{m}.py").exists()]
    assert beside, "execute.py imports no module beside it: this test looks in the wrong place"
    missing = [str(p.relative_to(ROOT)) for p in beside if p.resolve() not in shipped]
    assert not missing, f"the course download lacks {missing}, which scripts/execute.py imports"


# one process for every page: importing torch once keeps this test within CI's budget
_RUNNER = r"""
import importlib, json, os, sys, traceback
import matplotlib
matplotlib.use("Agg")
jobs = json.loads(sys.stdin.read())
failed = {}
for page, imports in jobs["imports"].items():
    for module, name in imports:
        try:
            mod = importlib.import_module(module)
            if name is not None and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")
        except Exception as e:  # every import of every page is tried, each failure named
            failed.setdefault(page, []).append(
                f"import {module}{'.' + name if name else ''}: {type(e).__name__}: {e}")
for page, code in jobs["first"].items():
    os.chdir(jobs["folders"][page])
    try:
        exec(compile(code, page, "exec"), {"__name__": "__main__"})
    except Exception as e:
        failed.setdefault(page, []).append("first cell: " + "".join(
            traceback.format_exception_only(type(e), e)).strip())
print("RESULT " + json.dumps(failed))
"""


def _run(jobs: dict, tmp_path: Path) -> dict:
    """The runner's ``{page: [what failed]}`` for ``jobs``."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PERFLAB_FORCE_CPU_SIZES="1", MPLBACKEND="Agg",
               PERFLAB_CEILINGS=str(tmp_path / "ceilings.json"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(jobs), capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the runner died:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_every_shipped_page_imports_what_exists_and_starts_on_a_cpu(tmp_path):
    jobs = {"imports": {}, "first": {}, "folders": {}}
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        cells = _code(page)
        jobs["imports"][rel] = sorted({i for k, c in enumerate(cells) for i in _imports(c, k == 0)},
                                      key=str)
        if cells:       # a chapter's overview page may hold prose only: nothing to start
            jobs["first"][rel] = cells[0]
        jobs["folders"][rel] = str(page.parent)
    failed = _run(jobs, tmp_path)
    assert not failed, "pages of the download that do not start on a CPU:\n" + "\n".join(
        f"{page}: {why}" for page, whys in failed.items() for why in whys)


def test_the_check_fails_on_a_page_that_imports_a_removed_module(tmp_path):
    """The proof that the test above can fail: the first edition's imports."""
    first = "import perflab\nfrom perflab import parallel"
    imports = _imports(first + "\nimport perflab.ceilings\nfrom perflab.record import claims")
    assert imports == [("perflab", None), ("perflab", "parallel"), ("perflab.ceilings", None),
                       ("perflab.record", "claims")]
    failed = _run({"imports": {"old.md": imports}, "first": {"old.md": first},
                   "folders": {"old.md": str(ROOT / "book")}}, tmp_path)
    assert len(failed["old.md"]) == 3, failed      # parallel twice (import, first cell), ceilings
    assert any("perflab.parallel" in why or "parallel" in why for why in failed["old.md"])
