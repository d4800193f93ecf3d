"""Pages of the built book that break a reader's rule today, waiting for their authors.

``tests/test_reader.py`` checks every built page against each rule below. A page that breaks a
rule and is not listed here fails the test; so does a listed page that no longer breaks it
(remove it from the list in the commit that fixes it). The lists only shrink: when they are all
empty, every rule is strict. Chapter and lab authors (issues 29-31) fix their pages by the
conventions of CONTRIBUTING.md ("Figures", "Bookkeeping cells", "Numbers") and the next
reference run; the test's message names each page's offending figures or numbers.

Keys are built pages (``book/NN_topic.html``, ``labs/NN_topic.html``).
"""

# A figure output that is not a numbered figure (myst-nb's cell metadata ``mystnb.figure``)
# whose provenance line names the device that measured it (``perflab.measured_on``), or a
# numbered figure that no prose refers to ({numref}).
FIGURES_WITHOUT_NUMBER_OR_DEVICE: set[str] = {
    "book/08_distributed_training.html",
    "labs/08_distributed.html",
}

# The same figure shown twice on a page (``finish(fig)`` as a cell's last line before
# perflab.plotting displayed figures itself).
FIGURES_SHOWN_TWICE: set[str] = set()

# Numbers a person would not write (``tests/test_reader.py::NUMBER_SHAPES``).
NUMBER_SHAPES: set[str] = {
    "book/08_distributed_training.html",
    "labs/08_distributed.html",
}
