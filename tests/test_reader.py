"""The built book as readers use it (issue 32): what a page offers beyond its content.

Built once per session (the ``build``, ``server`` and ``rendered`` fixtures of
``tests/book_site.py``), every page is checked for:

* **a runnable course download**: the zip the build writes is linked from the front page and
  from every notebook page, and, unpacked into a fresh environment, runs a chapter on the CPU
  with its own ``perflab`` (and cannot without it);
* **pages that fit**: in Chromium at 1,280 px, no block reaches past the text column, nothing
  is cut off sideways, and every block that scrolls sideways has a visible hint
  (``tests/layout_probe.js`` measures; ``_ext/static/reader.js`` adds the hints);
* **one search box** per page, and a search that knows the field's spellings ("allreduce"
  finds the pages that write "all-reduce");
* **figures** that are numbered, say which device measured them and are referred to from the
  prose, each shown once; **numbers** written as a person would;
* **a student edition** (``make book-student``) with no solution marker or solution line in
  anything it publishes.

The rules that chapter and lab pages do not meet yet list those pages in
``tests/reader_waiting.py`` (the lists only shrink; a listed page that passes fails too).
Each rule is proven to fail on a page that breaks it (the tests at the end, no build needed
except the small books they build).
"""

from __future__ import annotations

import functools
import hashlib
import html as html_lib
import json
import os
import re
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

import background
import course_download
import reader_waiting
import textbook_rules
from perflab.record.numbers import BAD_SHAPES
from book_site import (_jupyter_book, _toc_docnames, chromium, classify_warnings, html_pages, internal_target,
                       notebook_pages, probe, require_chromium, search_hits, serve)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402
import provenance_pages  # noqa: E402
import reader_pages  # noqa: E402

# the chapter the course download must run: chapter 2's first page, which imports perflab's
# machine modules and draws two figures from the host CPU in ~20 s (chapter 1 took ~120 s of
# a loaded 2-core CI machine, and test_chapters runs it there anyway)
CHAPTER = "book/02_hardware.md"


# ---------------------------------------------------------------------------------------------
# Reading built pages
# ---------------------------------------------------------------------------------------------

class _Text(HTMLParser):
    """Text a reader reads as numbers: the article's prose, tables and cell outputs; not code
    (cell inputs, code blocks, inline literals), maths, scripts or the page's chrome."""

    SKIP_TAGS = {"script", "style", "math", "mjx-container", "svg", "nav"}
    CODE_TAGS = {"pre", "code", "kbd", "samp"}          # code, unless it is a cell's output
    SKIP_CLASSES = {"cell_input", "math", "headerlink", "provenance-footer", "provenance-badge"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[dict] = []
        self.chunks: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        up = self.stack[-1] if self.stack else {"article": False, "skip": False, "output": False}
        output = up["output"] or "cell_output" in classes
        skip = (up["skip"] or tag in self.SKIP_TAGS or bool(classes & self.SKIP_CLASSES)
                or (tag in self.CODE_TAGS and not output))
        self.stack.append({"tag": tag, "article": up["article"] or tag == "article" or "bd-article" in classes,
                           "skip": skip, "output": output})

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if self.stack and self.stack[-1]["article"] and not self.stack[-1]["skip"]:
            self.chunks.append(data)


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def reader_text(page_html: str) -> str:
    """The text of a page that is read as prose, tables or outputs (see :class:`_Text`)."""
    parser = _Text()
    parser.feed(page_html)
    return " ".join(" ".join(parser.chunks).split())


# Shapes of numbers a person would not write (CONTRIBUTING.md, "Numbers"): one home, the
# formatter's module, which never produces them ("1/1.32e+03 of the matrix rate" included).
NUMBER_SHAPES = BAD_SHAPES
_SHAPES = {name: re.compile(rx) for name, rx in NUMBER_SHAPES.items()}


def number_shapes(page_html: str) -> list[tuple[str, str]]:
    """``(shape, the text around it)`` for every number on the page a person would not write.

    A number written as a keyword argument (``name=1e-05``) is code a library printed (the
    repr of a module such as PyTorch's ``LayerNorm(..., eps=1e-05)``), not a number written for
    the reader, and is left alone."""
    text = reader_text(page_html)
    found = []
    for name, rx in _SHAPES.items():
        for m in rx.finditer(text):
            if re.search(r"\w=$", text[max(0, m.start() - 40): m.start()]):
                continue
            found.append((name, text[max(0, m.start() - 30): m.end() + 15]))
    return found


def test_number_shapes_leave_a_printed_repr_but_not_prose():
    """The exemption covers ``eps=1e-05`` in a module's repr, not the same number in prose."""
    def page(text):
        return f"<article><p>{text}</p></article>"

    assert number_shapes(page("LayerNorm((768,), eps=1e-05, affine)")) == []
    assert [s for s, _ in number_shapes(page("a tolerance of 1e-05 here"))] == [
        "scientific notation"]


class _Figures(HTMLParser):
    """Images of cell outputs and the figures that hold them; numbered-figure references."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[dict] = []
        self.unnumbered: list[str] = []          # output images outside any <figure>
        self.figures: list[dict] = []            # {"id", "number", "measured", "images"}
        self.references: set[str] = set()        # fragment ids that prose links as Fig. N

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            if tag == "img":
                self._image(dict(attrs))
            return
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        frame = {"tag": tag, "classes": classes, "id": a.get("id"), "text": []}
        if tag == "figure":
            frame["figure"] = {"id": a.get("id"), "number": False, "measured": "", "images": []}
        if tag == "a" and (a.get("href") or "").startswith("#"):
            frame["href"] = a["href"][1:]
        self.stack.append(frame)
        if "caption-number" in classes:
            fig = self._figure()
            if fig is not None:
                fig["number"] = True
        if "std-numref" in classes:
            for f in reversed(self.stack):
                if "href" in f:
                    self.references.add(f["href"])
                    break

    def _figure(self):
        for f in reversed(self.stack):
            if "figure" in f:
                return f["figure"]
        return None

    def _image(self, attrs):
        if not any("cell_output" in f["classes"] for f in self.stack):
            return
        fig = self._figure()
        if fig is None:
            self.unnumbered.append(attrs.get("src", ""))
        else:
            fig["images"].append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                for frame in reversed(self.stack[i:]):
                    text = "".join(frame["text"])
                    if "provenance-caption" in frame["classes"]:
                        fig = None
                        for f in reversed(self.stack[:self.stack.index(frame)]):
                            if "figure" in f:
                                fig = f["figure"]
                                break
                        if fig is not None:
                            fig["measured"] = " ".join(text.split())
                    if "figure" in frame and frame["figure"]["images"]:
                        self.figures.append(frame["figure"])
                del self.stack[i:]
                break

    def handle_data(self, data):
        for f in self.stack:
            f["text"].append(data)


def figure_problems(page_html: str) -> list[str]:
    """What is wrong with a page's figures: an output image outside a numbered figure, a
    figure without a number, without a provenance line naming the device that measured it, or
    that no prose refers to."""
    parser = _Figures()
    parser.feed(page_html)
    problems = [f"an output image that is not a numbered figure ({src.rsplit('/', 1)[-1][:16]}...)"
                for src in parser.unnumbered]
    for fig in parser.figures:
        name = fig["id"] or "a figure without a name"
        if not fig["number"]:
            problems.append(f"{name}: no figure number (its cell needs mystnb.figure.caption)")
        if " measured on " not in fig["measured"] and provenance_pages.PUBLISHED_WORDS not in fig["measured"]:
            problems.append(f"{name}: its provenance line does not say which device measured it "
                            f"(cell metadata perflab.measured_on): {fig['measured'][:80]!r}")
        if fig["id"] and fig["id"] not in parser.references:
            problems.append(f"{name}: no prose refers to it ({{numref}}`{fig['id']}`)")
    return problems


def shown_twice(page: Path, page_html: str, html_root: Path) -> list[str]:
    """Images of a page's article that show the same picture as an earlier one (same file, or
    the same decoded pixels)."""
    from PIL import Image

    article = page_html.split("<article", 1)[-1]
    seen: dict[str, str] = {}
    twice = []
    for src in re.findall(r'<img[^>]*\ssrc="([^"]+)"', article):
        target = internal_target(page, html_lib.unescape(src), html_root)
        if target is None or not target[0].is_file():
            continue
        path = target[0]
        try:
            with Image.open(path) as im:
                key = hashlib.sha256(im.convert("RGBA").tobytes() + str(im.size).encode()).hexdigest()
        except Exception:  # not a raster image (an SVG): compare its bytes
            key = hashlib.sha256(path.read_bytes()).hexdigest()
        if key in seen:
            twice.append(f"{path.name[:16]}... (shown first as {seen[key][:16]}...)")
        else:
            seen[key] = path.name
    return twice


def shows_an_old_run(page: str) -> bool:
    """True for a built page (``book/x.html``) whose notebook's run is not current: its outputs
    (and, for a page split since, its prose) are the run of code that has changed. The rules
    read what a reader sees, which only the next reference run of the current source renders."""
    from perflab.record import runs

    md = ROOT / Path(page).with_suffix(".md")
    st = runs.status(md) if md.exists() else None
    return st is not None and not st.ok


def ratchet(found: dict[str, list[str]], waiting: set[str], rule: str, waiting_name: str) -> None:
    """Fail on a page that breaks ``rule`` and is not in ``waiting``, and on a page in
    ``waiting`` that no longer breaks it; print what each waiting page still breaks. A page
    whose run is stale (:func:`shows_an_old_run`) is neither: what it breaks is printed and
    judged again on its next reference run."""
    old = {p for p in set(found) | waiting if shows_an_old_run(p)}
    for page in sorted(old & set(found)):
        print(f"stale run, judged again on its next reference run ({rule}): {page}: "
              + "; ".join(found[page][:5]))
    found = {p: f for p, f in found.items() if p not in old}
    waiting = waiting - old
    for page in sorted(waiting & set(found)):
        print(f"waiting ({rule}): {page}: {len(found[page])}: " + "; ".join(found[page][:5]))
    new = {p: f for p, f in found.items() if p not in waiting}
    fixed = sorted(p for p in waiting if p not in found)
    message = []
    if new:
        message.append(f"{len(new)} page(s) break the rule '{rule}':\n" + "\n".join(
            f"  {p}: " + "; ".join(f[:6]) + (f" (+{len(f) - 6} more)" if len(f) > 6 else "")
            for p, f in sorted(new.items())))
    if fixed:
        message.append(f"these pages now keep the rule '{rule}': remove them from "
                       f"tests/reader_waiting.py {waiting_name}: {fixed}")
    assert not message, "\n".join(message)


# ---------------------------------------------------------------------------------------------
# The course download
# ---------------------------------------------------------------------------------------------

def test_course_download_is_built_and_linked_from_every_notebook_page(build, rendered):
    bundle = build.html / reader_pages.BUNDLE_NAME
    assert bundle.is_file(), f"the build wrote no course download ({reader_pages.BUNDLE_NAME})"
    names = set(zipfile.ZipFile(bundle).namelist())
    for needed in ("README.md", "pyproject.toml", "requirements.txt", "perflab/__init__.py",
                   "scripts/execute.py", "scripts/preimport.py", CHAPTER, "labs/01_roofline.md"):
        assert needed in names, f"the course download lacks {needed}"
    problems = []
    for rel in ["index.html", *notebook_pages(build)]:
        r = rendered[rel]
        links = [h for h in r.page.links
                 if (t := internal_target(r.path, h, build.html)) and t[0].resolve() == bundle.resolve()]
        if not links:
            problems.append(f"{rel}: no link to the course download")
    assert not problems, "\n".join(problems)


def run_course_download(bundle: Path, tmp: Path, drop: str | None = None) -> subprocess.CompletedProcess:
    """Unpack ``bundle`` under ``tmp`` (without the folder ``drop``, to prove it is needed),
    install it in a fresh environment without network (``tests/course_download.py``) and
    execute :data:`CHAPTER` with its ``scripts/execute.py``. Returns the execution; raises when
    the install fails."""
    course, python, env = course_download.install(bundle, tmp, drop=drop)
    return background.run([str(python), "scripts/execute.py", "--out", str(tmp / "out"), CHAPTER], 900,
                          env=env, cwd=course)


DOWNLOAD_RUNS = {"test_course_download_runs_a_chapter_on_cpu": None,
                 "test_course_download_without_perflab_cannot_run_the_chapter": "perflab"}


def _download_job(build_out: Path, tmp: Path, drop: str | None) -> tuple[subprocess.CompletedProcess, Path]:
    html = build_out / "_build" / "html"
    return run_course_download(html / reader_pages.BUNDLE_NAME, tmp, drop=drop), tmp


def _student_job(tmp: Path):
    return _student_build(tmp)


def background_jobs(items, tmp_path_factory) -> list:
    """The course download's two runs and the student edition's build, ahead of their tests
    (tests/background.py); each in a folder of its own, the downloads after the book's build."""
    from book_site import BUILD_JOB, planned_build

    jobs = []
    for i, item in enumerate(items):
        name = getattr(item, "originalname", None)
        if name in DOWNLOAD_RUNS and item.module.__name__ == __name__ and planned_build() is not None:
            tmp = tmp_path_factory.mktemp(f"download-{DOWNLOAD_RUNS[name] or 'whole'}")
            jobs.append((i, f"download {name}", functools.partial(
                _download_job, planned_build(), tmp, DOWNLOAD_RUNS[name]), False, (BUILD_JOB,)))
        elif "student_build" in getattr(item, "fixturenames", ()) and not any(j[1] == "student build" for j in jobs):
            jobs.append((i, "student build", functools.partial(_student_job, tmp_path_factory.mktemp("student-book")),
                         False, ()))
    return jobs


