"""Sphinx extension: the built book as readers use it (what a page offers beyond its content).

* **A runnable download of the course**, built with the book: one zip
  (:data:`BUNDLE_NAME`, at the root of the HTML output) holding the chapter and lab sources,
  the chapters' reference notebooks and the files they read, ``perflab``, ``pyproject.toml``,
  ``requirements.txt``, ``scripts/execute.py`` and a short README on running a page on a laptop
  CPU or a GPU box (``_ext/bundle/README.md``). Every page's download menu offers it beside the
  ``.ipynb``, and the role ``{course-download}`text``` links it from prose (the front page).
  The zip is deterministic (fixed timestamps, sorted names), so two builds of one commit give the
  same bytes. In the student edition (``reader_edition = "student"``), the labs in the zip are
  the student versions (``reader_student_sources``, written by ``scripts/make_student.py --book``).
* **Search that knows the field's spellings**: a page that writes "all-reduce" is found by
  "allreduce", "AllReduce" and "all reduce" too (:data:`SYNONYMS`). The spellings go into the
  page's ``<meta name="keywords">``, which Sphinx's search index reads
  (``sphinx.search.IndexBuilder``); nothing is added to what a reader sees.
* **One search box**: the theme's top bar repeated the sidebar's search field; it is removed.
* **Glued numbers as a person writes them**: ``{glue:text}`key:.3g``` formats through
  :func:`perflab.record.numbers.format_spec` instead of Python's ``format``, so a page's
  ``.3g`` of 1,320 reads "1,320", never "1.32e+03" (:func:`install_number_format`).
* **Wide blocks say that they scroll**: a table, code cell or output wider than the text column
  scrolls inside its own box, and ``static/reader.js`` puts a visible hint above it ("scroll
  sideways") and a shadow on its right edge; ``tests/test_reader.py`` measures every page in
  Chromium and fails on a block that sticks out of the column or scrolls without the hint.
* **Section pages numbered as the prose names them**: a chapter's landing page with section
  pages leaves its own headings unnumbered, so its section pages are N.1, N.2 ... (chapter 6's
  "section 6.1" is ``book/06_1_host_and_bus``), not numbered after the landing page's headings
  (:func:`number_section_pages`).
* **The whole book as a PDF**: ``make pdf`` prints the single-page build with headless
  Chromium (``scripts/book_pdf.py``) into ``_build/pdf/``; when that file exists, the HTML build
  copies it to its root (:data:`PDF_NAME`), the download menus offer it and the role
  ``{book-pdf}`text``` links it (else the role prints how to build it).

Config values: ``reader_edition`` (``"full"`` or ``"student"``), ``reader_student_sources``
(a folder of student lab sources ``NN_topic.md``, for the student edition's zip),
``reader_pdf`` (the PDF to publish, default ``_build/pdf/`` + :data:`PDF_NAME`).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import zipfile
from ast import literal_eval
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # perflab, without requiring an install
    sys.path.insert(0, str(ROOT))

from perflab.record.numbers import format_spec  # noqa: E402
BUNDLE_NAME = "pytorch-performance-course.zip"
PDF_NAME = "pytorch-performance-course.pdf"
BUNDLE_README = HERE / "bundle" / "README.md"
ZIP_TIME = (2026, 1, 1, 0, 0, 0)  # every entry's timestamp: the same commit gives the same bytes

# What the zip holds, relative to the repository root (globs; folders are taken whole).
BUNDLE_FILES = (
    "pyproject.toml", "requirements.txt", "_toc.yml", "scripts/execute.py", "scripts/preimport.py",
    "perflab/**/*.py", "perflab/data/*.json",
    "book/*.md", "book/*.ipynb", "book/_static_ch04/*", "book/_static_ch07/*",
    "labs/*.md",
)

# The field's spellings of one idea. A page that contains any spelling of a group (whole words,
# see _pattern) is indexed under every spelling of it.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("all-reduce", "allreduce", "all reduce", "AllReduce"),
    ("all-gather", "allgather", "all gather", "AllGather"),
    ("reduce-scatter", "reducescatter", "reduce scatter", "ReduceScatter"),
    ("all-to-all", "alltoall", "all to all"),
    ("peer-to-peer", "peer to peer", "P2P"),
    ("bf16", "bfloat16", "brain float"),
    ("fp16", "float16", "half precision"),
    ("fp32", "float32", "single precision"),
    ("fp64", "float64", "double precision"),
    ("fp8", "float8", "e4m3", "e5m2"),
    ("tf32", "TensorFloat-32", "tensorfloat32"),
    ("MFU", "model FLOPs utilization", "model FLOPs utilisation"),
    ("DDP", "ddp", "DistributedDataParallel", "distributed data parallel"),
    ("FSDP", "FullyShardedDataParallel", "fully sharded data parallel"),
    ("ZeRO", "zero redundancy optimizer", "ZeroRedundancyOptimizer"),
    ("data parallel", "data-parallel", "data parallelism"),
    ("AMP", "automatic mixed precision", "mixed precision", "mixed-precision", "autocast"),
    ("GEMM", "matmul", "matrix multiply", "matrix multiplication", "matrix product"),
    ("HBM", "high bandwidth memory", "high-bandwidth memory"),
    ("SM", "streaming multiprocessor"),
    ("tensor core", "tensorcore", "tensor-core"),
    ("H2D", "host-to-device", "host to device"),
    ("D2H", "device-to-host", "device to host"),
    ("PCIe", "PCI Express"),
    ("pinned memory", "page-locked memory", "pin_memory"),
    ("non-blocking", "non_blocking", "nonblocking"),
    ("in-place", "inplace", "in place"),
    ("activation checkpointing", "gradient checkpointing", "recomputation", "rematerialization"),
    ("micro-batch", "microbatch", "micro batch"),
    ("CUDA graph", "CUDA graphs", "cudagraph", "cudagraphs", "CUDAGraph"),
    ("torch.compile", "torch compile", "TorchInductor", "Inductor", "TorchDynamo", "Dynamo"),
    ("FlashAttention", "flash attention", "flash-attention"),
    ("cross-entropy", "cross entropy", "crossentropy", "CrossEntropyLoss"),
    ("layer norm", "layernorm", "LayerNorm", "layer normalization", "layer normalisation"),
    ("OOM", "out of memory", "out-of-memory"),
    ("DataLoader", "data loader", "dataloader"),
    ("warm-up", "warmup", "warm up"),
    ("multi-GPU", "multi GPU", "multigpu", "several GPUs"),
    ("py-spy", "pyspy"),
    ("Nsight Systems", "nsys"),
    ("Nsight Compute", "ncu"),
    ("bandwidth-bound", "bandwidth bound", "memory-bound", "memory bound"),
    ("compute-bound", "compute bound"),
    ("overhead-bound", "overhead bound"),
    ("roofline", "roofline model"),
    ("arithmetic intensity", "operational intensity", "FLOPs per byte", "FLOP/byte"),
)
_WORD = re.compile(r"\w+")


def _pattern(spelling: str) -> re.Pattern:
    """Whole words, plurals too; any case, except for a spelling with two or more capitals
    (an acronym: "ZeRO" must not match "zero", nor "SM" "sm"). Words may be joined by
    spaces, hyphens or dots ("torch compile" matches "torch.compile")."""
    parts = [re.escape(p) for p in re.split(r"[\s.-]+", spelling)]
    flags = 0 if sum(c.isupper() for c in spelling) >= 2 else re.I
    return re.compile(r"(?<![\w])" + r"[\s.-]*".join(parts) + r"(?:e?s)?(?![\w])", flags)


_GROUPS = [(group, [_pattern(s) for s in group]) for group in SYNONYMS]


def canonical_word(group: tuple[str, ...]) -> str:
    """The one word that stands for a group of spellings in the search index: its first
    spelling's words joined, lower case (``"all-reduce"`` -> ``allreduce``, ``"torch.compile"``
    -> ``torchcompile``). Every page that uses any spelling is indexed under it, and the search
    page turns any spelling in a query into it (``static/reader.js``), so that every spelling
    finds the same pages."""
    return "".join(_WORD.findall(group[0].lower()))


def search_keywords(text: str) -> list[str]:
    """The extra words under which a page whose text is ``text`` is indexed: every spelling of
    each :data:`SYNONYMS` group the text uses, as the words a query splits into (``"all-reduce"``
    -> ``all``, ``reduce``, ``allreduce``), and the group's :func:`canonical_word`, lower
    case, sorted."""
    out: set[str] = set()
    for group, patterns in _GROUPS:
        if any(p.search(text) for p in patterns):
            out.add(canonical_word(group))
            for spelling in group:
                words = _WORD.findall(spelling.lower())
                out.update(words)
                if len(words) > 1 and "-" in spelling:
                    out.add("".join(words))
    return sorted(out)


def synonyms_script() -> str:
    """The search page's table of spellings (``window.READER_SYNONYMS``, read by
    ``static/reader.js``): ``[[canonical word, [spellings]], ...]``."""
    table = [[canonical_word(group), list(group)] for group in SYNONYMS]
    return "window.READER_SYNONYMS = " + json.dumps(table, ensure_ascii=False) + ";"


def add_search_synonyms(app, pagename, templatename, context, doctree) -> None:
    """html-page-context: the search page gets :func:`synonyms_script` (before reader.js runs)."""
    if pagename == "search" and _is_html(app):
        app.add_js_file(None, body=synonyms_script(), priority=200)


def add_search_keywords(app, doctree, docname) -> None:
    """doctree-resolved (after bibliographies and other late content are filled in, before
    the page is indexed): the page's synonyms as ``<meta name="keywords">`` (indexed, not shown)."""
    text = [doctree.astext()]
    for toctree in doctree.findall(addnodes.toctree):  # resolved (into the page's text) after this event
        for title, ref in toctree.get("entries", []):
            found = title or (app.env.titles[ref].astext() if ref in app.env.titles else "")
            text.append(found)
    words = search_keywords("\n".join(text))
    if not words:
        return
    meta = nodes.meta()
    meta["name"] = "keywords"
    meta["content"] = ", ".join(words)
    doctree.insert(0, meta)


