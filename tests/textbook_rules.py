"""The book as a textbook, not a lab notebook (issue 43): the rules, as functions of a built page.

Each function reads one page's HTML (the DOM Chromium rendered, or the file Sphinx wrote) and
returns what on it breaks a rule, in words a chapter's author can act on; an empty list means
the page keeps the rule. ``tests/test_reader.py`` applies them to every page of the built book
(with the ratchet of ``tests/reader_waiting.py``) and proves each on a page that breaks it;
``tests/test_bookkeeping_cells.py`` applies :func:`bookkeeping_share` and
:func:`visible_telemetry_cells` to the sources.

* :func:`visible_bookkeeping`: a code cell a reader sees (not ``remove-input``/``remove-cell``,
  not folded by ``hide-input``) that calls ``glue``, ``claim``, ``expect``, ``compare`` or a
  table helper (CONTRIBUTING.md, "Bookkeeping cells");
* :func:`telemetry_in_prose`: the sampler's machine-written sentence ("measured over 0.80 s on
  NVIDIA H200: SM clock ...") in running prose, outside a ``{measured}`` note, a margin note,
  a footnote or a cell's output;
* :func:`wide_blocks` (from the layout probe's report): at 1,280 px, any block whose content is
  wider than its box (``scrollWidth > clientWidth``): one that scrolls sideways, a table in its
  own scrolling box included (the box and its hint are for phones), and one whose content runs
  over its edge (a cell's long word into its neighbour);
* :func:`page_length`: over :data:`MAX_WORDS` words of prose or :data:`MAX_CODE_LINES` lines of
  visible code (split the chapter into section pages);
* :func:`tables_printed_as_source`: a Markdown table printed as text in an output (the table
  is then on the page twice, or once as pipes);
* :func:`spread_in_prose` (a built page) and :func:`spread_in_notebook_prose` (an executed
  notebook's Markdown with its glued values pasted): a measurement's spread and rounds
  ("0.99–1.12x, inter-quartile range over 8 rounds") or a claim's old machine-written verdict
  ("within 25 % of the prediction (1.02x it; ...)") in running prose, where the claim's short
  phrase belongs ("as predicted (1.02x)"), the spread going into a ``{measured}`` note.
"""

from __future__ import annotations

import ast
import re
from html.parser import HTMLParser

MAX_WORDS = 6000          # prose words on one page (d2l's sections are well under this)
MAX_CODE_LINES = 500      # lines of code a reader sees on one page (hide-input folds count out)

# The calls that are bookkeeping, not the technique: gluing a value for the prose, a claim or an
# expectation about a measurement, a table assembled from results. ``show`` is perflab's table
# helper (perflab.record.tables.show), never plt.show or fig.show. A lab's closing
# ``overlay_table`` is not bookkeeping: that table is what the student came for.
BOOKKEEPING = ("glue", "glue_many", "glue_table", "glue_text", "claim", "expect", "compare", "show")
_CALL = re.compile(r"(?<![\w.])(" + "|".join(BOOKKEEPING) + r")\s*\("
                   r"|\b(?:tables|claims|provenance|record)\.(" + "|".join(BOOKKEEPING) + r")\s*\(")

# The sentence perflab.core.sampler.Summary.sentence() writes ("measured over 0.80 s on NVIDIA
# H200: SM clock median ..."), and the same for the host ("... on cpu; the CPU clock cannot ...").
# "measured over 0.80 s on", and the sampler's wording since 5 December: "measured over the
# 0.26 s timed window on", "measured over 3 timed windows, 1.20 s in all on"
TELEMETRY = re.compile(r"measured over (?:the )?(?:\d+ timed windows, )?[\d.,]+\s*"
                       r"(?:[µun]s|ms|s|min)(?: timed window| in all)? on ")

# A spread's rounds in words (perflab.core.rounds.Spread.kind) and the verdict clauses that
# perflab.record.claims.compare glued before 6 December (reader review R4): in a {measured} note
# or a cell's output they are fine; in running prose they are a lab notebook's telemetry.
SPREAD_WORDS = re.compile(r"(?:inter-quartile range|min[–-]max) over \d+ rounds?"
                          r"|within \d+ % of the prediction \("
                          r"|the prediction, outside its \d+ % band"
                          r"|undecided against its \d+ % band")

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _classes(attrs) -> set[str]:
    return set((dict(attrs).get("class") or "").split())