def _download_run(name: str, build, tmp_path: Path, drop: str | None) -> tuple[subprocess.CompletedProcess, Path]:
    """The download's run for test ``name``: the job's, if one ran ahead, else run here now."""
    job = background.result(f"download {name}")
    if job is None:
        return run_course_download(build.html / reader_pages.BUNDLE_NAME, tmp_path, drop=drop), tmp_path
    if job.error is not None:
        raise job.error
    return job.value


def test_course_download_runs_a_chapter_on_cpu(build, tmp_path):
    proc, tmp_path = _download_run("test_course_download_runs_a_chapter_on_cpu", build, tmp_path, None)
    assert proc.returncode == 0, f"{CHAPTER} did not run from the course download:\n{(proc.stdout + proc.stderr)[-3000:]}"
    executed = sorted((tmp_path / "out").rglob(Path(CHAPTER).with_suffix(".ipynb").name))
    assert executed, f"execute.py wrote no notebook under {tmp_path / 'out'}"
    nb = nbformat.read(executed[0], as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"], "a cell raised"
    assert any("image/png" in o.get("data", {}) for o in outputs), "the chapter drew no figure"


def test_course_download_without_perflab_cannot_run_the_chapter(build, tmp_path):
    """The proof that the test above tests the download: without its perflab it fails."""
    proc, _ = _download_run("test_course_download_without_perflab_cannot_run_the_chapter", build, tmp_path,
                            "perflab")
    assert proc.returncode != 0 and "perflab" in proc.stdout + proc.stderr, (
        f"{CHAPTER} ran from a download without perflab: the environment finds another perflab")


# ---------------------------------------------------------------------------------------------
# Pages that fit; one search box; search by any spelling
# ---------------------------------------------------------------------------------------------

def layout_problems(report: dict | None) -> list[str]:
    """What the layout probe found wrong on a page (empty when it fits)."""
    if report is None:
        return ["the layout probe gave no report"]
    out = []
    for item in report["sticks_out"]:
        out.append(f"{item['element']} reaches {item['past_px']} px past the column: {item['text'][:60]!r}")
    for item in report["cut_off"]:
        out.append(f"{item['element']} hides {item['hidden_px']} px sideways, with no way to scroll: "
                   f"{item['text'][:60]!r}")
    for item in report["no_hint"]:
        out.append(f"{item['element']} scrolls {item['hidden_px']} px sideways without a hint: {item['text'][:60]!r}")
    return out


def test_every_page_fits_the_column_or_says_it_scrolls(rendered):
    found = {rel: p for rel, r in rendered.items() if (p := layout_problems(r.layout))}
    for rel, r in sorted(rendered.items()):
        if r.layout and r.layout["scrolling"]:
            print(f"{rel}: {len(r.layout['scrolling'])} block(s) wider than the column scroll with a hint")
    ratchet(found, set(), "fits the column, or scrolls with a hint", "(none)")


def test_every_page_has_one_search_box(rendered):
    found = {rel: [b["element"] for b in r.layout["search_boxes"]]
             for rel, r in rendered.items() if r.layout and len(r.layout["search_boxes"]) != 1}
    assert not found, f"pages without exactly one visible search box: {found}"


def _search_hits(binary: str, server: str, *queries: str) -> dict[str, list[str]]:
    """Each query's result links on the search page (all of them searched in one Chromium)."""
    return search_hits(binary, server, list(queries))


def test_search_finds_the_field_s_spellings(build, server):
    binary = require_chromium()
    # pages that say "all-reduce" (chapter 8 is built once its notebook has been executed)
    pages = [p for p in ("book/08_distributed_training", "book/02_hardware") if (build.html / f"{p}.html").exists()]
    assert pages, "neither chapter 2 nor chapter 8 was built"
    for query, hits in _search_hits(binary, server, "allreduce", "AllReduce").items():
        for page in pages:
            assert any(h.startswith(page) for h in hits), f"searching {query!r} finds {hits}, not {page}"
    index = _search_index(build.html)
    for a, b in (("bf16", "bfloat16"), ("fp8", "float8"), ("ddp", "distributeddataparallel")):
        pages_a, pages_b = _pages_for(index, a), _pages_for(index, b)
        assert pages_a and pages_a == pages_b, f"{a!r} finds {sorted(pages_a)}, {b!r} finds {sorted(pages_b)}"
    mfu = _pages_for(index, "mfu")   # every page that says MFU is found by what it stands for
    assert mfu and mfu <= _pages_for(index, "utilization") & _pages_for(index, "model"), sorted(mfu)


# Spellings a query may use for one idea, each pair finding the same pages (issue 43: "allreduce"
# missed six pages that "all-reduce" found, the pages that say "all" and "reduce" apart)
SPELLING_PAIRS = (("allreduce", "all-reduce"), ("all reduce", "AllReduce"), ("dataloader", "data loader"),
                  ("torch.compile", "torch compile"), ("bf16", "bfloat16"), ("reduce-scatter", "reducescatter"),
                  ("activation checkpointing", "recomputation"), ("warm-up", "warmup"),
                  ("all-gather", "allgather"), ("torchcompile", "torch.compile"), ("fp16", "float16"),
                  ("CUDA graphs", "cudagraphs"), ("micro-batch", "microbatch"), ("py-spy", "pyspy"))


def test_search_finds_the_same_pages_for_every_spelling(build, server):
    binary = require_chromium()
    problems = []
    found = _search_hits(binary, server, *dict.fromkeys(q for pair in SPELLING_PAIRS for q in pair))
    for a, b in SPELLING_PAIRS:
        hits_a = {h.split("#")[0].split("?")[0] for h in found[a]}
        hits_b = {h.split("#")[0].split("?")[0] for h in found[b]}
        if not hits_a or hits_a != hits_b:
            problems.append(f"{a!r} finds {sorted(hits_a)}; {b!r} finds {sorted(hits_b)}")
    assert not problems, "\n".join(problems)


def _build_tiny_book(folder, pages):
    """Build a book of ``pages`` (already written in ``folder``) with the course's extension,
    as the course's build does (-W -n)."""
    (folder / "index.md").write_text(f"# Tiny\n\n{len(pages)} page(s).\n")
    toc = "".join(f"  - file: {p}\n" for p in pages)
    (folder / "_toc.yml").write_text(f"format: jb-book\nroot: index\nchapters:\n{toc}")
    (folder / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: 'off'\nsphinx:\n  local_extensions:\n"
        f"    reader_pages: {ROOT / '_ext'}\n  config:\n    reader_bundle: false\n")
    proc = subprocess.run([*_jupyter_book(), "build", str(folder), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_search_spellings_both_ways_in_a_small_book(tmp_path):
    """The proof: in a book where one page says "all-reduce", one "AllReduce" and one only "all"
    and "reduce" apart, every spelling finds the first two and not the third (Sphinx alone finds
    all three for "all-reduce", and only the first two for "allreduce")."""
    binary = require_chromium()
    pages = {"a": "# Page a\n\nWe all-reduce the gradients.\n",
             "c": "# Page c\n\nNCCL's AllReduce sums them.\n",
             "b": "# Page b\n\nWe reduce the batch size to fit all of it.\n"}
    for name, text in pages.items():
        (tmp_path / f"{name}.md").write_text(text)
    _build_tiny_book(tmp_path, ["a", "b", "c"])
    url, stop = serve(tmp_path / "_build" / "html")
    try:
        found = {q: sorted({h.split(".html")[0] for h in hits})
                 for q, hits in _search_hits(binary, url, "all-reduce", "allreduce", "all reduce",
                                             "AllReduce").items()}
    finally:
        stop()
    assert all(hits == ["a", "c"] for hits in found.values()), found


def _search_index(html: Path) -> dict:
    text = (html / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1: text.rindex(")")])


def _pages_for(index: dict, word: str) -> set[str]:
    from sphinx.search.en import SearchEnglish

    stem = SearchEnglish(None).stem(word.lower()).lower()
    out = set()
    for table in ("terms", "titleterms"):
        hits = index[table].get(stem, [])
        out |= {index["docnames"][i] for i in ([hits] if isinstance(hits, int) else hits)}
    return out


# ---------------------------------------------------------------------------------------------
# Figures and numbers (rules that wait for the chapter pages)
# ---------------------------------------------------------------------------------------------

def test_figures_are_numbered_name_their_device_and_are_referred_to(build, rendered):
    found = {rel: p for rel in notebook_pages(build) if (p := figure_problems(rendered[rel].dom))}
    ratchet(found, reader_waiting.FIGURES_WITHOUT_NUMBER_OR_DEVICE, "figures numbered, captioned with "
            "their device, referred to", "FIGURES_WITHOUT_NUMBER_OR_DEVICE")


def test_no_figure_is_shown_twice(build, rendered):
    found = {rel: t for rel, r in rendered.items() if (t := shown_twice(r.path, r.dom, build.html))}
    ratchet(found, reader_waiting.FIGURES_SHOWN_TWICE, "each figure shown once", "FIGURES_SHOWN_TWICE")


def test_numbers_are_written_as_a_person_would(build, rendered):
    """Every page of the table of contents, no exemptions: a page the build left out is one
    whose notebook has not been executed yet (its glued numbers go through
    perflab.record.numbers.format_spec when it is)."""
    unbuilt = [d for d in _toc_docnames() if f"{d}.html" not in rendered]
    assert all(not (ROOT / f"{d}.ipynb").exists() for d in unbuilt), f"pages not checked: {unbuilt}"
    found = {rel: [f"{shape}: ...{ctx}..." for shape, ctx in s]
             for rel, r in rendered.items() if (s := number_shapes(r.dom))}
    ratchet(found, reader_waiting.NUMBER_SHAPES, "numbers written as a person would", "NUMBER_SHAPES")


_CHAPTER_PAGE = re.compile(r"^book/(\d+)_")
_LAB_PAGE = re.compile(r"^labs/(\d+)_")


def chapter_number(page_html: str) -> str | None:
    """The number a chapter page shows in its title ("4" for "4. Measuring and profiling")."""
    m = re.search(r'<h1>\s*<span class="section-number">(\d+)\.\s*</span>', page_html)
    return m.group(1) if m else None


def figure_numbering_problems(rel: str, page_html: str) -> list[str]:
    """Figure numbers that are not the page's own: a chapter's are Fig. N.k (N the number its
    title shows), a lab's Fig. LN.k, counted from 1 in page order (a chapter split into section
    pages goes on counting: increasing, not from 1)."""
    numbers = re.findall(r'class="caption-number">Fig\. ([^<\s]+)', page_html)
    if m := _CHAPTER_PAGE.match(rel):
        prefix, from_one = chapter_number(page_html) or f"{int(m.group(1))}", False
    elif m := _LAB_PAGE.match(rel):
        prefix, from_one = f"L{int(m.group(1))}", True
    else:
        return []
    problems = [f"Fig. {n}: not numbered as a figure of {prefix} (Fig. {prefix}.k)"
                for n in numbers if not re.fullmatch(re.escape(prefix) + r"\.\d+", n)]
    ks = [int(n.rsplit(".", 1)[1]) for n in numbers if re.fullmatch(re.escape(prefix) + r"\.\d+", n)]
    if ks and (ks != sorted(set(ks)) or (from_one and ks != list(range(1, len(ks) + 1)))):
        problems.append(f"figure numbers out of order: {ks}")
    return problems


def test_figures_are_numbered_per_chapter_and_per_lab(build):
    """Fig. 4.2 in chapter 4, Fig. L10.1 in lab 10: never a number counted across the book."""
    problems, counted = [], 0
    unexecuted = [d for d in _toc_docnames() if _CHAPTER_PAGE.match(d + ".html")
                  and not (ROOT / f"{d}.ipynb").exists()]
    for rel in notebook_pages(build):
        page = (build.html / rel).read_text(encoding="utf-8")
        counted += page.count('class="caption-number">Fig.')
        problems += [f"{rel}: {p}" for p in figure_numbering_problems(rel, page)]
        m, shown = _CHAPTER_PAGE.match(rel), chapter_number(page)
        if m and shown and int(shown) != int(m.group(1)):
            # a chapter whose notebook waits for its first run is not in the book, and Sphinx
            # numbers the chapters after it one lower (tolerated as the build's warning is)
            if any(d < rel[:-len(".html")] for d in unexecuted):
                print(f"{rel} shows chapter number {shown}: {unexecuted} not executed yet")
            else:
                problems.append(f"{rel}: the page shows chapter number {shown}")
    assert counted > 10, f"only {counted} numbered figures in the book: the check would be empty"
    assert not problems, "\n".join(problems)


def test_figure_numbering_check_catches_book_wide_numbers():
    def page(*numbers):
        return "".join(f'<span class="caption-number">Fig. {n} </span>' for n in numbers)

    assert figure_numbering_problems("labs/10_gpt2_speedrun.html", page("L10.1", "L10.2")) == []
    assert figure_numbering_problems("book/04_measuring.html", page("4.1", "4.2", "4.3")) == []
    assert figure_numbering_problems("labs/10_gpt2_speedrun.html", page("9"))          # book-wide
    assert figure_numbering_problems("book/04_measuring.html", page("4.1", "5.2"))     # another chapter's
    assert figure_numbering_problems("labs/01_roofline.html", page("L1.2"))            # not from 1
    assert figure_numbering_problems("book/06_speed.html", page("6.2", "6.1"))         # out of order
    titled = '<h1><span class="section-number">8. </span>Advanced</h1>'   # the number it shows
    assert figure_numbering_problems("book/09_advanced.html", titled + page("8.1")) == []
    assert figure_numbering_problems("book/09_advanced.html", titled + page("9.1"))


_PAGE_NUMBER = re.compile(r'<h1[^>]*>\s*<span class="section-number">([\d.]+?)\.?\s*</span>')
_SECTION_FILE = re.compile(r"(?:^|/)(\d+)_(\d+)_[^/]*\.html$")
_SECTION_REF = re.compile(r"\bsections? (\d+\.\d+)\b")


def page_numbers(html_root: Path) -> dict[str, str]:
    """The section number of each numbered page of a build (``{"book/06_1_host_and_bus.html":
    "6.1"}``), read from its title."""
    out = {}
    for path in html_pages(html_root):
        found = _PAGE_NUMBER.search(path.read_text(encoding="utf-8"))
        if found:
            out[path.relative_to(html_root).as_posix()] = found.group(1)
    return out


def section_number_problems(html_root: Path) -> list[str]:
    """A section page numbered otherwise than its file (``book/06_1_...`` is 6.1), and a
    "section N.M" in the prose that is no page's number."""
    numbers = page_numbers(html_root)
    out = [f"{page} is numbered {n}, its file says {int(m.group(1))}.{int(m.group(2))}"
           for page, n in sorted(numbers.items())
           if (m := _SECTION_FILE.search(page)) and n != f"{int(m.group(1))}.{int(m.group(2))}"]
    pages = set(numbers.values())
    for path in html_pages(html_root):
        for ref in _SECTION_REF.findall(reader_text(path.read_text(encoding="utf-8"))):
            if ref not in pages:
                out.append(f"{path.relative_to(html_root).as_posix()}: 'section {ref}' is no page's number")
    return out


def test_section_pages_are_numbered_as_the_prose_names_them(build):
    """Chapter 6's prose says "section 6.1" for book/06_1_host_and_bus; Sphinx numbered that
    page 6.2, after the landing page's own "Summary" (6.1). _ext/reader_pages.py numbers a
    chapter's section pages N.1, N.2 ... and leaves the landing page's headings unnumbered."""
    numbers = page_numbers(build.html)
    assert numbers.get("book/06_1_host_and_bus.html") == "6.1", numbers
    problems = section_number_problems(build.html)
    assert not problems, "\n".join(problems)


def test_section_pages_in_a_small_book(tmp_path):
    """A landing page with headings of its own and two section pages: the pages are 1.1 and
    1.2, the landing page's headings carry no number (not even the chapter's), the sidebar
    says the same; a prose "section 1.1" is then a page's number."""
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: index\nparts:\n  - caption: Chapters\n    numbered: true\n    chapters:\n"
        "      - file: ch1\n        sections:\n          - file: ch1_1_first\n          - file: ch1_2_second\n")
    (tmp_path / "index.md").write_text("# Book\n\nThe front page.\n")
    (tmp_path / "ch1.md").write_text("# Chapter one\n\nIntro.\n\n## Own heading\n\nText.\n\n### Deeper\n\n"
                                     "More.\n\n## Summary\n\nAs section 1.2 shows.\n")
    (tmp_path / "ch1_1_first.md").write_text("# First section\n\nText.\n\n## A part\n\nX.\n")
    (tmp_path / "ch1_2_second.md").write_text("# Second section\n\nSection 1.1 measured it.\n")
    (tmp_path / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: 'off'\nsphinx:\n  local_extensions:\n"
        f"    reader_pages: {ROOT / '_ext'}\n  config:\n    reader_bundle: false\n")
    proc = subprocess.run([*_jupyter_book(), "build", str(tmp_path), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    html = tmp_path / "_build" / "html"
    assert page_numbers(html) == {"ch1.html": "1", "ch1_1_first.html": "1.1", "ch1_2_second.html": "1.2"}
    assert section_number_problems(html) == []
    landing = (html / "ch1.html").read_text(encoding="utf-8")
    for heading in ("Own heading", "Deeper", "Summary"):
        assert re.search(rf"<h[23]>{heading}<", landing), f"{heading!r} is numbered"
    first = (html / "ch1_1_first.html").read_text(encoding="utf-8")
    assert '<span class="section-number">1.1.1. </span>A part' in first
    assert ">1.2. Second section<" in first, "the sidebar numbers the section pages otherwise"


def test_pages_outside_a_numbered_part_get_their_own_prefix():
    pages = ["labs/01_roofline", "book/roofline_explorer", "labs/10_gpt2_speedrun", "status"]
    assert reader_pages.page_prefixes(pages) == {"labs/01_roofline": "L1", "book/roofline_explorer": "A",
                                                 "labs/10_gpt2_speedrun": "L10", "status": "B"}
    # a book without numbered chapters has no appendices: only its labs count their own
    assert reader_pages.page_prefixes(pages, appendices=False) == {"labs/01_roofline": "L1",
                                                                   "labs/10_gpt2_speedrun": "L10"}


# ---------------------------------------------------------------------------------------------
# A textbook, not a lab notebook (issue 43): rules in tests/textbook_rules.py, pages that wait
# for their chapter's third edition in tests/reader_waiting.py
# ---------------------------------------------------------------------------------------------

def _apply(rendered, rule) -> dict[str, list[str]]:
    return {rel: found for rel, r in rendered.items() if (found := rule(r.dom))}


def test_no_visible_bookkeeping(rendered):
    ratchet(_apply(rendered, textbook_rules.visible_bookkeeping), reader_waiting.VISIBLE_BOOKKEEPING,
            "bookkeeping (glue, claim, expect, compare, tables) in hidden cells", "VISIBLE_BOOKKEEPING")


def test_no_telemetry_sentence_in_running_prose(rendered):
    ratchet(_apply(rendered, textbook_rules.telemetry_in_prose), reader_waiting.TELEMETRY_IN_PROSE,
            "telemetry in a {measured} note, not in the prose", "TELEMETRY_IN_PROSE")


def test_pages_keep_the_length_rule(rendered):
    for rel, r in sorted(rendered.items()):
        n = textbook_rules.page_length(r.dom)
        if n["words"] > textbook_rules.MAX_WORDS / 2 or n["code_lines"] > textbook_rules.MAX_CODE_LINES / 2:
            print(f"{rel}: {n['words']:,} words, {n['code_lines']:,} lines of visible code")
    ratchet(_apply(rendered, textbook_rules.too_long), reader_waiting.TOO_LONG,
            f"at most {textbook_rules.MAX_WORDS:,} words and {textbook_rules.MAX_CODE_LINES} lines of "
            "visible code a page", "TOO_LONG")


def test_no_table_printed_as_text(rendered):
    ratchet(_apply(rendered, textbook_rules.tables_printed_as_source), reader_waiting.TABLES_PRINTED_AS_TEXT,
            "a table shown once, as a table", "TABLES_PRINTED_AS_TEXT")


def test_no_block_is_wider_than_the_page(rendered):
    """At 1,280 px no block's content is wider than its box (``scrollWidth > clientWidth``):
    nothing scrolls sideways, tables included (their scroll box and hint are for phones), code
    and outputs fit, shrink or wrap (``_ext/static/reader.js``), no cell's text runs over its
    edge, and the status tables fit with all their columns."""
    found = {rel: w for rel, r in rendered.items() if (w := textbook_rules.wide_blocks(r.layout))}
    ratchet(found, reader_waiting.WIDER_THAN_THE_PAGE, "no block wider than the page", "WIDER_THAN_THE_PAGE")
    status = rendered["status.html"].layout
    assert status and not status["scrolling"], f"the status tables scroll: {status and status['scrolling']}"
    text = " ".join(rendered["status.html"].page.classes.get("provenance-status-table", []))
    for header in ("torch", "started (UTC)", "duration"):
        assert header in text, f"the status tables lack the column {header!r}"


def test_textbook_rules_catch_what_they_claim():
    """Each rule on a page that breaks it, and on the same page mended."""
    visible = ('<article class="bd-article"><div class="cell docutils container">'
               '<div class="cell_input docutils container"><pre>x = f()\nglue("x", x)\n'
               '_ = claim("y", x &lt; 1, "a", "b")\nplt.show()</pre></div></div></article>')
    assert textbook_rules.visible_bookkeeping(visible) == [
        "code cell 1 ('x = f()'...): glue, claim"]
    folded = visible.replace('<div class="cell_input', '<details><div class="cell_input').replace(
        "</pre></div>", "</pre></div></details>")
    assert textbook_rules.visible_bookkeeping(folded) == []
    assert textbook_rules.visible_bookkeeping(visible.replace("glue(", "f(").replace("claim(", "g(")) == []

    # the sampler's wording before and since 5 December (perflab.core.telemetry._head)
    for sentence in ("measured over 0.80 s on NVIDIA H200: SM clock median 1,980 MHz (min 1,980, "
                     "chip max 1,980), board power up to 244 W",
                     "measured over the 0.52 s timed window on NVIDIA H200 (26 readings): SM clock "
                     "1,560 MHz time-weighted over the window",
                     "measured over 3 timed windows, 1.50 s in all on NVIDIA H200 (75 readings)"):
        prose = ('<article class="bd-article"><p>The copy took 3 ms (<span class="pasted-text">'
                 f'{sentence}</span>).</p></article>')
        assert len(textbook_rules.telemetry_in_prose(prose)) == 1, sentence
        noted = ('<article class="bd-article"><p>The copy took 3 ms.</p><details class="measured-note">'
                 f'<summary>How this was measured</summary><div class="measured-body"><p>{sentence}</p>'
                 f'</div></details><div class="cell_output"><pre>{sentence}</pre></div></article>')
        assert textbook_rules.telemetry_in_prose(noted) == []

    words = " ".join(["word"] * (textbook_rules.MAX_WORDS + 1))
    assert textbook_rules.too_long(f'<article class="bd-article"><p>{words}</p></article>')
    code = "\n".join(f"x{i} = {i}" for i in range(textbook_rules.MAX_CODE_LINES + 1))
    cell = f'<article class="bd-article"><div class="cell_input"><pre>{code}</pre></div></article>'
    assert textbook_rules.too_long(cell)
    assert not textbook_rules.too_long(cell.replace('<div class="cell_input"', '<details><div class="cell_input"'))
    assert not textbook_rules.too_long(f'<article class="bd-article"><p>{words[:3000]}</p></article>')

    table = '<article class="bd-article"><div class="cell_output"><pre>| a | b |\n|---|---:|\n| 1 | 2 |</pre></div></article>'
    assert textbook_rules.tables_printed_as_source(table)
    assert not textbook_rules.tables_printed_as_source(table.replace("|---|---:|", "a line"))

    report = {"scrolling": [{"element": "pre#codecell3", "hidden_px": 90, "text": "x"},
                            {"element": "div.pst-scrollable-table-container", "hidden_px": 50, "text": "t"}],
              "no_hint": [], "spills": [{"element": "td.text-right", "hidden_px": 12, "text": "2.05 GiB"}]}
    found = textbook_rules.wide_blocks(report)
    assert len(found) == 3 and "a table that scrolls sideways" in found[1] and "over its edge" in found[2]
    assert textbook_rules.wide_blocks({"scrolling": [], "no_hint": [], "spills": []}) == []


def test_reader_js_fits_outputs_and_tables_to_the_page(tmp_path):
    """reader.js on a page wider than its column: a long output and a wide table fit at 1,280 px
    (smaller type, or wrapped lines), and the layout probe then finds nothing wider than the
    page; without reader.js the same page breaks the rule."""
    binary = require_chromium()
    static = ROOT / "_ext" / "static"
    long_line = "copy_bandwidth = 4,245.2 GB/s (device memory copy, read + write counted) " * 6
    aligned = "\n".join(f"{'FP32':20s} {i * 1000.123:12.3f} TFLOP/s   ridge point {i * 7.5:8.1f} FLOP/byte  x"
                        for i in range(1, 4))
    # ten columns: about 1,000 px at the page's type, within the column at reader.js's smaller
    # type with DejaVu Sans (twelve needed a narrower font than Debian's today: 91 px over)
    head = "".join(f"<th>column header {i}</th>" for i in range(10))
    row = "".join(f"<td>{i * 1234.5:,.1f}</td>" for i in range(10))
    body = (f'<div class="cell_output"><pre>{long_line}</pre></div>'
            f'<div class="cell_output"><pre>{aligned}</pre></div>'
            f'<div class="cell_output"><div class="output text_html"><table class="table"><tr>{head}</tr>'
            f'<tr>{row}</tr></table></div></div>')
    for asset in ("reader.css", "reader.js"):
        (tmp_path / asset).write_bytes((static / asset).read_bytes())
    for name, scripts in (("with.html", True), ("without.html", False)):
        css = '<link rel="stylesheet" href="reader.css">' if scripts else ""
        js = '<script src="reader.js"></script>' if scripts else ""
        (tmp_path / name).write_text(
            f'<html><head>{css}<style>pre {{ overflow: auto; font-family: monospace; font-size: 13px; '
            f'padding: 16px }}</style></head><body><article class="bd-article" style="width:676px">{body}'
            f'</article>{js}</body></html>')
    url, stop = serve(tmp_path)
    try:
        fitted, raw = probe(binary, f"{url}/with.html"), probe(binary, f"{url}/without.html")
    finally:
        stop()
    assert textbook_rules.wide_blocks(fitted) == [], fitted
    assert textbook_rules.wide_blocks(raw), "the page without reader.js should break the rule"


# ---------------------------------------------------------------------------------------------
# The student edition
# ---------------------------------------------------------------------------------------------

_SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n(.*?)^[ \t]*### END HIDDEN TESTS", re.S | re.M)
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def _lines(text: str) -> set[str]:
    return {" ".join(line.split()) for line in text.splitlines()}


def solution_lines(labs: list[Path]) -> set[str]:
    """Lines of the labs' solutions and hidden tests that appear nowhere else in the book's
    sources (so finding one in the student edition means a solution leaked), 16 characters or
    longer, whitespace-normalized."""
    inside, outside = set(), set()
    # everything else the book publishes: chapters (sources and executed notebooks), perflab, pages
    sources = [*labs, *sorted((ROOT / "book").glob("*.md")), *sorted((ROOT / "book").glob("*.ipynb")),
               *sorted(ROOT.glob("pending/**/*.md")), *sorted(ROOT.glob("perflab/**/*.py")),
               *sorted(ROOT.glob("*.md"))]
    for md in sources:
        text = md.read_text(encoding="utf-8")
        if md.suffix == ".ipynb":
            text = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
        hidden = [m.group(1) for rx in (_SOLUTION, _HIDDEN) for m in rx.finditer(text)] if md in labs else []
        rest = text
        for block in hidden:
            rest = rest.replace(block, "")
            inside |= _lines(block)
        outside |= _lines(rest)
    return {line for line in inside - outside if len(line) >= 16 and not line.startswith("#")}


def published_texts(html_root: Path):
    """``(name, text)`` of everything a build publishes: pages as a reader reads them (tags
    stripped), sources, scripts, and each member of the course download."""
    for path in sorted(html_root.rglob("*")):
        if not path.is_file() or path.suffix in (".png", ".jpg", ".svg", ".woff", ".woff2", ".pdf", ".pickle"):
            continue
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    yield f"{path.name}:{name}", zf.read(name).decode("utf-8", "replace")
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".html":
            text = html_lib.unescape(re.sub(r"<[^>]+>", "", text))
        yield str(path.relative_to(html_root)), text


def leaks(html_root: Path, lines: set[str]) -> list[str]:
    """Solution lines and markers found in what ``html_root`` publishes about the labs."""
    found = []
    for name, text in published_texts(html_root):
        for line in sorted(lines & _lines(text)):
            found.append(f"{name}: solution line {line[:60]!r}")
        if "labs" in name:
            found += [f"{name}: marker {m!r}" for m in MARKERS if m in text]
    return found


@pytest.fixture(scope="session")
def student_build(tmp_path_factory) -> Path:
    """The student edition, staged by ``scripts/make_student.py --book`` and built (ahead of
    its test where the session started it: tests/background.py)."""
    job = background.result("student build")
    if job is None:
        return _student_build(tmp_path_factory.mktemp("student-book"))
    if job.error is not None:
        raise job.error
    return job.value


def _student_build(tmp: Path) -> Path:
    source = make_student.stage_book(tmp / "src")
    proc = background.run([*_jupyter_book(), "build", str(source), "-W", "-n", "--keep-going",
                           "--path-output", str(tmp / "out")], 1200, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    html = tmp / "out" / "_build" / "html"
    # -W exits 1 on a warning the book's own build tolerates too (a notebook of the table of
    # contents not executed yet: tests/book_site.py::classify_warnings); any other fails
    unexpected, _ = classify_warnings(proc.stdout + proc.stderr)
    assert (proc.returncode == 0 or not unexpected) and (html / "index.html").exists(), (
        f"the student edition did not build (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return html


def test_student_edition_publishes_no_solution(student_build):
    labs = sorted((ROOT / "labs").glob("*.md"))
    lines = solution_lines(labs)
    assert len(lines) > 10 * len(labs) / 2, f"only {len(lines)} distinctive solution lines found: the check would be empty"
    found = leaks(student_build, lines)
    assert not found, f"{len(found)} leak(s) in the student edition:\n" + "\n".join(found[:30])
    # the checks stay: every lab page still runs its check cells, and says it is the student edition
    # (a lab whose notebook waits for its first run is not in the book: tolerated, as in the build)
    built = [md for md in labs if md.with_suffix(".ipynb").exists()]
    assert len(built) >= len(labs) - 2, f"only {len(built)} of {len(labs)} labs have an executed notebook"
    for md in sorted(set(labs) - set(built)):
        print(f"{md.stem}: not executed yet, not in the student edition")
    for md in built:
        page = (student_build / "labs" / f"{md.stem}.html").read_text(encoding="utf-8")
        assert "exercises.not_done" in html_lib.unescape(re.sub(r"<[^>]+>", "", page)), md.stem
        assert "check_" in page, f"{md.stem}: the student edition lost its checks"
        assert "student edition" in page, f"{md.stem}: the page does not say it is the student edition"


def test_the_full_edition_would_fail_the_student_check(build):
    """The proof: the same check finds the solutions in the full edition."""
    labs = sorted((ROOT / "labs").glob("*.md"))
    assert leaks(build.html / "labs", solution_lines(labs)), "the leak check finds nothing in the full edition"


# ---------------------------------------------------------------------------------------------
# The checks catch what they claim to (synthetic pages; small books)
# ---------------------------------------------------------------------------------------------

def test_number_shapes_are_caught_in_prose_tables_and_outputs_not_in_code():
    page = ('<html><body><div class="bd-sidebar">+0.00 %</div><article class="bd-article">'
            '<p>The step took <strong>+0.00 %</strong> longer, 0.0e+00 of difference.</p>'
            '<table><tr><td>734,577,152 bytes</td><td>2.05e+03 MiB</td></tr></table>'
            '<div class="cell docutils container"><div class="cell_input"><pre>x = 1e-06 * 3.1415926</pre></div>'
            '<div class="cell_output"><pre>throughput 5.105e+05 tokens/s, 3.14159265 ms</pre></div></div>'
            '<p>Fine: 1.42 GB, 510k tokens/s, +0.3 %, <code>atol=1e-05</code>, 2026-12-01, v2.11.0.</p>'
            '<p>It ran at 1/1.32e+03 of the matrix rate; see https://x.org/a/1e+05.</p>'
            '</article></body></html>')
    shapes = number_shapes(page)
    texts = " | ".join(ctx for _, ctx in shapes)
    kinds = sorted(name for name, _ in shapes)
    assert kinds.count("a zero that pretends to precision") == 1
    assert kinds.count("scientific notation") == 3          # 0.0e+00, 2.05e+03, 5.105e+05
    assert kinds.count("a byte count in digits") == 1
    assert kinds.count("more digits than a measurement has") == 1
    assert kinds.count("scientific notation in a fraction") == 1     # 1/1.32e+03, not the URL
    assert "1e-06" not in texts and "atol" not in texts and "1.42 GB" not in texts


def test_figure_checks_catch_unnumbered_undeclared_and_unreferenced_figures():
    good = ('<article class="bd-article"><p>See <a href="#fig-ch01-x"><span class="std std-numref">Fig. 1.1</span></a>.</p>'
            '<div class="cell_output"><figure id="fig-ch01-x"><img src="a.png"><figcaption><p>'
            '<span class="caption-number">Fig. 1.1 </span>What.</p><div class="legend"><p class="provenance-caption">'
            'Figure measured on one NVIDIA H200 · torch 2.11 · 2026-12-01</p></div></figcaption></figure></div></article>')
    assert figure_problems(good) == []
    bare = '<article class="bd-article"><div class="cell_output"><img src="_images/abc.png"></div></article>'
    assert len(figure_problems(bare)) == 1
    no_device = good.replace("measured on one NVIDIA H200", "2× NVIDIA H200")
    assert any("which device" in p for p in figure_problems(no_device))
    published = good.replace("measured on one NVIDIA H200",
                             "of published numbers, drawn by this run: no device measured them")
    assert figure_problems(published) == []
    unreferenced = good.replace('class="std std-numref"', 'class="std"')
    assert any("no prose refers" in p for p in figure_problems(unreferenced))


def test_duplicate_figures_are_caught(tmp_path):
    from PIL import Image

    im = Image.new("RGB", (20, 10), "white")
    im.putpixel((3, 3), (0, 0, 0))
    im.save(tmp_path / "a.png")
    im.save(tmp_path / "b.png", optimize=True)     # other bytes, same picture
    Image.new("RGB", (20, 10), "black").save(tmp_path / "c.png")
    page = tmp_path / "p.html"
    once = '<article><img src="a.png"><img src="c.png"></article>'
    twice = '<article><img src="a.png"><img src="c.png"><img src="b.png"></article>'
    assert shown_twice(page, once, tmp_path) == []
    assert len(shown_twice(page, twice, tmp_path)) == 1


def test_ratchet_fails_on_new_offenders_and_on_stale_entries():
    ratchet({"a.html": ["x"]}, {"a.html"}, "r", "L")
    with pytest.raises(AssertionError, match="break the rule"):
        ratchet({"a.html": ["x"], "b.html": ["y"]}, {"a.html"}, "r", "L")
    with pytest.raises(AssertionError, match="remove them"):
        ratchet({}, {"a.html"}, "r", "L")


def test_layout_probe_catches_a_wide_block_without_hint(tmp_path):
    binary = require_chromium()
    wide = "<tr>" + "".join(f"<td>column{i}_wide_content</td>" for i in range(30)) + "</tr>"
    pages = {
        "sticks.html": f'<table>{wide}</table>',
        "nohint.html": f'<div style="overflow-x:auto"><table>{wide}</table></div>',
        "cut.html": f'<div style="overflow-x:hidden"><table>{wide}</table></div>',
        "hint.html": f'<div class="reader-scroll-hint">scroll</div><div style="overflow-x:auto"><table>{wide}</table></div>',
        "fits.html": '<table><tr><td>a</td></tr></table>',
        # a word wider than its fixed-width cell runs into the next one, inside the column
        "spills.html": '<table style="table-layout:fixed;width:300px"><tr><td>'
                       'a_word_far_wider_than_its_cell_of_one_hundred_and_fifty_px</td><td>b</td></tr></table>',
    }
    for name, body in pages.items():
        (tmp_path / name).write_text(f'<html><body><article class="bd-article" style="width:600px">{body}'
                                     '</article></body></html>')
    url, stop = serve(tmp_path)
    try:
        reports = {name: probe(binary, f"{url}/{name}") for name in pages}
    finally:
        stop()
    assert reports["sticks.html"]["sticks_out"] and layout_problems(reports["sticks.html"])
    assert reports["nohint.html"]["no_hint"] and layout_problems(reports["nohint.html"])
    assert reports["cut.html"]["cut_off"] and layout_problems(reports["cut.html"])
    assert layout_problems(reports["hint.html"]) == [] and reports["hint.html"]["scrolling"]
    assert layout_problems(reports["fits.html"]) == []
    # the textbook rule (issue 43): at 1,280 px a table that scrolls, even under its hint, and a
    # cell's word over its edge are wider than the page; a page that fits has neither
    assert textbook_rules.wide_blocks(reports["fits.html"]) == []
    assert textbook_rules.wide_blocks(reports["hint.html"])
    assert not reports["spills.html"]["sticks_out"] and layout_problems(reports["spills.html"]) == []
    assert any("over its edge" in w for w in textbook_rules.wide_blocks(reports["spills.html"])), reports["spills.html"]


def test_search_keywords_cover_the_field_s_spellings():
    words = reader_pages.search_keywords("We all-reduce the gradients with NCCL; bf16 matmuls.")
    for w in ("allreduce", "all", "reduce", "bfloat16", "bf16", "gemm", "matmul"):
        assert w in words, w
    assert reader_pages.search_keywords("Nothing here.") == []
    assert "allreduce" not in reader_pages.search_keywords("We reduce the gradients, all of them.")
    assert "redundancy" not in reader_pages.search_keywords("A zero-copy view costs zero bytes.")
    assert "redundancy" in reader_pages.search_keywords("ZeRO shards the optimizer state.")


def test_glued_numbers_are_formatted_as_a_person_would():
    """{glue:text}`key:.3g` goes through perflab.record.numbers.format_spec (chapter 1 printed
    "1/1.32e+03 of the matrix rate" through Python's format)."""
    assert reader_pages.glued_text("1320.4", ".3g") == "1,320"
    assert reader_pages.glued_text("0.0", "+.1%") == "0%"
    assert reader_pages.glued_text("1.32e-05", "") == "1.32 × 10⁻⁵"
    assert reader_pages.glued_text("0.127", ".1%") == "12.7%"
    assert reader_pages.glued_text("'a label'", "") == "a label"
    assert reader_pages.glued_text("'1.32e+03'", "s") == "1.32e+03"     # text is the page's own
    from myst_nb.ext.glue import crossref, roles
    reader_pages.install_number_format()
    assert roles.format_plain_text is reader_pages.glued_text
    assert crossref.format_plain_text is reader_pages.glued_text


def test_glued_numbers_in_a_small_book(tmp_path):
    """The proof in a built page: a number glued in a notebook and pasted with ``.3g`` and
    ``+.2%`` reads "1,320" and "0%" (Sphinx with myst-nb alone: "1.32e+03" and "+0.00%")."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Page\n\nRate {glue:text}`rate:.3g`, "
                                              "change {glue:text}`change:+.2%`.")]
    cell = nbformat.v4.new_code_cell("glue(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": repr(v)},
                                           metadata={"scrapbook": {"name": k, "mime_prefix": ""}})
                    for k, v in (("rate", 1320.4), ("change", 0.0))]
    nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "page.ipynb")
    _build_tiny_book(tmp_path, ["page"])
    text = reader_text((tmp_path / "_build" / "html" / "page.html").read_text(encoding="utf-8"))
    assert "Rate 1,320 , change 0% ." in text and "1.32e" not in text and "+0.00" not in text, text
    assert not number_shapes((tmp_path / "_build" / "html" / "page.html").read_text(encoding="utf-8"))


def test_student_reference_strips_solutions_and_keeps_checks(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = None  # set by your code\n### BEGIN SOLUTION\nx = secret_answer_value(42)\n### END SOLUTION",
                                  metadata={"nbgrader": {"grade_id": "ex3-solution", "solution": True},
                                            "tags": ["hide-input"]},
                                  outputs=[nbformat.v4.new_output("stream", name="stdout", text="the answer: 42\n")]),
        nbformat.v4.new_code_cell("check_x(x)\n### BEGIN HIDDEN TESTS\nassert hidden_check_value(x)\n### END HIDDEN TESTS",
                                  outputs=[nbformat.v4.new_output("stream", name="stdout", text="Exercise 3 passed.\n")]),
        nbformat.v4.new_markdown_cell("Think.\n<!-- BEGIN SOLUTION -->\nThe answer is 42.\n<!-- END SOLUTION -->\n"),
    ]
    nb.metadata["reference_run"] = {"devices": ["NVIDIA H200"]}
    nbformat.write(nb, tmp_path / "lab.ipynb")
    student = make_student.student_reference(tmp_path / "lab.ipynb")
    text = json.dumps(student)
    assert "secret_answer_value" not in text and "hidden_check_value" not in text and "answer is 42" not in text
    assert "not_done(3)" in student.cells[0].source and student.cells[0].outputs == []
    assert "hide-input" not in student.cells[0].metadata.get("tags", [])
    assert student.cells[1].outputs and "check_x(x)" in student.cells[1].source
    assert student.metadata["reference_run"] and student.metadata["student_edition"] is True


def test_student_reference_drops_what_hidden_tests_printed(tmp_path):
    """Lab 8's reference showed "✓ GPT-2 small's parameter count: 124.4M is right." from a hidden
    test in the student edition; the visible check's line stays."""
    out = nbformat.v4.new_output(
        "stream", name="stdout",
        text="✓ predicted all-reduce time: 1.08 ms is right.\n"
             "✓ GPT-2 small's parameter count: 124.4M is right.\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            'check_close(t, want, "predicted all-reduce time")\n### BEGIN HIDDEN TESTS\n'
            'check_close(count(12, 768), 124_439_808,\n    "GPT-2 small\'s parameter count")\n'
            "### END HIDDEN TESTS", outputs=[out]),
        nbformat.v4.new_code_cell(
            '### BEGIN HIDDEN TESTS\nassert secret(x), "no label printed"\n### END HIDDEN TESTS',
            outputs=[nbformat.v4.new_output("stream", name="stdout", text="42 exactly\n")]),
    ]
    nbformat.write(nb, tmp_path / "lab.ipynb")
    student = make_student.student_reference(tmp_path / "lab.ipynb")
    first = "".join(o["text"] for o in student.cells[0].outputs)
    assert "all-reduce time" in first and "124.4M" not in first and "parameter count" not in first
    assert student.cells[1].outputs == []


def test_student_edition_of_every_lab_hides_its_hidden_tests_output():
    """No hidden test's label appears in a lab's outputs as the student edition shows them."""
    for ipynb in sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb")):
        src = nbformat.read(ipynb, as_version=4)
        labels = [lab for c in src.cells if c.cell_type == "code"
                  for lab in make_student._hidden_labels(c.source)]
        text = json.dumps([c.get("outputs", []) for c in make_student.student_reference(ipynb).cells
                           if c.cell_type == "code"], ensure_ascii=False)
        assert not [lab for lab in labels if lab in text], ipynb.name


def _small_book(tmp: Path, cells: list, run: dict, extra_config: str = "") -> Path:
    """A one-page book with this repository's extensions; returns its built page."""
    tmp.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["reference_run"] = run
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp / "page.ipynb")
    (tmp / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    (tmp / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: 'off'\nsphinx:\n  local_extensions:\n"
        f"    provenance_pages: {ROOT / '_ext'}\n    reader_pages: {ROOT / '_ext'}\n"
        "  config:\n    reader_bundle: false\n" + extra_config)
    proc = subprocess.run([*_jupyter_book(), "build", str(tmp), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return tmp / "_build" / "html" / "page.html"


def _png() -> str:
    import base64
    import io

    from PIL import Image

    im = Image.new("RGB", (40, 20), "white")
    im.putpixel((5, 5), (200, 0, 0))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_figure_convention_gives_a_numbered_figure_that_names_its_device(tmp_path):
    """CONTRIBUTING.md's figure cell (mystnb.figure + perflab.measured_on) in a real build,
    with ``execute_notebooks: off`` as the book has it."""
    def figure_cell(name, caption, measured_on):
        return nbformat.v4.new_code_cell(
            "finish(fig)", metadata={"mystnb": {"figure": {"name": name, "caption": caption}},
                                     "perflab": {"measured_on": measured_on}},
            outputs=[nbformat.v4.new_output("display_data", data={"image/png": _png(), "text/plain": "<Figure>"})])

    run = {"devices": ["NVIDIA H200", "NVIDIA H200"], "cuda": "13.0", "torch": "2.11.0", "python": "3.12",
           "started": "2026-12-01T10:00:00Z", "host": {"cpu": "AMD EPYC 9654", "logical_cores": 32}}
    page = _small_book(tmp_path, [
        nbformat.v4.new_markdown_cell("# A page\n\n{numref}`fig-ch99-loader` and {numref}`fig-ch99-step`. "
                                      "Course: {course-download}`the course (.zip)` · "
                                      "{book-pdf}`the book (.pdf)`\n\n"
                                      "**On paper**: {book-pdf}`the book as one PDF`."),
        figure_cell("fig-ch99-loader", "Images per second of the DataLoader against its workers.", "host"),
        figure_cell("fig-ch99-step", "Milliseconds per training step, eager and compiled.", "gpu"),
    ], run).read_text(encoding="utf-8")
    assert figure_problems(page) == []
    assert "Fig. 1" in page and "Fig. 2" in page
    assert "measured on the host CPU, AMD EPYC 9654 (32 logical cores)" in page
    assert "measured on one NVIDIA H200 (one of the run" in page
    assert 'alt="Images per second of the DataLoader' in page
    # no PDF built for this book: no link to a missing file, and no word of the build (reader
    # review M7): the link, its " · " and a paragraph that only offered it are left out
    text = re.sub(r"<[^>]+>", "", page)   # Sphinx writes a literal word by word in spans
    assert reader_pages.PDF_NAME not in page and "make pdf" not in text
    assert "the course (.zip)" in text and "On paper" not in text and "·" not in text.split(
        "the course (.zip)")[1][:20]


def test_provenance_line_names_the_device_that_did_the_work():
    run = {"devices": ["NVIDIA H200", "NVIDIA H200"], "cuda": "13.0", "torch": "2.11.0",
           "started": "2026-12-01T10:00:00Z", "host": {"cpu": "Intel Xeon 8480", "logical_cores": 16}}
    assert "the host CPU, Intel Xeon 8480 (16 logical cores)" in provenance_pages.caption_text(run, ["figure"], "host")
    assert "one NVIDIA H200 (one of the run's 2)" in provenance_pages.caption_text(run, ["figure"], "gpu")
    assert "measured on 2× NVIDIA H200" in provenance_pages.caption_text(run, ["figure"], "gpus")
    old = dict(run, host=None)
    assert "model not recorded" in provenance_pages.caption_text(old, ["figure"], "host")
    boxed = dict(run, host={"cpu": "Intel Xeon 8480", "logical_cores": 16, "usable_cores": 4})
    assert "(4 of its 16 logical cores usable by the run)" in provenance_pages.device_words(boxed, "host")
    published = provenance_pages.caption_text(run, ["figure"], "published")
    assert "of published numbers" in published and "no device measured them" in published
    assert "H200" not in published and "Xeon" not in published
    single = dict(run, devices=["NVIDIA H200"])
    assert provenance_pages.device_words(single, "gpu") == "one NVIDIA H200"


def test_measured_note_folds_telemetry_under_its_paragraph(tmp_path):
    """The {measured} directive with a glued telemetry sentence: a folded note in HTML (open in
    the single-page build that becomes the PDF), which the telemetry rule accepts; the same
    sentence in the paragraph breaks the rule."""
    sentence = "measured over 0.52 s on NVIDIA H200: memory traffic, whose rate follows the memory clock"
    glue_out = nbformat.v4.new_output("display_data", data={"text/plain": repr(sentence)},
                                      metadata={"scrapbook": {"name": "copy_clock", "mime_prefix": ""}})
    run = {"devices": ["NVIDIA H200"], "cuda": "13.0", "torch": "2.11.0", "started": "2026-12-01T10:00:00Z"}
    cells = [nbformat.v4.new_markdown_cell("# A page"),
             nbformat.v4.new_code_cell("glue('copy_clock', s)", metadata={"tags": ["remove-cell"]},
                                       outputs=[glue_out]),
             nbformat.v4.new_markdown_cell("The copy ran at 4.2 TB/s.\n\n:::{measured}\nThe copy was "
                                           "{glue:text}`copy_clock`.\n:::\n")]
    page = _small_book(tmp_path / "noted", cells, run, extra_config=(
        "parse:\n  myst_enable_extensions:\n    - colon_fence\n")).read_text(encoding="utf-8")
    assert '<details class="measured-note"><summary>How this was measured</summary>' in page
    assert sentence in html_lib.unescape(page) and textbook_rules.telemetry_in_prose(page) == []
    cells[2] = nbformat.v4.new_markdown_cell("The copy ran at 4.2 TB/s ({glue:text}`copy_clock`).")
    inline = _small_book(tmp_path / "inline", cells, run).read_text(encoding="utf-8")
    assert len(textbook_rules.telemetry_in_prose(inline)) == 1


def test_measured_note_is_open_in_the_single_page_build():
    class Translator:
        def __init__(self, name):
            self.builder = type("B", (), {"name": name})()
            self.body = []

        def encode(self, text):
            return text

    node = {"summary": "How this was measured"}
    for name, opened in (("html", False), ("singlehtml", True)):
        t = Translator(name)
        reader_pages._visit_measured_html(t, node)
        assert ("<details class=\"measured-note\" open>" in t.body[0]) == opened, t.body


def test_the_pdf_is_linked_when_built(tmp_path):
    """The front page's {book-pdf} role links the published PDF when make pdf has built one
    (the file is copied into the build); without one it explains (the figure test above)."""
    cells = [nbformat.v4.new_markdown_cell("# A page\n\nRead {book-pdf}`the book as one PDF`.")]
    run = {"devices": ["NVIDIA H200"], "cuda": "13.0", "torch": "2.11.0", "started": "2026-12-01T10:00:00Z"}
    pdf = tmp_path / "book.pdf"
    pdf.write_bytes(b"%PDF-1.4 a stand-in\n")
    page = _small_book(tmp_path / "book", cells, run, extra_config=f"    reader_pdf: {pdf}\n")
    html = page.read_text(encoding="utf-8")
    assert f'href="{reader_pages.PDF_NAME}"' in html and "make pdf" not in html
    assert (page.parent / reader_pages.PDF_NAME).read_bytes() == pdf.read_bytes()


def test_book_pdf_prints_a_page_offline(tmp_path):
    """scripts/book_pdf.py's printing step (the whole book takes a minute; one page shows it)."""
    require_chromium()
    import book_pdf

    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "index.html").write_text(
        "<html><body><h1>A book</h1>" + "<p>Prose. </p>" * 200 + "</body></html>")
    out = book_pdf.print_pdf(book_pdf.find_chromium(), tmp_path / "html", tmp_path / "book.pdf", budget_ms=2000)
    assert out.read_bytes()[:5] == b"%PDF-"


# ---------------------------------------------------------------------------------------------
# The PDF shows every table whole (issue 43)
# ---------------------------------------------------------------------------------------------

def require_pdftotext() -> str:
    """poppler's pdftotext (scripts/install_browser.sh installs it beside Chromium)."""
    import shutil

    path = shutil.which("pdftotext")
    if path:
        return path
    reason = "pdftotext is not installed (run scripts/install_browser.sh: poppler-utils)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: the PDF's tables must be checked in CI")
    pytest.skip(reason)


# The book's widest tables, in shape: chapter 10's speed ladder (a rung, then columns of a number
# and its unit under a header of words or a short one like "MFU", one column more than the book's
# eight) and the status tables (eight columns of
# long words, in a cell output). Every value is unique, so each cell can be found in the PDF.
_LADDER = [["rung"] + [f"M{c}" if c % 4 == 1 else f"head{c} of the column" for c in range(1, 10)]] + [
    [rung] + [f"{r}{c}.5" + ("k", " %", "x", " GiB")[c % 4] for c in range(1, 10)]
    for r, rung in enumerate(("fp32 eager", "pinned loader", "TF32 matmuls", "one graph per step"))]
_STATUS = [["page", "needs", "current with its source", "device(s)", "torch", "started (UTC)", "duration",
            "verdicts agreeing with an earlier run"]] + [
    [f"Chapter{i} why training is slow: compute, bandwidth and overhead", "1 GPU", "current",
     "NVIDIA H100 80GB HBM3", f"2.11.0+cu13{i}", f"2026-12-0{i} 18:3{i}", f"3{i}.6 s",
     f"no earlier run{i} of this source on this device"] for i in range(1, 4)]


def _table_html(rows: list[list[str]], numbers_from: int) -> str:
    """A table as MyST writes one (columns from ``numbers_from`` on are right-aligned numbers),
    in the theme's scrolling box."""
    def cell(tag, k, v, head):
        align = "text-right" if k >= numbers_from else "text-left"
        return f'<{tag} class="{"head " if head else ""}{align}"><p>{v}</p></{tag}>'
    head = "".join(cell("th", k, v, True) for k, v in enumerate(rows[0]))
    body = "".join("<tr>" + "".join(cell("td", k, v, False) for k, v in enumerate(r)) + "</tr>" for r in rows[1:])
    return (f'<div class="pst-scrollable-table-container"><table class="table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def print_wide_tables(folder: Path, ours: bool) -> tuple[float, list[tuple[float, float, float, str]]]:
    """Print a page holding :data:`_LADDER` and :data:`_STATUS` with the book's theme (and, with
    ``ours``, reader.css and reader.js) by ``scripts/book_pdf.py``; returns the PDF's page width
    and its words as ``(xMin, xMax, yMin, word)`` (pdftotext -bbox)."""
    import shutil

    import book_pdf
    import pydata_sphinx_theme
    import sphinx_book_theme

    html = folder / "html"
    html.mkdir(parents=True)
    links = ""
    for k, (package, rel) in enumerate(((pydata_sphinx_theme, "pydata_sphinx_theme/static/styles/pydata-sphinx-theme.css"),
                                        (sphinx_book_theme, "sphinx_book_theme/static/styles/sphinx-book-theme.css"))):
        shutil.copy(Path(package.__file__).parent / "theme" / rel, html / f"theme{k}.css")
        links += f'<link rel="stylesheet" href="theme{k}.css">'
    script = ""
    if ours:
        for asset in ("reader.css", "reader.js"):
            shutil.copy(ROOT / "_ext" / "static" / asset, html / asset)
        links += '<link rel="stylesheet" href="reader.css">'
        script = '<script src="reader.js"></script>'
    tables = (_table_html(_LADDER, 1) + '<div class="cell_output docutils container"><div class="output text_html">'
              + _table_html(_STATUS, 99) + "</div></div>")
    (html / "index.html").write_text(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{links}</head><body>'
        '<div class="bd-container"><div class="bd-main"><div class="bd-content"><div class="bd-article-container">'
        f'<article class="bd-article"><h1>Wide tables</h1>{tables}</article></div></div></div></div>{script}'
        "</body></html>", encoding="utf-8")
    pdf = book_pdf.print_pdf(book_pdf.find_chromium(), html, folder / "tables.pdf", budget_ms=2000)
    bbox = subprocess.run([require_pdftotext(), "-bbox", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    width = float(re.search(r'<page width="([\d.]+)"', bbox).group(1))
    words = [(float(a), float(b), float(y), html_lib.unescape(w)) for a, y, b, w in re.findall(
        r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="[\d.]+">([^<]*)</word>', bbox)]
    return width, words


def clipped_cells(width: float, words: list[tuple[float, float, float, str]]) -> list[str]:
    """Cells of the two tables that the PDF does not show whole: a word missing, or past the
    page's edge; a number printed on another line than its unit."""
    found = {t for _, _, _, w in words for t in re.findall(r"\w+", w)}
    out = [f"past the page's edge ({x1:.0f} of {width:.0f} pt): {w!r}" for _, x1, _, w in words if x1 > width]
    for row in _LADDER + _STATUS:
        for value in row:
            lost = [t for t in re.findall(r"\w+", value) if t not in found]
            if lost:
                out.append(f"cell {value!r}: {lost} not in the PDF")
    at = {w: k for k, (_, _, _, w) in enumerate(words)}     # the numbers are unique
    for row in _LADDER[1:]:
        for value in row[1:]:
            number, _, unit = value.partition(" ")
            k = at.get(number)
            if unit and k is not None and not (k + 1 < len(words) and words[k + 1][3] == unit
                                               and abs(words[k + 1][2] - words[k][2]) < 1):
                out.append(f"{value!r}: the number and its unit on two lines")
    return out


def test_book_pdf_prints_wide_tables_whole(tmp_path):
    """reader.css's print rules on tables of the book's widest shapes, in the theme's scrolling
    boxes, printed as scripts/book_pdf.py prints the book: every cell is in the PDF and inside
    the page, every number on one line with its unit. Without reader.css the same page loses its
    last columns (what the PDF did before the print rules), so the check sees clipping."""
    require_chromium()
    fitted = clipped_cells(*print_wide_tables(tmp_path / "ours", ours=True))
    assert fitted == [], "\n".join(fitted)
    raw = clipped_cells(*print_wide_tables(tmp_path / "theme-only", ours=False))
    assert any("not in the PDF" in p for p in raw), "the theme alone should clip a table this wide"


def test_book_pdf_finds_a_table_whose_last_column_is_not_printed():
    """scripts/book_pdf.py's check of the whole book's PDF (make pdf fails on a clipped table):
    a table whose last column's words are missing from the PDF's text is named, a whole one
    (maths in a cell left aside) is not."""
    import book_pdf

    page = ("<table><tr><th>rung</th><th>tokens/s</th></tr><tr><td>eager</td><td>41.7k</td></tr></table>"
            "<table><tr><th>forward</th><th>derivative</th></tr>"
            r"<tr><td>relu</td><td>\(1[\text{out}&gt;0]\) of it</td></tr></table>")
    assert book_pdf.clipped_tables(page, "rung tokens/s eager 41.7k forward derivative relu 1 of it") == []
    clipped = book_pdf.clipped_tables(page, "rung eager forward derivative relu 1 of it")
    assert len(clipped) == 1 and "'tokens', 's', '41', '7k'" in clipped[0], clipped


def test_backticks_in_glued_text_become_inline_code_that_wraps():
    """Reader review R5: glued sentences showed literal backticks (`nvjet_sm90_...`, `nsys`)
    and their long kernel names made pages wider than a phone."""
    from docutils import nodes
    from docutils.utils import new_document
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    doc = new_document("test", get_default_settings(Parser))
    para = nodes.paragraph()
    text = "cuBLAS ran `cutlass::Kernel2` instead of `nvjet_sm90_tst_256x128` x2"
    para += nodes.inline(text, text, classes=["pasted-text"])
    para += nodes.Text(" and `plain prose` stays as written")
    doc += para
    assert reader_pages.render_glued_code(None, doc) == 2
    codes = [n.astext() for n in doc.findall(nodes.literal)]
    assert codes == ["cutlass::Kernel2", "nvjet_sm90_tst_256x128"]
    assert "`" not in doc.findall(nodes.inline).__next__().astext()
    assert doc.astext() == ("cuBLAS ran cutlass::Kernel2 instead of nvjet_sm90_tst_256x128 x2"
                            " and `plain prose` stays as written")
    css = (ROOT / "_ext" / "static" / "reader.css").read_text()
    at = css.index("span.pasted-text code {")
    rule = css[css.rindex("*/", 0, at):css.index("}", at)]
    assert "overflow-wrap: anywhere" in rule and "article.bd-article p code" in rule


def test_glued_text_is_set_like_the_prose_around_it():
    """Reader review R4: myst-nb bolds every glued value, so a paragraph of glued numbers and
    verdicts read as one bold run; reader.css sets them in the prose's weight (a page bolds a
    headline number itself), by a rule more specific than mystnb.css's."""
    css = (ROOT / "_ext" / "static" / "reader.css").read_text()
    at = css.index("article.bd-article span.pasted-text,")
    rule = css[at:css.index("}", at)]
    assert "font-weight: normal" in rule