def glued_text(text: str, fmt_spec: str) -> str:
    """myst-nb's ``format_plain_text`` (a glued value's ``text/plain`` under a role's format
    spec), with a number written by :func:`perflab.record.numbers.format_spec`: never an
    exponent, a zero percentage with false precision or more than four decimals."""
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
            fmt_spec.endswith("s")):
        return format_spec(value, fmt_spec)
    from myst_nb.core.variables import format_plain_text
    return format_plain_text(text, fmt_spec)


def install_number_format() -> None:
    """The ``{glue:text}`` roles (on the page, and resolved across pages) format through
    :func:`glued_text`: myst-nb imports ``format_plain_text`` by name into both modules."""
    from myst_nb.ext.glue import crossref, roles

    for module in (roles, crossref):
        if hasattr(module, "format_plain_text"):
            module.format_plain_text = glued_text


STUDENT_NOTE = ("Student edition: each exercise's solution is replaced by the place for your code "
                "(perflab.labs.exercises.not_done); the checks are kept. Download the course from the "
                "download menu to run it.")


def mark_student_edition(app, doctree) -> None:
    """doctree-read: a lab page of the student edition says so under its title."""
    path = Path(app.env.doc2path(app.env.docname))
    if path.suffix != ".ipynb":
        return
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return
    if not meta.get("student_edition"):
        return
    note = nodes.note()
    note += nodes.paragraph(text=STUDENT_NOTE)
    sections = list(doctree.findall(nodes.section))
    host = sections[0] if sections else doctree
    at = 1 if host.children and isinstance(host.children[0], nodes.title) else 0
    # after the run's badge and its warning (provenance_pages), which come first on every page
    def provenance(node) -> bool:
        return isinstance(node, nodes.warning) or (isinstance(node, nodes.Element)
                                                   and "provenance-badge" in node.get("classes", []))

    while at < len(host.children) and provenance(host.children[at]):
        at += 1
    host.insert(at, note)


