"""The built book as a reader sees it: build it once, then open every page in headless Chromium.

The session fixtures (``tests/book_site.py``, shared with ``tests/test_reader.py``) build the book
with ``jupyter-book build . --all -W -n --keep-going`` into a temporary folder (a fresh build, so every page's warnings are reported, and nobody else's
``_build`` is touched), serves it over HTTP on 127.0.0.1 (as a reader gets it: ``file://`` pages
cannot fetch, so search would fail for the wrong reason) and loads every HTML page in Debian's
``chromium`` with ``--dump-dom``. The tests then fail on

* a build warning (except a table-of-contents entry whose notebook has not been executed yet,
  which ``scripts/execute.py --check`` reports, and a glue key missing from a notebook executed
  on a CPU, where GPU-only cells glue nothing),
* a page that does not render (Chromium fails, no title, no article text) or raises an uncaught
  JavaScript error,
* a broken internal link or anchor, a missing stylesheet, script or image,
* an image that does not decode or is blank (one colour), an empty figure or output box, a widget
  view left without a kernel (a blank box),
* a notebook page without its download (.ipynb) button, provenance footer or figure captions,
  or with launch buttons that point nowhere real (none while ``repository.url`` is empty);
* an asset loaded from the network (MathJax is vendored; the book must work offline); a status page missing a notebook; a glossary entry without its Chinese term;
  a search that finds nothing.

Screenshots of the front page and the first chapter are written to ``_build/screenshots/`` and
their paths printed. Without Chromium the tests are skipped, except when the environment variable
``CI`` is set: CI must run them (``.ci/run`` installs Chromium with scripts/install_browser.sh).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import yaml

from book_site import (_toc_docnames, chromium, classify_warnings,
                       internal_target, notebook_pages, parse_html, require_chromium)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "_build" / "screenshots"
CJK = re.compile(r"[\u4e00-\u9fff]")


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

def test_build_has_no_warnings(build):
    for line in build.tolerated:
        print(f"tolerated: {line}")
    assert not build.unexpected, (
        f"`jupyter-book build . -W -n --keep-going` warned {len(build.unexpected)} time(s):\n"
        + "\n".join(build.unexpected))


def test_every_page_renders_without_script_errors(build, rendered):
    assert "index.html" in rendered, "the front page was not built"
    problems = []
    for rel, r in rendered.items():
        if r.returncode != 0 or not r.dom.strip():
            problems.append(f"{rel}: chromium exited {r.returncode} with {len(r.dom)} bytes of DOM")
            continue
        if not r.page.title.strip():
            problems.append(f"{rel}: no <title>")
        if rel not in ("genindex.html", "search.html") and (r.page.h1 == 0 or r.page.article_text < 200):
            problems.append(f"{rel}: no rendered article (h1: {r.page.h1}, {r.page.article_text} characters)")
        for line in r.console:
            local = "127.0.0.1" in line
            if local and ("Uncaught" in line or "SyntaxError" in line or "ReferenceError" in line):
                problems.append(f"{rel}: JavaScript error: {line.split(':CONSOLE', 1)[-1][:300]}")
    assert not problems, "\n".join(problems)


def test_internal_links_and_assets_resolve(build, rendered):
    problems = []
    ids_of: dict[Path, set[str]] = {}

    def ids(path: Path) -> set[str]:
        if path not in ids_of:
            ids_of[path] = parse_html(path.read_text(encoding="utf-8", errors="replace")).ids
        return ids_of[path]

    for rel, r in rendered.items():
        for ref in r.page.links + r.page.assets:
            target = internal_target(r.path, ref, build.html)
            if target is None:
                continue
            path, fragment = target
            if not path.exists():
                problems.append(f"{rel}: link or asset {ref!r} -> missing {path.relative_to(build.html.parent)}")
            elif fragment and path.suffix == ".html" and fragment not in ids(path) and path != r.path:
                problems.append(f"{rel}: link {ref!r}: no id {fragment!r} in {path.name}")
            elif fragment and path == r.path and fragment not in r.page.ids and fragment not in ids(path):
                problems.append(f"{rel}: link {ref!r}: no id {fragment!r} on the page")
    assert not problems, f"{len(problems)} broken internal reference(s):\n" + "\n".join(sorted(set(problems)))


def _image_problem(path: Path) -> str | None:
    data = path.read_bytes()
    if not data:
        return "empty file"
    if path.suffix.lower() == ".svg":
        return None if b"<svg" in data[:4096] else "not an SVG"
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            if im.width < 2 or im.height < 2:
                return f"{im.width}x{im.height} pixels"
            extrema = im.convert("RGB").getextrema()
    except Exception as err:  # any decoding failure is the defect being tested for
        return f"does not decode ({err})"
    if all(lo == hi for lo, hi in extrema):
        return "blank (a single colour)"
    return None


def test_images_exist_and_figures_are_not_empty(build, rendered):
    problems, seen = [], {}
    for rel, r in rendered.items():
        for src in r.page.images:
            target = internal_target(r.path, src, build.html)
            if target is None:
                continue
            path = target[0]
            if not path.exists():
                problems.append(f"{rel}: image {src!r} is missing")
                continue
            if path not in seen:
                seen[path] = _image_problem(path)
            if seen[path]:
                problems.append(f"{rel}: image {src!r} is {seen[path]}")
        if r.page.empty_outputs:
            problems.append(f"{rel}: {r.page.empty_outputs} empty cell output box(es)")
        if r.page.empty_figures:
            problems.append(f"{rel}: {r.page.empty_figures} <figure> element(s) with no image")
        if r.page.widget_views:
            problems.append(f"{rel}: {r.page.widget_views} ipywidgets view(s) that render blank without a kernel")
    assert not problems, "\n".join(problems)


def test_notebook_pages_offer_download_launch_footer_and_captions(build, rendered):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = (cfg["repository"]["url"] or "").rstrip("/")
    pages = notebook_pages(build)
    assert pages, "no page was built from a notebook"
    problems = []
    for rel in pages:
        r = rendered[rel]
        ipynb = rel[: -len(".html")] + ".ipynb"
        downloads = [h for h in r.page.links if h.split("?")[0].endswith(f"_sources/{ipynb}")]
        if not downloads:
            problems.append(f"{rel}: no download link to _sources/{ipynb}")
        for label in ("Binder", "Colab"):
            hrefs = [h for h in r.page.links if label.lower() in h.lower()]
            if not repo:  # no public address yet: no button may link to an invented one
                if hrefs:
                    problems.append(f"{rel}: a {label} button although repository.url is not set: {hrefs[0]}")
            elif not hrefs:
                problems.append(f"{rel}: no {label} launch button")
            elif not any(repo.split("github.com/")[-1] in unquote(h) for h in hrefs):
                problems.append(f"{rel}: the {label} button does not point at {repo}: {hrefs[0]}")
        footers = r.page.classes.get("provenance-footer", [])
        if len(footers) != 1 or "This page was run on" not in footers[0]:
            problems.append(f"{rel}: expected one provenance footer, found {footers}")
        source = ROOT / ipynb
        nb = json.loads(source.read_text())
        figures = sum(1 for c in nb["cells"] for o in c.get("outputs", [])
                      if any(k.startswith("image/") for k in o.get("data", {})))
        captions = r.page.classes.get("provenance-caption", [])
        if figures and not captions:
            problems.append(f"{rel}: {figures} figure output(s) but no provenance caption")
        if len(captions) > figures:
            problems.append(f"{rel}: {len(captions)} captions for {figures} figure(s): duplicated")
        run = nb["metadata"].get("reference_run") or {}
        for cap in captions:
            if run.get("torch") and run["torch"] not in cap:
                problems.append(f"{rel}: caption {cap!r} does not name torch {run['torch']}")
    assert not problems, "\n".join(problems)


def _is_notebook(docname: str) -> bool:
    md = ROOT / f"{docname}.md"
    if (ROOT / f"{docname}.ipynb").exists():
        return True
    return md.exists() and "format_name: myst" in md.read_text(encoding="utf-8")[:2000]


def test_the_book_works_offline(build, rendered):
    """Math renders without a network (MathJax vendored into _static) and no page loads a script
    or stylesheet from another host."""
    static = build.html / "_static" / "mathjax"
    assert (static / "tex-mml-chtml.js").exists(), "MathJax was not vendored into the build"
    assert list((static / "output" / "chtml" / "fonts").rglob("*.woff")), "no MathJax fonts"
    remote = {f"{rel}: {a}" for rel, r in rendered.items() for a in r.page.assets
              if a.startswith(("http:", "https:", "//"))}
    assert not remote, "pages load assets from the network:\n" + "\n".join(sorted(remote)[:10])


def test_status_page_lists_every_notebook_with_its_state(build, rendered):
    assert "status.html" in rendered, "no status page (status.md in _toc.yml)"
    r = rendered["status.html"]
    tables = " ".join(r.page.classes.get("provenance-status-table", []))
    linked = set()
    for href in r.page.links:
        target = internal_target(r.path, href, build.html)
        if target is not None:
            linked.add(target[0].resolve())
    notebooks = [d for d in _toc_docnames() if _is_notebook(d)]
    assert notebooks, "_toc.yml names no notebook"
    missing = []
    for docname in notebooks:
        html = (build.html / f"{docname}.html").resolve()
        listed = html in linked if html.exists() else docname in tables
        if not listed:
            missing.append(docname)
    assert not missing, f"the status page lacks {missing}"
    rows = re.findall(r"[✓⚠✗—] (current|current code, but a CPU run|stale: [^✓⚠✗—]*|not executed yet|no reference_run)",
                      tables)
    assert len(rows) == len(notebooks), f"{len(rows)} status entries for {len(notebooks)} notebooks: {tables[:500]}"


def test_glossary_entries_have_a_chinese_term(build, rendered):
    assert "glossary.html" in rendered, "no glossary page (glossary.md in _toc.yml)"
    page = rendered["glossary.html"].page
    terms = page.classes.get("glossary-dt", [])
    assert len(terms) >= 2 * 40, f"expected at least 40 entries of two terms, found {len(terms)} terms"
    english = [t for t in terms if not CJK.search(t)]
    chinese = [t for t in terms if CJK.search(t)]
    assert len(english) == len(chinese), f"{len(english)} English terms but {len(chinese)} Chinese ones"
    for needed in ("arithmetic intensity", "achieved bandwidth", "MFU", "all-reduce", "activation checkpointing"):
        assert any(t.startswith(needed) for t in english), f"the glossary lacks {needed!r}"


SOURCE_BOOK = "不止量化及LORA：原生PyTorch性能及記憶體優化精解"
SOURCE_AUTHORS = ("張愛玲", "Ailing Zhang", "楊占略", "Zhanlue Yang")


def test_the_source_book_is_credited_on_the_front_page_and_in_the_bibliography(build):
    """Issue 43: the front page and the bibliography name the source book and its authors and
    cite it; the front page says which of its chapters each of our ten follows."""
    front = (build.html / "index.html").read_text(encoding="utf-8")
    biblio = (build.html / "bibliography.html").read_text(encoding="utf-8")
    for name, page in (("front page", front), ("bibliography", biblio)):
        assert SOURCE_BOOK in page, f"the {name} does not name the source book"
        assert all(a in page for a in SOURCE_AUTHORS[1::2]), f"the {name} does not name its authors"
        assert "ZY24" in page, f"the {name} does not cite the source book (its label, ZY24a or ZY24b)"
        assert "ailzhang/EfficientPyTorch" in page, f"the {name} does not name the companion code"
    assert all(a in front for a in SOURCE_AUTHORS[0::2]), "the front page lacks the authors' Chinese names"
    table = front[front.index("authors-and-credits"):]
    rows = re.findall(r"<tr[^>]*>\s*<td[^>]*>(?:<p>)?(\d+), ", table)
    assert rows[:10] == [str(n) for n in range(1, 11)], f"the credit table lists our chapters {rows}"


def test_bibliography_keys_are_unique():
    keys = [m.group(1) for f in sorted((ROOT / "bib").glob("*.bib"))
            for m in re.finditer(r"^@\w+\{([^,\s]+),", f.read_text(encoding="utf-8"), re.M)]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert keys and not dupes, f"keys in more than one entry of bib/*.bib: {dupes}"


def test_search_finds_the_glossary_and_a_chapter(build, server):
    binary = require_chromium()
    proc = chromium(binary, f"{server}/search.html?q=roofline", "--dump-dom")
    results = re.findall(r'<ul class="search">(.*?)</ul>', proc.stdout, re.S)
    hits = re.findall(r'<li[^>]*>\s*<a href="([^"]+)"', results[0]) if results else []
    assert any("glossary" in h for h in hits), f"search for 'roofline' found {hits}"
    assert any(h.startswith(("book/", "labs/")) for h in hits), f"search for 'roofline' found {hits}"


def test_screenshots_of_front_page_and_a_chapter(build, server):
    binary = require_chromium()
    chapter = next((d for d in _toc_docnames() if d.startswith("book/") and (build.html / f"{d}.html").exists()),
                   None)
    assert chapter, "no chapter page was built"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, rel in (("front_page", "index.html"), (Path(chapter).name, f"{chapter}.html")):
        out = SCREENSHOTS / f"{name}.png"
        out.unlink(missing_ok=True)
        proc = chromium(binary, f"{server}/{rel}", "--hide-scrollbars", "--window-size=1280,2400",
                        f"--screenshot={out}")
        assert out.exists(), f"no screenshot of {rel}: {proc.stderr[-500:]}"
        problem = _image_problem(out)
        assert problem is None, f"the screenshot of {rel} is {problem}"
        print(f"screenshot of {rel}: {out}")


# ---------------------------------------------------------------------------------------------
# The checks themselves catch what they claim to (no browser or build needed)
# ---------------------------------------------------------------------------------------------

def test_checks_catch_empty_outputs_blank_widgets_and_empty_figures():
    page = parse_html(
        '<html><head><title>t</title></head><body><main><h1>T</h1>'
        '<div class="cell_output docutils container"><div class="output"></div></div>'
        '<div class="cell_output"><img src="a.png"></div>'
        '<div class="cell_output"><pre>text</pre></div>'
        '<figure><figcaption>no image</figcaption></figure><figure><svg></svg></figure>'
        '<script type="application/vnd.jupyter.widget-view+json">{}</script>'
        '<a href="x.html#frag">x</a><img src="../_images/b.png"><span id="here"></span>'
        '</main></body></html>')
    assert page.empty_outputs == 1 and page.empty_figures == 1 and page.widget_views == 1
    assert page.links == ["x.html#frag"] and page.images == ["a.png", "../_images/b.png"]
    assert "here" in page.ids and page.h1 == 1 and page.title == "t"


def test_checks_resolve_internal_targets_only(tmp_path):
    page = tmp_path / "book" / "ch.html"
    assert internal_target(page, "https://example.org/x.html", tmp_path) is None
    assert internal_target(page, "mailto:a@b", tmp_path) is None
    assert internal_target(page, "#top", tmp_path) == (page, "top")
    target, frag = internal_target(page, "../status.html#row", tmp_path)
    assert target == (tmp_path / "status.html").resolve() and frag == "row"


def test_checks_reject_blank_and_broken_images(tmp_path):
    from PIL import Image

    blank, drawn, broken = tmp_path / "blank.png", tmp_path / "drawn.png", tmp_path / "broken.png"
    Image.new("RGB", (20, 10), "white").save(blank)
    im = Image.new("RGB", (20, 10), "white")
    im.putpixel((5, 5), (0, 0, 0))
    im.save(drawn)
    broken.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert _image_problem(blank) == "blank (a single colour)"
    assert _image_problem(drawn) is None
    assert _image_problem(broken).startswith("does not decode")


def test_only_expected_warnings_are_tolerated(tmp_path, monkeypatch):
    cpu = tmp_path / "cpu.ipynb"
    cpu.write_text(json.dumps({"metadata": {"reference_run": {"devices": ["cpu: X"], "cuda": None}}}))
    gpu = tmp_path / "gpu.ipynb"
    gpu.write_text(json.dumps({"metadata": {"reference_run": {"devices": ["NVIDIA H200"], "cuda": "13.0"}}}))
    log = "\n".join([
        f"\x1b[91m{cpu}:10: WARNING: No key 'a' found in glue data for this document.\x1b[39;49;00m",
        f"{gpu}:10: WARNING: No key 'b' found in glue data for this document.",
        "/r/index.md:: WARNING: toctree contains reference to nonexisting document 'book/99_never' [etoc.ref]",
        "/r/x.md:3: WARNING: undefined label: 'nowhere'",
        "reading sources... [100%] index",
    ])
    unexpected, tolerated = classify_warnings(log)
    assert len(tolerated) == 2 and len(unexpected) == 2
    assert any("'b'" in u for u in unexpected) and any("undefined label" in u for u in unexpected)
