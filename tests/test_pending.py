"""Sources waiting in pending/ for a machine kind that is not lent run on a CPU like every page.

Each chapter source in ``pending/book/`` is executed with ``scripts/execute.py --out`` (in its
home folder, ``book/``, as it will run there); every cell must run. Pending labs are executed by
the lab tests (``tests/pages.py``). Each pending page declares the GPUs it waits for, and the
page it replaces (if any) shows a visible note of its older run's known defects.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402
from pages import lab_sources, pending_chapters  # noqa: E402

from perflab.record import runs  # noqa: E402

PENDING = runs.pending_sources(ROOT)
CHAPTERS = pending_chapters()


def background_jobs(items, tmp_path_factory):
    """The pending chapters' executions, started ahead two at a time (tests/background.py)."""
    return background.executions(items, "test_pending_chapter_runs_on_a_cpu", tmp_path_factory)


@pytest.mark.parametrize("md", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_pending_chapter_runs_on_a_cpu(md, tmp_path):
    rc = background.executed(md, tmp_path)
    assert rc == 0, f"{md.relative_to(ROOT)} failed on a CPU (see the output above)"


@pytest.mark.parametrize("md", PENDING, ids=[str(p.relative_to(ROOT)) for p in PENDING])
def test_pending_page_declares_what_it_waits_for(md):
    assert runs.declares_gpus(md), f"{md.relative_to(ROOT)}: no 'perflab: gpus' in its front matter"
    readme = (ROOT / runs.PENDING / "README.md").read_text()
    assert str(md.relative_to(ROOT / runs.PENDING)) in readme, \
        f"pending/README.md has no line for {md.relative_to(ROOT)}"
    replaced = ROOT / md.relative_to(ROOT / runs.PENDING)
    if replaced.exists():
        first = replaced.read_text().split("```{code-cell}")[0]
        assert "{warning}" in first and "known defects" in first.lower(), \
            f"{replaced.relative_to(ROOT)} keeps an older run: it needs a visible note of its known defects"


def test_every_page_declares_its_gpus():
    pages = [ROOT / (e + ".md") for e in runs.toc_files(ROOT / "_toc.yml")]
    pages = [p for p in pages if p.exists() and runs.is_myst_notebook(p)] + PENDING
    missing = [str(p.relative_to(ROOT)) for p in pages if not runs.declares_gpus(p)]
    assert not missing, f"pages without 'perflab: gpus' in their front matter: {missing}"


def test_pending_labs_are_among_the_labs_the_tests_run():
    labs = set(lab_sources())
    assert all(p in labs for p in PENDING if p.parent.name == "labs")