def describe_figures(app, doctree) -> None:
    """doctree-read: an image in a captioned figure without alt text gets the caption as its
    alt text (a screen reader otherwise reads the image's file name)."""
    for figure in doctree.findall(nodes.figure):
        captions = list(figure.findall(nodes.caption))
        if not captions:
            continue
        words = " ".join(captions[0].astext().split())
        for image in figure.findall(nodes.image):
            if not image.get("alt"):
                image["alt"] = words


# ---------------------------------------------------------------------------------------------
# "How this was measured": telemetry out of the running prose
# ---------------------------------------------------------------------------------------------

MEASURED_SUMMARY = "How this was measured"


class measured_note(nodes.General, nodes.Element):
    """A folded note under a figure or paragraph (the ``measured`` directive)."""


class Measured(SphinxDirective):
    """``measured``: the conditions of a measurement (the telemetry sentence of
    :meth:`perflab.core.sampler.Summary.sentence`, the clocks, the window) out of the running
    prose, in a folded note placed under the figure, table or paragraph it qualifies::

        :::{measured}
        The copy: {glue:text}`explorer_copy_clock`.
        :::

    The argument replaces the summary line (default :data:`MEASURED_SUMMARY`). HTML shows a
    ``<details>`` block, folded; the single-page build (the PDF) and a printed page show it
    open; other builders print the content as a paragraph."""

    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True

    def run(self) -> list[nodes.Node]:
        if not self.content:
            raise self.error("measured: say what was measured (the note is empty)")
        node = measured_note(summary=self.arguments[0] if self.arguments else MEASURED_SUMMARY)
        self.set_source_info(node)
        self.state.nested_parse(self.content, self.content_offset, node)
        return [node]


