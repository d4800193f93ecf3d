"""_ext/provenance_pages.py (footers, captions, status page, widget views, scripts) and
perflab.record.runs.source_code_sha256, on a tiny book built with Sphinx in a temporary folder."""

import base64
import hashlib
import io
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from perflab.record.runs import code_sha256, source_code_sha256

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import provenance_pages as PP  # noqa: E402

from myst_source import HEADER  # noqa: E402
GPU_RUN = {"devices": ["NVIDIA H200", "NVIDIA H200"], "driver": "580.159.04", "cuda": "13.0",
           "torch": "2.11.0+cu130", "python": "3.12.3", "started": "2026-11-30T10:00:00Z", "duration_s": 41.2,
           "git": "0123456789abcdef"}


def png_bytes(blank=False) -> str:
    from PIL import Image

    im = Image.new("RGB", (8, 8), "white")
    if not blank:
        im.putpixel((3, 3), (200, 0, 0))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def write_pair(folder: Path, name: str, cells: list[str], run: dict | None, outputs=None, tags=None) -> None:
    """A MyST source ``name.md`` and its executed ``name.ipynb`` (outputs given per cell)."""
    body = HEADER + f"\n# {name.title()} page\n\nSome prose about {name}.\n"
    for src in cells:
        body += "\n```{code-cell} ipython3\n" + src + "\n```\n"
    (folder / f"{name}.md").write_text(body)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# {name.title()} page\n\nSome prose about {name}."))
    for i, src in enumerate(cells):
        cell = nbformat.v4.new_code_cell(src)
        cell.outputs = (outputs or {}).get(i, [])
        if tags and i in tags:
            cell.metadata["tags"] = tags[i]
        nb.cells.append(cell)
    if run is not None:
        nb.metadata["reference_run"] = dict(run, source_sha256=code_sha256(cells))
    nbformat.write(nb, folder / f"{name}.ipynb")


def make_book(folder: Path) -> None:
    (folder / "conf.py").write_text(
        "extensions = ['myst_nb', 'sphinx_external_toc', 'provenance_pages']\n"
        f"import sys; sys.path.insert(0, {str(ROOT / '_ext')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
        "external_toc_path = '_toc.yml'\nexternal_toc_exclude_missing = True\n"
        "nb_execution_mode = 'off'\nexclude_patterns = ['_build', '*.md']\n"
        "include_patterns = ['**']\n"
        "myst_enable_extensions = ['substitution']\n"
        "suppress_warnings = ['mystnb.unknown_mime_type']\n")
    (folder / "_toc.yml").write_text(
        "format: jb-book\nroot: index\nparts:\n  - caption: Chapters\n    chapters:\n"
        "      - file: gpu\n      - file: cpu\n      - file: later\n      - file: status\n")
    (folder / "index.rst").write_text("Tiny book\n=========\n\nA book of three notebooks.\n")
    (folder / "status.rst").write_text("Run status\n==========\n\n.. provenance-status::\n")
    image = {"output_type": "display_data", "metadata": {},
             "data": {"image/png": png_bytes(), "text/plain": "<Figure>"}}
    widget = {"output_type": "display_data", "metadata": {},
              "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2,
                                                                     "version_minor": 0},
                       "text/plain": "progress 0%"}}
    text = {"output_type": "stream", "name": "stdout", "text": "a | b\n1 | 2\n"}
    outputs = {0: [nbformat.from_dict(image), nbformat.from_dict(image)], 1: [nbformat.from_dict(widget)],
               2: [nbformat.from_dict(text)], 3: [nbformat.from_dict(text)]}
    write_pair(folder, "gpu", ["plot()", "progress()", "table()", "plain()"], GPU_RUN, outputs,
               tags={2: ["provenance-caption"]})
    cpu_run = dict(GPU_RUN, devices=["cpu: AMD EPYC"], cuda=None, driver=None, torch="2.13.0+cpu")
    write_pair(folder, "cpu", ["x = 1"], cpu_run, {0: [nbformat.from_dict(image)]})
    (folder / "later.md").write_text(HEADER + "\n# Later\n\n```{code-cell} ipython3\ny = 2\n```\n")