class _Page(HTMLParser):
    """One pass over a page: the article's prose (outside code, outputs and notes), the code of
    each cell input (and whether a reader sees it unfolded), and the text of each cell output."""

    # blocks whose text is not running prose: code, outputs, notes and the page's furniture
    ASIDE = {"cell_input", "cell_output", "measured-note", "margin", "sidebar", "footnote",
             "footnote-list", "provenance-footer", "provenance-badge"}
    NOT_WORDS = ASIDE | {"headerlink", "math", "toctree-wrapper", "bibliography", "citation"}
    ASIDE_TAGS = {"aside", "details", "script", "style", "nav"}
    NOT_WORDS_TAGS = ASIDE_TAGS | {"math", "mjx-container", "svg", "pre", "code", "figcaption", "caption"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[dict] = []
        self.prose: list[str] = []           # words of running prose (no code, tables' code, maths)
        self.telemetry_text: list[str] = []  # text outside code, outputs and notes (prose, tables)
        self.inputs: list[dict] = []         # {"code": [str], "visible": bool}
        self.outputs: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        cls = _classes(attrs)
        up = self.stack[-1] if self.stack else {"article": False, "folded": False, "input": None,
                                                  "output": None, "aside": False, "words": True}
        frame = {"tag": tag, "article": up["article"] or tag == "article" or "bd-article" in cls,
                 "folded": up["folded"] or tag == "details", "input": up["input"], "output": up["output"],
                 "aside": up["aside"] or tag in self.ASIDE_TAGS or bool(cls & self.ASIDE),
                 "words": up["words"] and tag not in self.NOT_WORDS_TAGS and not (cls & self.NOT_WORDS)}
        if "cell_input" in cls and frame["article"]:
            frame["input"] = {"code": [], "visible": not up["folded"]}
            self.inputs.append(frame["input"])
        if "cell_output" in cls and frame["article"]:
            frame["output"] = []
            self.outputs.append(frame["output"])
        self.stack.append(frame)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if not self.stack or not self.stack[-1]["article"]:
            return
        top = self.stack[-1]
        if top["input"] is not None:
            if any(f["tag"] == "pre" for f in self.stack):   # not a copy button's words
                top["input"]["code"].append(data)
        elif top["output"] is not None:
            top["output"].append(data)
        if not top["aside"]:
            self.telemetry_text.append(data)
        if top["words"]:
            self.prose.append(data)


def parse(page_html: str) -> _Page:
    page = _Page()
    page.feed(page_html)
    page.close()
    return page


def _code(cell: dict) -> str:
    return "".join(cell["code"]).strip("\n")


def bookkeeping_calls(code: str) -> list[str]:
    """The bookkeeping calls in a piece of code (``["glue", "glue", "claim"]``), in order."""
    return [m.group(1) or m.group(2) for m in _CALL.finditer(code)]


def visible_bookkeeping(page_html: str) -> list[str]:
    """One entry per visible code cell that calls bookkeeping: ``"cell 7: glue x3, claim"``."""
    out = []
    for k, cell in enumerate(parse(page_html).inputs, start=1):
        if not cell["visible"]:
            continue
        calls = bookkeeping_calls(_code(cell))
        if calls:
            counts = {name: calls.count(name) for name in dict.fromkeys(calls)}
            words = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counts.items())
            first = _code(cell).splitlines()[0][:50] if _code(cell) else ""
            out.append(f"code cell {k} ({first!r}...): {words}")
    return out


def telemetry_in_prose(page_html: str) -> list[str]:
    """Each telemetry sentence in the running prose (or a prose table), with its context."""
    text = " ".join(" ".join(parse(page_html).telemetry_text).split())
    return [f"...{text[max(0, m.start() - 60): m.end() + 40]}..." for m in TELEMETRY.finditer(text)]


def page_length(page_html: str) -> dict:
    """``{"words": prose words, "code_lines": lines of visible code}`` of a page."""
    page = parse(page_html)
    words = len(re.findall(r"[^\W_]+(?:['’-][^\W_]+)*", " ".join(page.prose)))
    lines = sum(len([ln for ln in _code(c).splitlines() if ln.strip()]) for c in page.inputs if c["visible"])
    return {"words": words, "code_lines": lines}


def too_long(page_html: str) -> list[str]:
    """Why a page is over the length rule (empty when it is not)."""
    n = page_length(page_html)
    out = []
    if n["words"] > MAX_WORDS:
        out.append(f"{n['words']:,} words of prose (at most {MAX_WORDS:,}: split it into section pages)")
    if n["code_lines"] > MAX_CODE_LINES:
        out.append(f"{n['code_lines']:,} lines of visible code (at most {MAX_CODE_LINES}: hide the "
                   "bookkeeping, split the page)")
    return out