def _visit_measured_html(self, node) -> None:
    opened = " open" if self.builder.name == "singlehtml" else ""
    self.body.append(f'<details class="measured-note"{opened}><summary>'
                     f'{self.encode(node["summary"])}</summary><div class="measured-body">')


def _depart_measured_html(self, node) -> None:
    self.body.append("</div></details>\n")


def _visit_plain(self, node) -> None:
    pass


def _depart_plain(self, node) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Figures numbered per chapter and per lab
# ---------------------------------------------------------------------------------------------

_LAB = re.compile(r"(?:^|/)labs/(\d+)_")


def page_prefixes(docnames: list[str], appendices: bool = True) -> dict[str, str]:
    """The number prefix of each page outside a numbered part, in book order: a lab
    ``labs/NN_topic`` gets ``"L<NN>"`` (its figures are Fig. L10.1, L10.2 ...); with
    ``appendices`` (the book has numbered chapters), any other page the next appendix letter
    (``"A"``, ``"B"`` ...: the roofline explorer's figures are Fig. A.1 ...); without, other
    pages are left out (Sphinx's numbers stand)."""
    out, letter = {}, 0
    for docname in docnames:
        m = _LAB.search(docname)
        if m:
            out[docname] = f"L{int(m.group(1))}"
        elif appendices:
            out[docname] = chr(ord("A") + letter) if letter < 26 else f"A{letter}"
            letter += 1
    return out


def number_per_page(app, env) -> list[str]:
    """env-get-updated, after Sphinx numbered the figures: a page outside a numbered part (a
    lab, the reference pages) had its figures and tables counted across the whole book (lab
    10's only figure was "Fig. 9"); each such page now counts its own, under its prefix
    (:func:`page_prefixes`): Fig. L10.1. Chapters keep Sphinx's Fig. 4.k."""
    numbers = env.toc_fignumbers
    unnumbered = [d for d, kinds in numbers.items()
                  if any(kinds.values()) and not env.toc_secnumbers.get(d)]
    prefixes = page_prefixes(unnumbered, appendices=any(env.toc_secnumbers.values()))
    for docname in prefixes:
        for figtype, ids in numbers[docname].items():
            ordered = sorted(ids, key=ids.get)   # Sphinx counted them in page order
            numbers[docname][figtype] = {fid: (prefixes[docname], k)
                                         for k, fid in enumerate(ordered, start=1)}
    # Sphinx compared its fresh book-wide numbers with the previous build's: pages whose
    # per-page numbers changed since the last build are written again here
    last = getattr(env, "reader_fignumbers", {})
    changed = [d for d in numbers if numbers[d] != last.get(d)]
    env.reader_fignumbers = {d: {t: dict(ids) for t, ids in kinds.items()} for d, kinds in numbers.items()}
    return changed


# ---------------------------------------------------------------------------------------------
# Section pages numbered as their files and the prose name them
# ---------------------------------------------------------------------------------------------

def _section_pages(toc) -> list[str]:
    """The section pages of a chapter's landing page: the entries of the toctrees among its own
    headings (its table of contents ``toc``, as Sphinx records it), in order."""
    title = toc.children[0] if toc is not None and toc.children else None
    if not isinstance(title, nodes.list_item):
        return []
    return [ref for headings in title.children if isinstance(headings, nodes.bullet_list)
            for tree in headings.findall(addnodes.toctree) for _, ref in tree.get("entries", [])]


