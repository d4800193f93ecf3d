"""Every page has one title: a single top-level heading in its prose.

In run gpu-2026-12-07-07ca410, section 5.2's set-up cell closed its fence two lines early: the
comment after it (``# host verdicts ...``) rendered as a second title, listed in the page's
contents as section 5.7, and the call below it as prose, never run. A stray top-level heading
in a page's Markdown is almost always such a line of code outside its cell.
"""
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("book/*.md"), *ROOT.glob("labs/*.md"), *ROOT.glob("pending/**/*.md")])
PAGES = [p for p in PAGES if "code-cell" in p.read_text()]


def titles(path: Path) -> list[str]:
    """The top-level headings (``# ...``) of the page's Markdown cells, fenced blocks left out."""
    found = []
    for cell in jupytext.read(path).cells:
        if cell.cell_type != "markdown":
            continue
        fenced = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and line.startswith("# "):
                found.append(line)
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_has_one_title(path):
    found = titles(path)
    assert len(found) == 1, f"{path.name}: top-level headings {found} (code outside its cell?)"


def test_the_check_sees_code_outside_its_cell(tmp_path):
    page = tmp_path / "page.md"
    header = (ROOT / "book" / "06_single_gpu_speed.md").read_text().split("\n---\n")[0]
    page.write_text(header + "\n---\n\n# Title\n\n```{code-cell} ipython3\nx = 1\n```\n\n"
                    "# a comment left outside\nf(x)\n")
    assert titles(page) == ["# Title", "# a comment left outside"]