def build(folder: Path) -> tuple[str, Path]:
    # in a fresh process each time: sphinx-external-toc keeps module-level weak references to
    # the previous application's collectors, and a second in-process build can fail with
    # "ReferenceError: weakly-referenced object no longer exists" (seen in CI)
    warnings = folder / "warnings.txt"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-w", str(warnings),
                           str(folder), str(folder / "_build")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, warnings.read_text() + done.stderr[-3000:]
    return warnings.read_text(), folder / "_build"


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_book")
    make_book(folder)
    log, out = build(folder)
    return folder, log, out


def test_source_code_sha256_reads_the_code_cells_of_a_myst_source(tmp_path):
    write_pair(tmp_path, "a", ["x = 1", "print(x)"], None)
    assert source_code_sha256(tmp_path / "a.md") == code_sha256(["x = 1", "print(x)"])
    text = (tmp_path / "a.md").read_text()
    (tmp_path / "a.md").write_text(text.replace("Some prose", "Other prose"))
    assert source_code_sha256(tmp_path / "a.md") == code_sha256(["x = 1", "print(x)"])
    (tmp_path / "a.md").write_text(text.replace("x = 1", "x = 2"))
    assert source_code_sha256(tmp_path / "a.md") != code_sha256(["x = 1", "print(x)"])
    (tmp_path / "plain.md").write_text("# not a notebook\n")
    with pytest.raises(ValueError, match="source="):
        source_code_sha256(tmp_path / "plain.md")
    with pytest.raises(FileNotFoundError):
        source_code_sha256(tmp_path / "missing.md")


def test_words_from_a_reference_run():
    assert PP.short_devices(["NVIDIA H200", "NVIDIA H200"]) == "2× NVIDIA H200"
    assert PP.short_devices(["A", "B"]) == "A, B"
    assert PP.is_gpu_run(GPU_RUN) and not PP.is_gpu_run(dict(GPU_RUN, cuda=None))
    assert PP.caption_text(GPU_RUN, ["figure", "figure"]) == "Figure: 2× NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-30"
    assert PP.caption_text(dict(GPU_RUN, cuda=None), ["table"]).endswith("not a GPU reference run")
    sentence = PP.describe_run(dict(GPU_RUN, source_sha256="f" * 64))
    assert sentence.startswith("This page was run on 2× NVIDIA H200, driver 580.159.04, CUDA 13.0")
    assert "41.2 s" in sentence and "ffffffffffff" in sentence
    prose = PP.describe_run(dict(GPU_RUN, source_sha256=hashlib.sha256(b"").hexdigest()))
    assert "no code" in prose and "e3b0c44298fc" not in prose    # a page of prose (reader L3)


def test_each_figure_cell_gets_one_caption_and_widget_views_are_dropped(book):
    folder, log, out = book
    html = (out / "gpu.html").read_text()
    captions = html.count('class="provenance-caption"')
    assert captions == 2, f"one caption for the cell with two figures, one for the tagged table; got {captions}"
    assert "Figure: 2× NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-30" in html
    assert "Table: 2× NVIDIA H200" in html
    assert "widget-view+json" not in html and "progress 0%" not in html
    assert html.count('class="provenance-footer') == 1 and "provenance-stale" not in html
    assert 'href="status.html"' in html
    cpu = (out / "cpu.html").read_text()
    assert "not a GPU reference run" in cpu


def test_status_page_lists_each_notebook_with_its_state(book):
    folder, log, out = book
    html = (out / "status.html").read_text()
    assert "0 of 3 notebooks carry a current reference run from a GPU" not in html
    assert "1 of 3 notebooks carry a current reference run from a GPU" in html
    assert "✓ current" in html and "⚠ current code, but a CPU run" in html and "— not executed yet" in html
    assert "2× NVIDIA H200" in html and "580.159.04" in html and "41.2 s" in html
    assert 'href="gpu.html"' in html and "<code" in html and "later" in html
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    # 'later' awaits its first run: out of the site map (no toctree warning, no page), still
    # listed on the status page as not executed yet
    assert not warnings, warnings
    assert not (out / "later.html").exists()