def number_section_pages(app, env) -> list[str]:
    """env-get-updated, after Sphinx numbered the sections (TocTreeCollector, priority 500): on
    a chapter's landing page that has section pages, the page's own headings take no number and
    its section pages are numbered N.1, N.2 ... in order, as their files
    (``book/06_1_host_and_bus``) and the prose ("section 6.1 measured that one") name them.
    Sphinx numbered the landing page's headings first and its section pages after them (chapter
    6's "Summary" was 6.1, so the page the prose calls section 6.1 was 6.2; chapter 9's first
    section page was 9.6). Figures keep their chapter's numbers (Fig. 6.k: they count by
    chapter). Returns the pages whose numbers changed (to be written again)."""
    numbers = env.toc_secnumbers
    moved: dict[tuple, tuple] = {}           # a section page's old number -> its new one
    changed = set()
    for landing in list(numbers):
        pages = [p for p in _section_pages(env.tocs.get(landing)) if numbers.get(p, {}).get("")]
        chapter = numbers[landing].get("")
        if not pages or not chapter:
            continue
        for anchor, number in numbers[landing].items():
            if anchor and number:
                numbers[landing][anchor] = ()         # recorded, with no number: no "6." either
                changed.add(landing)
        for k, page in enumerate(pages, start=1):
            old = numbers[page][""]
            if old != chapter + (k,):
                moved[old] = chapter + (k,)
    for docname, secnums in numbers.items():
        for anchor, number in secnums.items():
            for old, new in moved.items():
                if number and number[:len(old)] == old:
                    secnums[anchor] = new + number[len(old):]
                    changed.add(docname)
                    break
    for docname in changed:                    # the tables of contents show the numbers too
        for ref in env.tocs[docname].findall(nodes.reference):
            number = numbers[docname].get(ref.get("anchorname"))
            if number:
                ref["secnumber"] = list(number)
            elif "secnumber" in ref:
                del ref["secnumber"]
        if docname in env.titles and numbers[docname].get(""):
            env.titles[docname]["secnumber"] = list(numbers[docname][""])
    return sorted(changed)


# ---------------------------------------------------------------------------------------------
# The course as one runnable download
# ---------------------------------------------------------------------------------------------