_MD_RULE = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$", re.M)


def tables_printed_as_source(page_html: str) -> list[str]:
    """Outputs that print a Markdown table as text (its ``|---|`` rule row)."""
    out = []
    for k, text in enumerate(parse(page_html).outputs, start=1):
        joined = "".join(text)
        m = _MD_RULE.search(joined)
        if m:
            head = joined[:m.start()].strip().splitlines()[-1:] or [""]
            out.append(f"output {k} prints a Markdown table as text: {head[0][:70]!r}")
    return out


TABLE_BOXES = ("reader-scroll-box", "pst-scrollable-table-container")


def wide_blocks(report: dict | None) -> list[str]:
    """Blocks of the layout probe's report (tests/layout_probe.js, a 1,280 px window) whose
    content is wider than their box (``scrollWidth > clientWidth``): code or an output that
    scrolls sideways (it should wrap, fit or be cut to the page width: ``_ext/static/reader.js``
    does it for outputs), a table that scrolls in its own box (fewer or wrapped columns, or split
    it in two: at this width every table fits), and content that runs over its box's edge
    (``spills``: a long word in a table cell, a fixed-width box overrun)."""
    if report is None:
        return ["the layout probe gave no report"]
    out = []
    for item in report.get("scrolling", []) + report.get("no_hint", []):
        what = "a table that scrolls sideways" if any(c in item["element"] for c in TABLE_BOXES) else "scrolls"
        out.append(f"{item['element']} ({what}) is {item['hidden_px']} px wider than the page: "
                   f"{item['text'][:60]!r}")
    for item in report.get("spills", []):
        out.append(f"{item['element']}'s content runs {item['hidden_px']} px over its edge: {item['text'][:60]!r}")
    return out


# ---------------------------------------------------------------------------------------------
# The sources: a visible code cell whose lines are mostly bookkeeping
# ---------------------------------------------------------------------------------------------

def _is_bookkeeping_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name not in BOOKKEEPING:
        return False
    if name == "show" and isinstance(f, ast.Attribute):      # plt.show(), fig.show()
        return isinstance(f.value, ast.Name) and f.value.id in ("tables", "record")
    return True


def _bookkeeping_statement(stmt: ast.stmt) -> bool:
    """A statement that only does bookkeeping: a bookkeeping call (``_ = claim(...)`` too), or a
    loop/branch whose body is nothing but such statements."""
    if isinstance(stmt, ast.Expr):
        return _is_bookkeeping_call(stmt.value)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        return stmt.value is not None and _is_bookkeeping_call(stmt.value)
    if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With)):
        body = list(stmt.body) + list(getattr(stmt, "orelse", []))
        return bool(body) and all(_bookkeeping_statement(s) for s in body)
    return False


def bookkeeping_share(code: str) -> tuple[int, int]:
    """``(bookkeeping lines, code lines)`` of a code cell: lines (not blank, not comments) of
    its top-level statements that only do bookkeeping (:func:`_bookkeeping_statement`), and all
    its lines. IPython magics and code that does not parse count as code, never bookkeeping."""
    lines = code.splitlines()
    counted = {i for i, ln in enumerate(lines, start=1) if ln.strip() and not ln.strip().startswith("#")}
    try:
        tree = ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines))
    except SyntaxError:
        return 0, len(counted)
    kept = set()
    for stmt in tree.body:
        if _bookkeeping_statement(stmt):
            kept |= set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return len(kept & counted), len(counted)


HIDDEN_TAGS = ("remove-cell", "remove-input", "hide-input", "hide-cell")


def mostly_bookkeeping_cells(cells: list[tuple[str, list[str]]]) -> list[str]:
    """Of a page's code cells ``(source, tags)``, each visible one (none of
    :data:`HIDDEN_TAGS`) whose lines are more than half bookkeeping, as ``"cell N: b of n
    lines"``."""
    out = []
    for k, (source, tags) in enumerate(cells, start=1):
        if any(t in HIDDEN_TAGS for t in tags):
            continue
        kept, total = bookkeeping_share(source)
        if total and kept * 2 > total:
            first = source.strip().splitlines()[0][:50]
            out.append(f"code cell {k} ({first!r}...): {kept} of its {total} lines are bookkeeping")
    return out


# ---------------------------------------------------------------------------------------------
# The sources: telemetry and figure-finishing in a visible code cell (reader review, 7 December)
# ---------------------------------------------------------------------------------------------

