"""Every page's code lines fit in 80 columns: wider lines are clipped in the built HTML.

Chapter 2 had its own check; this one covers every page of the book, the labs and the pages
waiting in pending/ (three lines of chapters 8 and 10 reached a GPU run at 81-82 columns).
"""
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("book/*.md"), *ROOT.glob("labs/*.md"),
                *ROOT.glob("pending/**/*.md")])
PAGES = [p for p in PAGES if "code-cell" in p.read_text()]

# Lines that reached the GPU run of 6 December (run gpu-2026-12-07-86e0c7a) over 80 columns.
# Rewrapping them changes the page's code digest, so the committed notebook would be stale:
# they are rewrapped with the pages' next GPU run. The list is exact: a new long line fails,
# and so does an entry whose line is gone (remove it then).
KNOWN: dict[str, list[str]] = {}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_lines_fit_in_80_columns(path):
    cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
    long = [line for c in cells for line in c.source.splitlines() if len(line) > 80]
    known = KNOWN.get(path.relative_to(ROOT).as_posix(), []) if path.is_relative_to(ROOT) else []
    new = [line for line in long if line not in known]
    assert not new, f"{path.name}: {new[0]!r} is {len(new[0])} columns"
    assert long == known, f"{path.name}: a known long line is gone; remove it from KNOWN"


def test_the_check_sees_a_long_line(tmp_path):
    page = tmp_path / "page.md"
    header = (ROOT / "book" / "06_single_gpu_speed.md").read_text().split("\n---\n")[0]
    page.write_text(header + "\n---\n\n```{code-cell} ipython3\nx = "
                    + "1 + " * 25 + "1\n```\n")
    with pytest.raises(AssertionError, match="columns"):
        test_code_lines_fit_in_80_columns(page)