def test_an_edited_source_makes_page_and_status_stale_on_the_next_build(book, tmp_path):
    import shutil

    folder, _, _ = book
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("_build", "warnings.txt"))
    build(copy)                                           # first build: everything current
    md = copy / "gpu.md"
    md.write_text(md.read_text().replace("plot()", "plot(size=2)"))
    _, out = build(copy)                                  # incremental: only the .md changed
    assert "provenance-stale" in (out / "gpu.html").read_text()
    assert "✗ stale: code changed since the run" in (out / "status.html").read_text()


def test_a_page_gone_stale_without_its_files_changing_gets_its_badge_rebuilt(book, tmp_path):
    """Reader review R3: the badge of a page whose own files did not change (here: a page it
    reads was re-run; in the book: a perflab module it imports changed) kept an older build's
    "current" while the status page, re-read every build, said stale."""
    import shutil

    import nbformat as nbf

    folder, _, _ = book
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("_build", "warnings.txt"))
    # a configuration that an incremental build keeps (with external_toc_exclude_missing,
    # exclude_patterns changes on every build and Sphinx reads every page again)
    conf = copy / "conf.py"
    conf.write_text(conf.read_text().replace("external_toc_exclude_missing = True",
                                             "external_toc_exclude_missing = False")
                    .replace("'*.md']", "'*.md', 'jupyter_execute']"))
    write_pair(copy, "reader", ["z = 3"], dict(GPU_RUN, started="2026-11-30T11:00:00Z"))
    md = copy / "reader.md"
    md.write_text(md.read_text().replace("---\n\n#", "perflab:\n  reads: [gpu]\n---\n\n#", 1))
    toc = copy / "_toc.yml"
    toc.write_text(toc.read_text().replace("      - file: status", "      - file: reader\n      - file: status"))
    _, out = build(copy)
    assert "current with its source" in (out / "reader.html").read_text()
    nb = nbf.read(copy / "gpu.ipynb", as_version=4)           # gpu re-run after reader's run
    nb.metadata["reference_run"]["started"] = "2026-11-30T12:00:00Z"
    nbf.write(nb, copy / "gpu.ipynb")
    log, out = build(copy)                                    # incremental; reader's files unchanged
    assert "WARNING" not in log, log
    status = (out / "status.html").read_text()
    assert "✗ stale: a page it reads was run after it (gpu)" in status
    page = (out / "reader.html").read_text()
    assert "current with its source" not in page
    assert "stale: a page it reads was run after it (gpu)" in page


def test_notebook_without_metadata_warns(tmp_path):
    make_book(tmp_path)
    nb = nbformat.read(tmp_path / "cpu.ipynb", as_version=4)
    nb.metadata.pop("reference_run")
    nbformat.write(nb, tmp_path / "cpu.ipynb")
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-w", str(tmp_path / "w.txt"),
                    str(tmp_path), str(tmp_path / "_build")], capture_output=True, timeout=300)
    assert "cpu: the notebook has no reference_run metadata" in (tmp_path / "w.txt").read_text()
    assert "✗ no reference_run metadata" in (tmp_path / "_build" / "status.html").read_text()


def test_duplicate_scripts_are_dropped():
    from sphinx.builders.html._assets import _JavaScript

    body = {"body": "const X = 1"}
    files = [_JavaScript("a.js"), _JavaScript(None, **body), _JavaScript("", **body), _JavaScript("a.js")]
    context = {"script_files": files}
    PP.dedupe_scripts(None, "p", "page.html", context, None)
    assert [(js.filename, js.attributes) for js in context["script_files"]] == [("a.js", {}), (None, body)]


def test_repository_substitutions_come_from_the_one_setting():
    class Config:
        html_theme_options = {"repository_url": "https://example.org/course/"}
        myst_substitutions = {}
        html_static_path = []

    config = Config()
    PP.on_config_inited(None, config)
    assert config.myst_substitutions["repository_url"] == "[https://example.org/course/](https://example.org/course/)"
    assert config.myst_substitutions["repository_clone"] == "https://example.org/course.git"
    assert "git+https://example.org/course.git" in config.myst_substitutions["repository_pip"]
    assert str(PP.STATIC) in config.html_static_path and (PP.STATIC / "provenance.css").exists()