# Calls that record how a measurement ran or finish a figure, not the technique: opening the
# sampler (``Telemetry(...)``, ``tel.window()``), reading it (``tel.summary()``,
# ``summary.sentence()``) and ``perflab.record.plotting.finish(fig)``. A hidden cell before the
# timed work starts the sampler (``tel = Telemetry().start()``) and one after stops it; a figure
# cell whose code is only plotting is ``remove-input``.
TELEMETRY_NAMES = ("Telemetry", "finish")           # called by name (or as module.attribute)
TELEMETRY_METHODS = ("summary", "window", "sentence")  # called on a sampler or its summary

# Sections that teach reading the clock, where the sampler is the technique: (source, the
# text of the section's ``##`` heading). Their visible cells may call the names above.
CLOCK_SECTIONS = {
    ("book/02_hardware_gpu.md", "Burst and sustained: clocks and the power cap"),
}


def _telemetry_call(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    if isinstance(f, ast.Name) and f.id in TELEMETRY_NAMES:
        return f.id
    if isinstance(f, ast.Attribute):
        if f.attr in TELEMETRY_METHODS:
            return f.attr
        if f.attr == "Telemetry":
            return f.attr
        if f.attr == "finish" and isinstance(f.value, (ast.Name, ast.Attribute)) and \
                (f.value.id if isinstance(f.value, ast.Name) else f.value.attr) == "plotting":
            return "finish"
    return None


def telemetry_calls(code: str) -> list[str]:
    """The telemetry and figure-finishing calls in a piece of code (``["Telemetry",
    "summary", "sentence"]``), in the order of the source. IPython magics are skipped; code
    that does not parse has none."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in code.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    found = [(n.lineno, n.col_offset, name) for n in ast.walk(tree)
             if (name := _telemetry_call(n)) is not None]
    return [name for *_, name in sorted(found)]


def visible_telemetry_cells(cells: list[tuple[str, list[str], str]],
                            allowed_sections: set[str] | frozenset = frozenset()) -> list[str]:
    """Of a page's code cells ``(source, tags, section heading)``, each visible one (none of
    :data:`HIDDEN_TAGS`) outside ``allowed_sections`` that calls telemetry or finishes a figure
    (:func:`telemetry_calls`), as ``"code cell N (first line...): Telemetry, summary x2"``."""
    out = []
    for k, (source, tags, section) in enumerate(cells, start=1):
        if any(t in HIDDEN_TAGS for t in tags) or section in allowed_sections:
            continue
        calls = telemetry_calls(source)
        if calls:
            counts = {name: calls.count(name) for name in dict.fromkeys(calls)}
            words = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counts.items())
            first = source.strip().splitlines()[0][:50]
            out.append(f"code cell {k} ({first!r}...): {words}")
    return out


# ---------------------------------------------------------------------------------------------
# A claim's spread out of the running prose (reader review R4)
# ---------------------------------------------------------------------------------------------

def _spread_hits(text: str) -> list[str]:
    text = " ".join(text.split())
    return [f"...{text[max(0, m.start() - 60): m.end() + 20]}..." for m in SPREAD_WORDS.finditer(text)]


def spread_in_prose(page_html: str) -> list[str]:
    """Each spread or old verdict clause (:data:`SPREAD_WORDS`) in a built page's running prose
    (or a prose table): not in a ``{measured}`` note, a margin, a footnote or an output."""
    return _spread_hits(" ".join(parse(page_html).telemetry_text))


_GLUE_ROLE = re.compile(r"\{glue(?::text|:md|:)?\}`([^`:]+)(?::[^`]*)?`")
# blocks whose text is not running prose: a {measured} note, a margin or a sidebar (colon or
# backtick fences, any length), and footnote definitions
_ASIDE_BLOCK = re.compile(r"^(:{3,}|`{3,})\{(?:measured|margin|sidebar)\}.*?^\1\s*$", re.M | re.S)
_FOOTNOTE = re.compile(r"^\[\^[^\]]+\]:.*$", re.M)


def notebook_prose(markdown: list[str], glued: dict) -> str:
    """The running prose of a notebook's Markdown cells ``markdown`` as the book shows it: each
    glued role replaced by its value from ``glued`` (``read_glued``), notes and footnotes left
    out."""
    text = "\n\n".join(markdown)
    text = _FOOTNOTE.sub("", _ASIDE_BLOCK.sub("", text))
    return _GLUE_ROLE.sub(lambda m: str(glued.get(m.group(1), "")), text)


def spread_in_notebook_prose(markdown: list[str], glued: dict) -> list[str]:
    """:func:`spread_in_prose` for an executed notebook (its Markdown cells and glued values):
    no build needed."""
    return _spread_hits(notebook_prose(markdown, glued))