def bundle_members(root: Path = ROOT, student_labs: Path | None = None) -> dict[str, Path]:
    """``{name in the zip: file}`` for :data:`BUNDLE_FILES` under ``root``; with
    ``student_labs``, ``labs/*.md`` come from that folder instead (the student edition).

    Raises:
        FileNotFoundError: a pattern matches nothing (the zip would silently lack a part).
    """
    out: dict[str, Path] = {}
    for pattern in BUNDLE_FILES:
        if student_labs is not None and pattern == "labs/*.md":
            found = sorted(student_labs.glob("*.md"))
            out.update({f"labs/{p.name}": p for p in found})
        else:
            found = sorted(p for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
            out.update({p.relative_to(root).as_posix(): p for p in found})
        if not found:
            raise FileNotFoundError(f"the course download's pattern {pattern!r} matches no file")
    return out


def torch_pin(requirements: Path) -> str:
    """The ``torch==X`` line of a requirements file (``"torch"`` when it pins none)."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if re.match(r"torch\s*[=<>~!]", line):
            return line.replace(" ", "")
    return "torch"


def write_bundle(target: Path, members: dict[str, Path], readme: Path = BUNDLE_README) -> Path:
    """Write the course zip to ``target`` (atomically): ``README.md`` from ``readme`` (its
    ``@TORCH_PIN@`` replaced by :func:`torch_pin` of the bundled ``requirements.txt``) plus
    ``members``, sorted, every entry dated :data:`ZIP_TIME`. Returns ``target``."""
    tmp = target.with_name(target.name + ".tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    pin = torch_pin(members["requirements.txt"]) if "requirements.txt" in members else "torch"
    entries = {"README.md": readme.read_text(encoding="utf-8").replace("@TORCH_PIN@", pin).encode(),
               **{name: path.read_bytes() for name, path in members.items()}}
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, entries[name])
    tmp.replace(target)
    return target


def _is_html(app) -> bool:
    return app.builder.format == "html" and app.builder.name != "singlehtml"


def on_build_finished(app, exception) -> None:
    if exception is not None or not _is_html(app):
        return
    if app.config.reader_bundle:
        student = app.config.reader_student_sources
        try:
            members = bundle_members(Path(app.srcdir), Path(student) if student else None)
        except FileNotFoundError as err:
            logger.warning(f"no course download in this build: {err}")
        else:
            write_bundle(Path(app.outdir) / BUNDLE_NAME, members)
    pdf = _pdf_source(app)
    if pdf is not None:
        shutil.copyfile(pdf, Path(app.outdir) / PDF_NAME)


def _pdf_source(app) -> Path | None:
    path = Path(app.config.reader_pdf or Path(app.srcdir) / "_build" / "pdf" / PDF_NAME)
    return path if path.is_file() else None


def _to_root(docname: str) -> str:
    return "../" * docname.count("/")


def _file_role(kind: str):
    def role(name, rawtext, text, lineno, inliner, options=None, content=None):
        env = inliner.document.settings.env
        app = env.app
        if kind == "pdf":
            env.reader_pdf_docs.add(env.docname)
        if kind == "pdf" and _pdf_source(app) is None:
            # no PDF built: the link is left out (drop_absent_pdf_links), with its " · " or
            # the paragraph that only offered it; a reader is not told about the build
            return [nodes.inline("", "", classes=[MISSING_PDF])], []
        target = BUNDLE_NAME if kind == "bundle" else PDF_NAME
        ref = nodes.reference(rawtext, text, refuri=_to_root(env.docname) + target,
                              classes=[f"reader-{kind}-link"])
        return [ref], []
    return role


MISSING_PDF = "reader-missing-pdf"

_BACKTICKED = re.compile(r"`([^`\n]+)`")


def render_glued_code(app, doctree, docname=None) -> int:
    """doctree-resolved: a glued string is pasted as plain text (myst-nb's ``pasted-text``),
    so the Markdown backticks its author wrote around a kernel or tool name showed literally
    (\`nvjet_sm90_...\`, \`nsys\`: 15 paragraphs on 10 pages, reader review R5). Each
    backticked run becomes inline code, which the book's CSS lets wrap anywhere (a kernel name
    is one long word: it pushed five pages wider than a phone). Returns how many it rendered."""
    done = 0
    for span in list(doctree.findall(lambda n: isinstance(n, nodes.inline)
                                     and "pasted-text" in n.get("classes", []))):
        for text in list(span.findall(nodes.Text)):
            if isinstance(text.parent, nodes.literal) or "`" not in text:
                continue
            parts, at = [], 0
            for m in _BACKTICKED.finditer(str(text)):
                if m.start() > at:
                    parts.append(nodes.Text(str(text)[at:m.start()]))
                parts.append(nodes.literal(m.group(1), m.group(1), classes=["glued-code"]))
                at = m.end()
                done += 1
            if not parts:
                continue
            if at < len(text):
                parts.append(nodes.Text(str(text)[at:]))
            parent = text.parent
            i = parent.index(text)
            parent.remove(text)
            for k, node in enumerate(parts):
                parent.insert(i + k, node)
    return done


def drop_absent_pdf_links(app, doctree) -> None:
    """doctree-read: take out each ``{book-pdf}`` link of a build without a PDF (the role left
    an empty marker), with the " · " before it, and a paragraph that then offers nothing (it
    ends with a colon: "**The whole book on paper**: ."), so the front page says nothing of
    what this build lacks (reader review M7)."""
    for marker in list(doctree.findall(lambda n: isinstance(n, nodes.inline)
                                       and MISSING_PDF in n.get("classes", []))):
        parent = marker.parent
        at = parent.index(marker)
        before = parent[at - 1] if at > 0 else None
        after = parent[at + 1] if at + 1 < len(parent) else None
        parent.remove(marker)
        if isinstance(before, nodes.Text):
            trimmed = re.sub(r"\s*·\s*$", "", str(before))
            if trimmed != str(before):
                parent.replace(before, nodes.Text(trimmed))
        if isinstance(parent, nodes.paragraph):
            rest = re.sub(r"[\s.]+$", "", parent.astext())
            if not rest or rest.endswith(":"):
                parent.parent.remove(parent)
            elif isinstance(after, nodes.Text) and re.fullmatch(r"\s*", str(after)):
                parent.remove(after)


def add_download_entries(app, pagename, templatename, context, doctree) -> None:
    """html-page-context, after the theme's buttons: the course zip (and the book's PDF, when
    built) in each page's download menu, next to the page's own ``.ipynb``."""
    if not _is_html(app):
        return
    for group in context.get("header_buttons") or []:
        if group.get("label") != "download-buttons":
            continue
        buttons = group["buttons"]
        at = next((i for i, b in enumerate(buttons) if b.get("label") == "download-pdf-button"), len(buttons))
        extra = [{"type": "link", "url": context["pathto"](BUNDLE_NAME, 1), "text": "course (.zip)",
                  "tooltip": "The whole course to run: sources, perflab, requirements, a README",
                  "icon": "fas fa-file-zipper", "label": "download-course-button"}]
        if _pdf_source(app) is not None:
            extra.append({"type": "link", "url": context["pathto"](PDF_NAME, 1), "text": "book (.pdf)",
                          "tooltip": "The whole book as one PDF", "icon": "fas fa-book",
                          "label": "download-book-pdf-button"})
        buttons[at:at] = extra


def on_builder_inited(app) -> None:
    env = app.env
    if not hasattr(env, "reader_pdf_docs"):
        env.reader_pdf_docs = set()


def on_env_get_outdated(app, env, added, changed, removed) -> list[str]:
    """Pages that link the PDF are re-read when the PDF appears or disappears."""
    state = _pdf_source(app) is not None
    if getattr(env, "reader_pdf_state", None) == state:
        return []
    env.reader_pdf_state = state
    return sorted(env.reader_pdf_docs - set(removed))


def on_env_purge_doc(app, env, docname) -> None:
    env.reader_pdf_docs.discard(docname)


def on_env_merge_info(app, env, docnames, other) -> None:
    env.reader_pdf_docs.update(getattr(other, "reader_pdf_docs", set()))


def on_config_inited(app, config) -> None:
    opts = dict(config.html_theme_options or {})
    opts["navbar_persistent"] = []  # the top bar's search field repeated the sidebar's
    config.html_theme_options = opts
    static = str(HERE / "static")
    if static not in config.html_static_path:
        config.html_static_path = list(config.html_static_path) + [static]
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    subs.setdefault("edition", "student edition" if config.reader_edition == "student" else "full edition")
    config.myst_substitutions = subs


def setup(app):
    install_number_format()
    app.add_config_value("reader_edition", "full", "env")
    app.add_config_value("reader_bundle", True, "html")
    app.add_config_value("reader_student_sources", "", "env")
    app.add_config_value("reader_pdf", "", "env")
    app.add_node(measured_note, html=(_visit_measured_html, _depart_measured_html),
                 latex=(_visit_plain, _depart_plain), text=(_visit_plain, _depart_plain),
                 man=(_visit_plain, _depart_plain), texinfo=(_visit_plain, _depart_plain))
    app.add_directive("measured", Measured)
    app.add_role("course-download", _file_role("bundle"))
    app.add_role("book-pdf", _file_role("pdf"))
    app.add_css_file("reader.css")
    app.add_js_file("reader.js", loading_method="defer")
    app.connect("config-inited", on_config_inited)
    app.connect("builder-inited", on_builder_inited)
    app.connect("env-get-outdated", on_env_get_outdated)
    app.connect("env-purge-doc", on_env_purge_doc)
    app.connect("env-merge-info", on_env_merge_info)
    app.connect("doctree-resolved", add_search_keywords)
    app.connect("doctree-read", describe_figures)
    app.connect("doctree-read", drop_absent_pdf_links)
    app.connect("doctree-resolved", render_glued_code)
    app.connect("doctree-read", mark_student_edition)
    # after Sphinx's own numbering (TocTreeCollector, priority 500)
    app.connect("env-get-updated", number_per_page, priority=900)
    app.connect("env-get-updated", number_section_pages, priority=800)
    app.connect("html-page-context", add_download_entries, priority=510)
    app.connect("html-page-context", add_search_synonyms)
    app.connect("build-finished", on_build_finished)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
