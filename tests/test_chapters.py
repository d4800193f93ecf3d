"""Every chapter of the book runs on this machine from its current source.

CI has no GPU, so it cannot make a reference run; what it can prove is that the code each page
shows today runs. Each chapter's MyST source (``book/*.md`` in the table of contents, the
explorer included) is executed on this CPU with ``scripts/execute.py --out`` into a scratch
folder, every cell must run, and the committed ``.ipynb`` (the GPU's outputs) is never touched.
A page whose code changed since its reference run is therefore tested as it stands, and is
merely *stale* (``execute.py --check`` exit 3, a warning in CI and a banner on the page) until
the next GPU run: page code and package code are treated alike (issue 38). Chapter 8 is executed
by the course download, unpacked and installed in a fresh environment (``tests/course_download.py``,
issue 39), instead of from the repository: the same one execution proves both. Chapters waiting in
``pending/`` run in ``tests/test_pending.py``, labs in ``tests/test_lab_checks.py``.

In a session the executions start ahead of these tests, two at a time, each ``execute.py`` a
process of its own (tests/background.py); the chapters in :data:`ALONE` run with nothing beside
them. ``PERFLAB_TEST_SLOTS=0`` executes each chapter in its test instead.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402
import execute  # noqa: E402

from perflab.record import runs  # noqa: E402


def chapters() -> list[Path]:
    """The chapter pages of the table of contents that are notebooks (not labs), whose source
    is the one in book/ (a page replaced by a pending source shows a frozen older run)."""
    out = []
    for entry in runs.toc_files(ROOT / "_toc.yml"):
        md = ROOT / (entry + ".md")
        if (entry.startswith("book/") and md.exists() and runs.is_myst_notebook(md)
                and runs.pending_replacement(md) is None):
            out.append(md)
    return out


CHAPTERS = chapters()


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 9, [p.name for p in CHAPTERS]


#: chapters that stopped when run beside another chapter and ``stress-ng --cpu 2``: 3.1 fits a
#: line to its call-cost sweep and raises on a negative per-element cost; chapter 8 raised when
#: ZeRO-1's predicted cost (broadcast minus Adam's saved time, both timed outside the step) left
#: no step (verdicts.cost_ratio): on gloo it now comes from the traced steps and cannot, but
#: chapter 8 still times its gloo ranks against each other on the host's cores. They run alone,
#: as every chapter did before.
ALONE = ("03_pytorch_internals", "08_distributed_training")


def background_jobs(items, tmp_path_factory):
    """The chapter executions these tests read, started ahead two at a time (tests/background.py)."""
    return background.executions(items, "test_chapter_runs_on_this_machine", tmp_path_factory, alone=ALONE)


@pytest.mark.parametrize("md", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_on_this_machine(md, tmp_path):
    rc = background.executed(md, tmp_path)
    assert rc == 0, f"{md.relative_to(ROOT)} failed on this machine (see the output above)"
