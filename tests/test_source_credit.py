"""Each chapter page says, in its first lines, which chapter of the source book it follows
(reader review L2: the front page credited the book, no chapter page did)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p for p in (ROOT / "book").glob("[01][0-9]_*.md")
                  if re.fullmatch(r"\d\d_[a-z0-9_]+", p.stem)
                  and not re.match(r"\d\d_\d_", p.stem))
LANDING = {int(p.stem[:2]): p for p in reversed(CHAPTERS)}   # first file of each number


def test_every_chapter_number_has_a_landing_page():
    assert sorted(LANDING) == list(range(1, 11))


@pytest.mark.parametrize("n", sorted(LANDING))
def test_a_chapter_page_names_the_source_book_chapter_it_follows(n):
    text = LANDING[n].read_text(encoding="utf-8")
    body = text[text.index("\n# "):]
    opening = "\n".join(body.splitlines()[:6])
    assert re.search(rf"\*Follows chapter {n} of the source book \{{cite\}}`zhang2024engine`",
                     opening), (LANDING[n].name, opening)
