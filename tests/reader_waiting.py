"""Pages of the built book that break a reader's rule today, waiting for their authors.

``tests/test_reader.py`` checks every built page against each rule below. A page that breaks a
rule and is not listed here fails the test; so does a listed page that no longer breaks it
(remove it from the list in the commit that fixes it). The lists only shrink: when they are all
empty, every rule is strict. Chapter and lab authors (issues 29-31) fix their pages by the
conventions of CONTRIBUTING.md ("Figures", "Bookkeeping cells", "Numbers") and the next
reference run; the test's message names each page's offending figures or numbers.

Keys are built pages (``book/NN_topic.html``, ``labs/NN_topic.html``), except
:data:`MOSTLY_BOOKKEEPING_CELLS`, whose keys are sources (``book/NN_topic.md``).
"""

# A figure output that is not a numbered figure (myst-nb's cell metadata ``mystnb.figure``)
# whose provenance line names the device that measured it (``perflab.measured_on``), or a
# numbered figure that no prose refers to ({numref}).
# (Chapter 8 and lab 8 left this list with their second edition, issue 39.)
FIGURES_WITHOUT_NUMBER_OR_DEVICE: set[str] = set()

# The same figure shown twice on a page (``finish(fig)`` as a cell's last line before
# perflab.plotting displayed figures itself).
FIGURES_SHOWN_TWICE: set[str] = set()

# Numbers a person would not write (``tests/test_reader.py::NUMBER_SHAPES``), on every page of
# the table of contents. Empty: lab 10's "losses agree within 1.2e-05." left with the run of
# 5 December (gpu-2026-12-05-fca871c), which prints it through perflab.record.numbers.fmt_small.
NUMBER_SHAPES: set[str] = set()

# ---------------------------------------------------------------------------------------------
# A textbook, not a lab notebook (issue 43; tests/textbook_rules.py says what each rule reads).
# Chapter authors empty these lists in their third editions: hide bookkeeping cells
# (CONTRIBUTING.md, "Bookkeeping cells"), move telemetry into a {measured} note ("Numbers"),
# split a long chapter into section pages. A page split into sections leaves the list and its
# sections must keep every rule from the start.
# ---------------------------------------------------------------------------------------------

# A visible code cell (not remove-cell/remove-input, not folded by hide-input) that calls glue,
# claim, expect, compare or a table helper.
VISIBLE_BOOKKEEPING: set[str] = set()

# The sampler's sentence ("measured over 0.80 s on NVIDIA H200: SM clock median ...") in the
# running prose, outside a {measured} note (book/roofline_explorer.md shows the idiom).
TELEMETRY_IN_PROSE: set[str] = set()

# Over 6,000 words of prose or 500 lines of visible code on one page: split into section pages.
# (Chapter 7 left on 6 December: its imports cell folds, 499 lines; splitting chapters 7, 8 and
# 10 into section pages waits for a GPU run of the split pages, issue 43.)
TOO_LONG: set[str] = set()

# An output that prints a Markdown table as text (the table is then shown twice, or as pipes).
TABLES_PRINTED_AS_TEXT: set[str] = set()

# A code block or output wider than the page at 1,280 px (a table may scroll in its own box).
WIDER_THAN_THE_PAGE: set[str] = set()

# Sources (.md) with visible code cells whose lines are mostly bookkeeping:
# {source: how many such cells} (tests/test_bookkeeping_cells.py; the numbers only go down).
MOSTLY_BOOKKEEPING_CELLS: dict[str, int] = {}

# Executed notebooks (run f96650c) whose running prose states
# a claim's spread and rounds or the old machine-written verdict ("within 25 % of the prediction (1.02x it; 0.99–1.12x, inter-quartile
# range over 8 rounds)", reader review R4): {notebook: how many}. perflab.record.claims.compare
# now glues a short phrase ("as predicted (1.02x)") and its spread under <name>_spread for a
# {measured} note, so the next GPU run lowers these numbers; the sentences that pages write
# themselves (chapter 10's savings) wait for their authors. The numbers only go down
# (tests/test_bookkeeping_cells.py::test_no_spread_in_running_prose).
SPREAD_IN_PROSE: dict[str, int] = {
    # run h (892d1aa) took out the six that run f brought in; chapter 10's CUDA-graphs
    # premise sentence (the idle fall "-56.5 µs (-91.2 µs to -21.8 µs, min–max over 2
    # rounds)") is written by the page itself and waits for its author
    "book/10_gpt2_case_study.ipynb": 1,
}


# Sources (.md) with visible code cells that open or read the sampler (Telemetry(...),
# tel.window(), tel.summary(), .sentence()) or finish a figure (perflab.record.plotting.finish)
# outside a section that teaches the clock (tests/textbook_rules.py CLOCK_SECTIONS):
# {source: how many such cells} (tests/test_bookkeeping_cells.py::
# test_visible_cells_call_no_telemetry; reader review of 7 December; the numbers only go down).
# Chapters 2.1, 7.1 and 9.2 left it with the change that made the rule (5.1 folds its figure).
VISIBLE_TELEMETRY_CELLS: dict[str, int] = {
}
