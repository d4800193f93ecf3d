"""Bookkeeping out of sight, checked on the sources (fast; no build, no browser).

A visible code cell (none of the tags ``remove-cell``, ``remove-input``, ``hide-input``) whose
lines are mostly bookkeeping (``glue``, ``claim``, ``expect``, ``compare``, a table helper: see
``tests/textbook_rules.py``) belongs in a hidden cell (CONTRIBUTING.md, "Bookkeeping cells").
Every notebook source of the table of contents, and every source waiting in ``pending/`` to
replace or join one, is checked; the sources that break the rule today are listed, with how many
such cells they have, in ``tests/reader_waiting.py`` (``MOSTLY_BOOKKEEPING_CELLS``): a listed
number may only go down (the test says when to lower it), an unlisted source must have none.
The built book's stricter rule (no bookkeeping call at all in a visible cell) is
``tests/test_reader.py::test_no_visible_bookkeeping``.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest

import reader_waiting
import textbook_rules as rules
from myst_source import HEADER
from perflab.record import runs

ROOT = Path(__file__).resolve().parent.parent


def sources(root: Path = ROOT) -> list[Path]:
    """The MyST notebook sources of ``_toc.yml`` and of ``pending/``, in that order."""
    found = []
    for doc in runs.toc_files(root / "_toc.yml"):
        md = root / (doc if doc.endswith(".md") else f"{doc}.md")
        if md.exists() and runs.is_myst_notebook(md):
            found.append(md)
    found += [md for md in runs.pending_sources(root) if md not in found]
    return found


def offending_cells(md: Path) -> list[str]:
    nb = jupytext.read(md)
    cells = [(c.source, c.get("metadata", {}).get("tags", [])) for c in nb.cells if c.cell_type == "code"]
    return rules.mostly_bookkeeping_cells(cells)


def check(found: dict[str, list[str]], waiting: dict[str, int]) -> list[str]:
    """What is wrong against the ratchet ``waiting`` ({source: allowed number of cells})."""
    problems = []
    for rel, cells in sorted(found.items()):
        allowed = waiting.get(rel, 0)
        if len(cells) > allowed:
            problems.append(f"{rel}: {len(cells)} visible code cell(s) mostly bookkeeping "
                            f"(allowed {allowed}); hide them (tags: [remove-cell] or [remove-input]):\n    "
                            + "\n    ".join(cells))
    for rel, allowed in sorted(waiting.items()):
        now = len(found.get(rel, []))
        if now < allowed:
            problems.append(f"{rel}: now {now} such cell(s): lower its number in "
                            f"tests/reader_waiting.py MOSTLY_BOOKKEEPING_CELLS to {now}"
                            + (" (remove the entry)" if now == 0 else ""))
    return problems


def test_visible_cells_are_not_mostly_bookkeeping():
    found = {md.relative_to(ROOT).as_posix(): cells for md in sources() if (cells := offending_cells(md))}
    assert sources(), "no notebook source found"
    for rel, cells in sorted(found.items()):
        print(f"waiting: {rel}: {len(cells)} cell(s)")
    problems = check(found, reader_waiting.MOSTLY_BOOKKEEPING_CELLS)
    assert not problems, "\n".join(problems)


def test_every_waiting_source_exists():
    for rel in reader_waiting.MOSTLY_BOOKKEEPING_CELLS:
        assert (ROOT / rel).exists(), f"tests/reader_waiting.py lists {rel}, which does not exist"


# --- the rule catches what it claims to -------------------------------------------------------

def test_bookkeeping_share_counts_statements_not_words():
    code = ('x = measure()                 # the idea\n'
            'glue("x", x)\n'
            '_ = claim("x_fast", x < 1,\n'
            '          "fast", "slow")\n'
            'for k, v in parts.items():\n'
            '    glue(f"part_{k}", v)\n'
            'plt.show()\n'
            'print(glue)   # a name, not a call\n')
    assert rules.bookkeeping_share(code) == (5, 8)   # glue, the claim (2), the loop (2)
    assert rules.bookkeeping_share("tables.show(rows, cols)\nfig.show()\n") == (1, 2)
    assert rules.bookkeeping_share("%timeit f()\n") == (0, 1)
    assert rules.bookkeeping_share("def f(:\n") == (0, 1)


def test_a_source_with_a_visible_bookkeeping_cell_fails(tmp_path):
    """The proof: a page whose visible cell is mostly glue breaks the rule; hidden, it keeps it."""
    glue_cell = 'glue("a", 1)\nglue("b", 2)\nexpect("c", True, "holds")\nprint("done")\n'
    md = tmp_path / "page.md"
    md.write_text(HEADER + "\n# A page\n\n```{code-cell} ipython3\nx = 1\n```\n\n"
                  "```{code-cell} ipython3\n" + glue_cell + "```\n")
    found = {"page.md": offending_cells(md)}
    assert len(found["page.md"]) == 1 and "3 of its 4 lines" in found["page.md"][0]
    assert check(found, {}) and not check(found, {"page.md": 1})
    assert "lower its number" in check({}, {"page.md": 1})[0]
    md.write_text(HEADER + "\n# A page\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
                  + glue_cell + "```\n")
    assert offending_cells(md) == []


@pytest.mark.parametrize("tag", rules.HIDDEN_TAGS)
def test_hidden_cells_are_out_of_the_rule(tag):
    assert rules.mostly_bookkeeping_cells([('glue("a", 1)', [tag])]) == []
    assert rules.mostly_bookkeeping_cells([('glue("a", 1)', [])])


# --- a claim's spread in a {measured} note, not in the running prose (reader review R4) -------

def _notebook_spread_hits(ipynb: Path) -> list[str]:
    import json

    from perflab.record.provenance import read_glued

    cells = json.loads(ipynb.read_text())["cells"]
    markdown = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                for c in cells if c["cell_type"] == "markdown"]
    return rules.spread_in_notebook_prose(markdown, read_glued(ipynb))


def test_no_spread_in_running_prose():
    """The committed notebooks as the book shows them (glued values pasted into the prose): no
    "inter-quartile range over 8 rounds" and no old verdict clause outside a {measured} note,
    beyond what tests/reader_waiting.py (SPREAD_IN_PROSE) still allows."""
    notebooks = [md.with_suffix(".ipynb") for md in sources() if md.with_suffix(".ipynb").exists()]
    assert notebooks, "no executed notebook found"
    found = {nb.relative_to(ROOT).as_posix(): hits for nb in notebooks
             if (hits := _notebook_spread_hits(nb))}
    problems = []
    for rel, hits in sorted(found.items()):
        allowed = reader_waiting.SPREAD_IN_PROSE.get(rel, 0)
        if len(hits) > allowed:
            problems.append(f"{rel}: {len(hits)} spreads or old verdict clauses in running prose "
                            f"(allowed {allowed}): quote the claim's short phrase and put "
                            "{glue:text}`<claim>_spread` in a {measured} note:\n    "
                            + "\n    ".join(hits))
    checked = {nb.relative_to(ROOT).as_posix() for nb in notebooks}
    for rel, allowed in sorted(reader_waiting.SPREAD_IN_PROSE.items()):
        if rel not in checked:      # a page split into sections or left the contents
            continue
        now = len(found.get(rel, []))
        if now < allowed:
            problems.append(f"{rel}: now {now}: lower its number in tests/reader_waiting.py "
                            f"SPREAD_IN_PROSE to {now}" + (" (remove the entry)" if not now else ""))
    assert not problems, "\n".join(problems)


def test_spread_rule_catches_the_old_verdict_and_passes_the_new():
    old = ("The naive rung took 3 ms, {glue:text}`naive`. Five rungs: {glue:text}`all`.\n\n"
           ":::{measured}\nThe rungs: {glue:text}`naive_spread`.\n:::\n")
    before = {"naive": "within 25 % of the prediction (1.02x it; 0.99–1.12x, inter-quartile "
                       "range over 8 rounds)",
              "all": "1.61x the prediction, outside its 25 % band",
              "naive_spread": "1.02x the prediction (0.99–1.12x, inter-quartile range over 8 "
                              "rounds), against its band of 0.75–1.25x (±25 %)"}
    assert len(rules.spread_in_notebook_prose([old], before)) == 3
    after = {**before, "naive": "as predicted (1.02x)", "all": "outside the 25 % band (1.61x)"}
    assert rules.spread_in_notebook_prose([old], after) == []
    # the note's spread counts when the same sentence stands in the prose
    assert len(rules.spread_in_notebook_prose([old.replace("`naive`", "`naive_spread`")],
                                              after)) == 1
    html = ('<article class="bd-article"><p>It took 3 ms, <span class="pasted-text">as predicted '
            '(1.02x)</span>.</p><details class="measured-note"><summary>How this was measured'
            '</summary><div class="measured-body"><p>1.02x the prediction (0.99–1.12x, '
            'inter-quartile range over 8 rounds)</p></div></details></article>')
    assert rules.spread_in_prose(html) == []
    assert len(rules.spread_in_prose(html.replace("<details", "<div").replace(
        "</details>", "</div>").replace("measured-note", "x"))) == 1
