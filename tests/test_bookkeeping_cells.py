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

import re
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


def ratchet(found: dict[str, list[str]], waiting: dict[str, int], name: str, what: str,
            fix: str, checked: set[str] | None = None) -> list[str]:
    """What is wrong against the shrink-only list ``waiting`` ({page: allowed number}), named
    ``name`` in tests/reader_waiting.py: a page with more of ``what`` than allowed (``fix`` says
    how to mend it), or fewer (its number must come down). Pages outside ``checked`` (when
    given: a page split into sections or gone from the contents) are not held to their entry."""
    problems = []
    for rel, hits in sorted(found.items()):
        allowed = waiting.get(rel, 0)
        if len(hits) > allowed:
            problems.append(f"{rel}: {len(hits)} {what} (allowed {allowed}); {fix}:\n    "
                            + "\n    ".join(hits))
    for rel, allowed in sorted(waiting.items()):
        if checked is not None and rel not in checked:
            continue
        now = len(found.get(rel, []))
        if now < allowed:
            problems.append(f"{rel}: now {now}: lower its number in tests/reader_waiting.py "
                            f"{name} to {now}" + (" (remove the entry)" if now == 0 else ""))
    return problems


def check(found: dict[str, list[str]], waiting: dict[str, int]) -> list[str]:
    """What is wrong against the ratchet ``waiting`` ({source: allowed number of cells})."""
    return ratchet(found, waiting, "MOSTLY_BOOKKEEPING_CELLS",
                   "visible code cell(s) mostly bookkeeping",
                   "hide them (tags: [remove-cell] or [remove-input])")


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


# --- telemetry and figure-finishing out of sight (reader review, 7 December) -----------------

_H2 = re.compile(r"^##\s+(.+?)\s*#*\s*$", re.M)


def cells_with_sections(md: Path) -> list[tuple[str, list[str], str]]:
    """A source's code cells as ``(source, tags, the text of the last ## heading above it)``."""
    section, cells = "", []
    for c in jupytext.read(md).cells:
        if c.cell_type == "markdown":
            for m in _H2.finditer(c.source):
                section = m.group(1)
        elif c.cell_type == "code":
            cells.append((c.source, c.get("metadata", {}).get("tags", []), section))
    return cells


def telemetry_cells(md: Path, rel: str) -> list[str]:
    allowed = {sec for src, sec in rules.CLOCK_SECTIONS if src == rel}
    return rules.visible_telemetry_cells(cells_with_sections(md), allowed)


def test_visible_cells_call_no_telemetry():
    """No visible code cell opens or reads the sampler or finishes a figure, outside the
    sections of ``textbook_rules.CLOCK_SECTIONS``, beyond what tests/reader_waiting.py
    (VISIBLE_TELEMETRY_CELLS) still allows."""
    found = {rel: cells for md in sources()
             if (cells := telemetry_cells(md, rel := md.relative_to(ROOT).as_posix()))}
    problems = ratchet(found, reader_waiting.VISIBLE_TELEMETRY_CELLS, "VISIBLE_TELEMETRY_CELLS",
                       "visible code cell(s) call telemetry or finish a figure",
                       "start the sampler in a hidden cell before the timed work (tel = "
                       "Telemetry().start()) and stop it in one after; make a plotting-only "
                       "figure cell remove-input")
    assert not problems, "\n".join(problems)


def test_clock_sections_exist():
    for rel, section in rules.CLOCK_SECTIONS:
        sections = {sec for *_, sec in cells_with_sections(ROOT / rel)}
        assert section in sections, f"CLOCK_SECTIONS names {section!r}, not a ## section of {rel}"


def test_the_telemetry_rule_counts_the_old_cells_and_passes_the_new(tmp_path):
    """The proof: chapter 2's L2 sweep as it stood (its sampler and figure in visible cells)
    breaks the rule; as it stands now (the sampler started and stopped in hidden cells, the
    figure cell remove-input) it keeps it; the burst section's clock stays visible, allowed."""
    old = ("## The L2\n\n```{code-cell} ipython3\nwith Telemetry(work=\"memory\") as tel:\n"
           "    times = replay_sweep(sizes, dev)\nl2_tel = tel.summary()\n```\n\n"
           "```{code-cell} ipython3\nfig = caches.plot_working_set(curves)\n"
           "perflab.record.plotting.finish(fig)\n```\n\n"
           "```{code-cell} ipython3\nwith Telemetry() as tel, tel.window():\n"
           "    ran = kernels_by_call(calls)\n```\n")
    burst = ("\n## Burst and sustained: clocks and the power cap\n\n```{code-cell} ipython3\n"
             "print(bst.burst.sentence())\n```\n")
    new = ("## The L2\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
           "tel = Telemetry(work=\"memory\").start()\n```\n\n```{code-cell} ipython3\n"
           "times = replay_sweep(sizes, dev)\n```\n\n```{code-cell} ipython3\n"
           ":tags: [remove-cell]\n\nl2_tel = tel.stop().summary()\n```\n\n"
           "```{code-cell} ipython3\n---\ntags: [remove-input]\n---\n"
           "perflab.record.plotting.finish(caches.plot_working_set(curves))\n```\n")
    md = tmp_path / "page.md"
    md.write_text(HEADER + "\n# A page\n\n" + old + burst)
    got = rules.visible_telemetry_cells(cells_with_sections(md),
                                        {"Burst and sustained: clocks and the power cap"})
    assert len(got) == 3 and "Telemetry, summary" in got[0] and "finish" in got[1], got
    assert "Telemetry, window" in got[2]
    assert len(rules.visible_telemetry_cells(cells_with_sections(md))) == 4   # not allowed
    md.write_text(HEADER + "\n# A page\n\n" + new + burst)
    assert rules.visible_telemetry_cells(cells_with_sections(md), {
        "Burst and sustained: clocks and the power cap"}) == []
    assert rules.telemetry_calls("plt.show()\nfig.show()\nx.window_size\nprint(finish)\n") == []


def test_chapter_2s_old_source_breaks_the_telemetry_rule(tmp_path):
    """The rule fails on 2.1 as it stood before this change (main at 752cc28), when git has it."""
    import subprocess

    try:
        old = subprocess.run(["git", "show", "752cc28:book/02_hardware_gpu.md"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git history not available")
    md = tmp_path / "02_hardware_gpu.md"
    md.write_text(old)
    got = telemetry_cells(md, "book/02_hardware_gpu.md")
    assert len(got) >= 5, got     # the L2 sweep, its figure, tensor cores, elementwise, waves


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
    checked = {nb.relative_to(ROOT).as_posix() for nb in notebooks}
    problems = ratchet(found, reader_waiting.SPREAD_IN_PROSE, "SPREAD_IN_PROSE",
                       "spreads or old verdict clauses in running prose",
                       "quote the claim's short phrase and put {glue:text}`<claim>_spread` in a "
                       "{measured} note", checked=checked)
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