def test_without_a_repository_address_no_button_links_anywhere():
    class Config:
        html_theme_options = {"repository_url": "", "use_repository_button": True,
                              "launch_buttons": {"binderhub_url": "https://mybinder.org"}}
        myst_substitutions = {}
        html_static_path = []

    config = Config()
    PP.on_config_inited(None, config)
    opts = config.html_theme_options
    assert opts["launch_buttons"] == {} and not opts["use_repository_button"] and "use_issues_button" not in opts
    assert "repository_url" not in opts
    subs = config.myst_substitutions
    assert "http" not in subs["repository_url"] and "Colab" in subs["run_in_the_cloud"]
    # what a reader can do, not what the build lacks (reader review M7)
    assert not any("this build" in text for text in subs.values())


def test_mathjax_is_vendored_from_the_npm_tarball_and_checked(tmp_path, monkeypatch):
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("package/es5/tex-mml-chtml.js", b"// mathjax"),
                           ("package/es5/output/chtml/fonts/woff-v2/a.woff", b"font"),
                           ("package/es5/sre/speech.js", b"big")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(PP.urllib.request, "urlopen", lambda url, timeout: Response(blob))
    with pytest.raises(ValueError, match="SHA-512"):
        PP.vendored_mathjax(tmp_path)
    monkeypatch.setattr(PP, "MATHJAX_SHA512", base64.b64encode(hashlib.sha512(blob).digest()).decode())
    root = PP.vendored_mathjax(tmp_path)
    assert (root / "mathjax" / "tex-mml-chtml.js").read_bytes() == b"// mathjax"
    assert (root / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2" / "a.woff").exists()
    assert not (root / "mathjax" / "sre").exists()


def test_the_badge_says_what_a_page_needs_and_warns_when_its_run_is_not_current():
    run = {"devices": ["NVIDIA H200"], "started": "2026-12-02T10:00:00Z", "cuda": "13.0"}
    line, warning = PP.badge_words({"state": "current", "words": "current", "gpus": 1,
                                     "pending": None}, run)
    assert line.startswith("Needs 1 GPU · reference run: NVIDIA H200, 2026-12-02")
    assert warning is None
    line, warning = PP.badge_words({"state": "stale", "words": "stale: code changed since the run",
                                     "gpus": 1, "pending": None}, run)
    assert "stale" in line and "code changed since the run" in warning
    line, warning = PP.badge_words({"state": "stale", "words": "stale: perflab changed", "gpus": 2,
                                     "pending": "pending/book/08_x.md"}, run)
    assert line.startswith("Needs 2 GPUs") and "pending/book/08_x.md" in warning
    assert "older source" in warning and "known to be wrong" in warning


def test_a_host_bound_figure_names_the_cpu_and_the_run_s_per_call_cost():
    """Issue 37: a figure set by the host CPU names the CPU and its measured h, so a reader
    comparing it with another host's knows why it moved."""
    run = dict(GPU_RUN, host={"cpu": "Intel(R) Xeon(R) Processor", "logical_cores": 16},
               ceilings={"host_cost_us": {"cpu": 3.43, "cuda": 7.91}})
    text = PP.caption_text(run, ["figure"], "gpu", "host")
    assert "its speed set by the host CPU, Intel(R) Xeon(R) Processor" in text
    assert "per-call cost h 3.4 µs on a CPU tensor, 7.9 µs on a CUDA tensor" in text
    # a figure measured on the host CPU names the CPU, not the per-call cost (reader M8)
    host_fig = PP.caption_text(run, ["figure"], "host")
    assert "logical cores" in host_fig and "per-call cost" not in host_fig
    assert "per-call cost" not in PP.caption_text(run, ["figure"], "gpu")     # device-bound
    assert PP.host_cost_words(GPU_RUN) == ""          # a run that recorded no host costs


def test_the_status_column_counts_the_verdicts_two_runs_agree_on(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from perflab.record import verdicts

    page = verdicts.PageComparison("book/06_x", verdicts=10, changes=[
        verdicts.Change("a", "true", "false", "host"), verdicts.Change("b", "true", "undecided",
                                                                       "device")])
    PP._AGREEMENT[str(tmp_path)] = {"newest": "r2", "pages": {"book/06_x": page},
                                    "against": {"book/06_x": "r1"}}
    row = SimpleNamespace(docname="book/06_x", env=SimpleNamespace(srcdir=str(tmp_path)),
                          status={"state": "current"})
    assert PP._agreement(row) == "8 of 10; ✗ 1 changed; 1 host-bound changed"
    # a current page whose source never ran twice on one device says so, not "all agree"
    row.docname = "book/99_other"
    assert PP._agreement(row) == "first run of this code"
    # reader review M6: runs/ holds earlier runs of the page, of older code: the cell says so
    PP._AGREEMENT[str(tmp_path)]["held"] = {"book/99_other": 4}
    assert PP._agreement(row) == "first run of this code; 3 earlier runs ran older code"
    row.status = {"state": "missing"}
    assert PP._agreement(row) == "—"
    # two runs on different devices are listed but are no defect of the page
    apart = verdicts.PageComparison("book/06_x", verdicts=10, changes=[
        verdicts.Change("b", "true", "undecided", "device")],
        not_comparable="different devices (A; B)")
    assert apart.defects == []
    # the sentence under the table says whether any changed verdict is a defect
    host_only = [("book/06_x", verdicts.Change("a", "true", "false", "host"))]
    said = PP._changes_summary(host_only)
    assert "no device-bound verdict changed" in said and "1 verdict(s)" in said
    said = PP._changes_summary(host_only + [("book/07_y", page.changes[1])])
    assert "✗ 1 of them on 1 page(s)" in said and "no device-bound" not in said


def test_a_link_to_a_page_awaiting_its_first_run_becomes_its_title_not_a_broken_link(tmp_path):
    """Pages run before a split link to the pages split off; while those await their first run
    (left out of the build), a link to them is their heading, marked, not an -W failure."""
    from types import SimpleNamespace

    from docutils import nodes

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "02_gpu.md").write_text("---\nx: 1\n---\n\n# The GPU\n\ntext\n")
    app = SimpleNamespace(srcdir=str(tmp_path), _perflab_awaiting={"book/02_gpu"})
    node = {"reftype": "doc", "refdoc": "book/02_hardware", "reftarget": "02_gpu"}
    out = PP.link_to_a_page_awaiting_its_run(app, None, node, nodes.inline("02_gpu", "02_gpu"))
    assert out.astext() == "The GPU (awaiting its first reference run)"
    titled = PP.link_to_a_page_awaiting_its_run(app, None, node, nodes.inline("", "the L2"))
    assert titled.astext() == "the L2 (awaiting its first reference run)"
    other = {"reftype": "doc", "refdoc": "book/02_hardware", "reftarget": "03_x"}
    assert PP.link_to_a_page_awaiting_its_run(app, None, other, nodes.inline("", "x")) is None
    assert PP.link_to_a_page_awaiting_its_run(
        app, None, {**node, "reftype": "ref"}, nodes.inline("", "x")) is None


def test_on_a_phone_every_status_column_is_labelled_in_its_card():
    """Reader review M6: at 390 px the eight columns broke words letter by letter; the phone
    layout (provenance.css) stacks each row as a card whose lines repeat their headers, so a
    column added to STATUS_COLUMNS without its label fails here."""
    css = (ROOT / "_ext" / "static" / "provenance.css").read_text()
    phone = css[css.index("@media screen and (max-width: 640px)"):]
    assert "display: block" in phone and "thead" in phone
    headers = [c.header for c in PP.STATUS_COLUMNS] + ["driver"]
    for header in headers:
        if header in ("page", "current with its source"):      # the card's title and state
            continue
        assert f"td.provenance-col-{PP._slug(header)}::before" in phone, header
