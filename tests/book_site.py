"""The built book, shared by the tests that read it (tests/test_book.py, tests/test_reader.py).

Session fixtures (registered in tests/conftest.py, so that one build serves every test file):

* ``build``: ``jupyter-book build . --all -W -n --keep-going`` into a temporary folder (a fresh
  build, so every page's warnings are reported, and nobody else's ``_build`` is touched);
* ``server``: the build served over HTTP on 127.0.0.1 (as a reader gets it: ``file://`` pages
  cannot fetch, so search would fail for the wrong reason). A page asked for with ``?probe``
  comes with ``tests/layout_probe.js`` injected, which measures the page as laid out and leaves
  its report in the DOM (:func:`probe`);
* ``rendered``: every HTML page loaded in Debian's ``chromium`` with ``--dump-dom``.
"""

from __future__ import annotations

import functools
import html as html_lib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import background

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=3000",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROBE_JS = Path(__file__).resolve().parent / "layout_probe.js"
PROBE_URL = "/__layout_probe__.js"   # served by the test server, injected into "page.html?probe"
SEARCH_BATCH_URL = "/__search_batch__.html"   # served by the test server: many searches, one browser

# ---------------------------------------------------------------------------------------------
# Chromium
# ---------------------------------------------------------------------------------------------

def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def require_chromium() -> str:
    path = find_chromium()
    if path:
        return path
    reason = "chromium is not installed (run scripts/install_browser.sh)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: the browser test of the built book must run in CI")
    pytest.skip(reason)


def chromium(binary: str, url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``url`` with the issue's flags, a throw-away profile and ``args``."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               *args, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# Reading pages
# ---------------------------------------------------------------------------------------------

@dataclass
class Page:
    """What the tests need from one HTML document (the DOM Chromium rendered, or a file)."""

    links: list[str] = field(default_factory=list)        # <a href>
    assets: list[str] = field(default_factory=list)       # <link href>, <script src>
    images: list[str] = field(default_factory=list)       # <img src>
    ids: set[str] = field(default_factory=set)
    title: str = ""
    h1: int = 0
    article_text: int = 0                                 # characters of text in <article>/<main>
    empty_outputs: int = 0                                # div.cell_output with no text or image
    empty_figures: int = 0                                # <figure> with no <img>/<svg>/<object>
    widget_views: int = 0                                 # <script type=...widget-view+json>
    classes: dict[str, list[str]] = field(default_factory=dict)   # class -> texts of those elements
    hrefs_by_label: dict[str, str] = field(default_factory=dict)  # aria-label/title -> href


class _Collector(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
    WATCH = {"provenance-caption", "provenance-footer", "provenance-status-table", "glossary", "search",
             "cell_output"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.stack: list[dict] = []
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        p = self.page
        if a.get("id"):
            p.ids.add(a["id"])
        if tag == "a" and a.get("href") is not None:
            p.links.append(a["href"])
            label = a.get("aria-label") or a.get("title") or a.get("data-bs-original-title")
            if label:
                p.hrefs_by_label.setdefault(label, a["href"])
        elif tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "preload", "icon"):
            p.assets.append(a["href"])
        elif tag == "script" and a.get("src") and a["src"] != PROBE_URL:  # the test's own probe
            p.assets.append(a["src"])
        elif tag == "script" and a.get("type") == "application/vnd.jupyter.widget-view+json":
            p.widget_views += 1
        elif tag == "img":
            p.images.append(a.get("src") or "")
        elif tag == "title":
            self.in_title = True
        elif tag == "h1":
            p.h1 += 1
        if tag in self.VOID:
            if tag == "img":
                for frame in self.stack:
                    frame["media"] = True
            return
        classes = set((a.get("class") or "").split())
        frame = {"tag": tag, "classes": classes, "text": [], "media": tag in ("svg", "object", "iframe")}
        if tag in ("svg", "object", "iframe"):
            for outer in self.stack:
                outer["media"] = True
        self.stack.append(frame)

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        if tag in self.VOID:
            return
        # pop to the matching tag (tolerates sloppy markup)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                frames = self.stack[i:]
                del self.stack[i:]
                for frame in reversed(frames):
                    self._close(frame)
                break

    def _close(self, frame):
        text = " ".join("".join(frame["text"]).split())
        p = self.page
        if frame["tag"] in ("article", "main"):
            p.article_text = max(p.article_text, len(text))
        if "cell_output" in frame["classes"] and not text and not frame["media"]:
            p.empty_outputs += 1
        if frame["tag"] == "figure" and not frame["media"]:
            p.empty_figures += 1
        for cls in frame["classes"] & self.WATCH:
            p.classes.setdefault(cls, []).append(text)
        if frame["tag"] in ("dt", "dd") and self.stack and "glossary" in self.stack[-1]["classes"]:
            p.classes.setdefault(f"glossary-{frame['tag']}", []).append(text)
        if self.stack and frame["media"]:
            self.stack[-1]["media"] = True

    def handle_data(self, data):
        if self.in_title:
            self.page.title += data
        for frame in self.stack:
            frame["text"].append(data)


def parse_html(text: str) -> Page:
    collector = _Collector()
    collector.feed(text)
    collector.close()
    while collector.stack:
        collector._close(collector.stack.pop())
    return collector.page


def internal_target(page: Path, ref: str, html_root: Path) -> tuple[Path, str] | None:
    """The file (and fragment) an internal ``href``/``src`` on ``page`` points at; None if external."""
    parts = urlsplit(ref)
    if parts.scheme or parts.netloc or ref.startswith(("mailto:", "javascript:", "data:", "//")):
        return None
    if not parts.path:
        return (page, unquote(parts.fragment))
    target = (page.parent / unquote(parts.path)).resolve()
    if parts.path.endswith("/"):
        target = target / "index.html"
    return (target, unquote(parts.fragment))


# ---------------------------------------------------------------------------------------------
# The build, the server, the rendered pages (once per session)
# ---------------------------------------------------------------------------------------------

@dataclass
class Build:
    html: Path
    returncode: int
    log: str
    unexpected: list[str]
    tolerated: list[str]


def _toc_docnames() -> list[str]:
    from perflab.record.runs import toc_files

    found = toc_files(ROOT / "_toc.yml")
    return [d[: -len(Path(d).suffix)] if Path(d).suffix in (".md", ".ipynb") else d for d in found]


def _is_gpu_run(ipynb: Path) -> bool:
    from perflab.record import runs

    try:
        run = runs.read(ipynb)
    except (OSError, ValueError):
        return False
    return run is not None and run.is_gpu


def classify_warnings(log: str) -> tuple[list[str], list[str]]:
    """Split the build log's warnings into (unexpected, tolerated); see the module docstring."""
    unexpected, tolerated = [], []
    for line in ANSI.sub("", log).splitlines():
        if "WARNING:" not in line and "ERROR:" not in line and "CRITICAL:" not in line:
            continue
        missing = re.search(r"toctree contains reference to nonexisting document '([^']+)'", line)
        if missing and not (ROOT / f"{missing.group(1)}.ipynb").exists():
            tolerated.append(line.strip())
            continue
        glue = re.search(r"^(\S+\.ipynb):\d*: WARNING: No key '[^']+' found in glue data", line.strip())
        if glue and not _is_gpu_run(Path(glue.group(1))):
            tolerated.append(line.strip())
            continue
        unexpected.append(line.strip())
    return unexpected, tolerated


def _jupyter_book() -> list[str]:
    script = Path(sys.executable).with_name("jupyter-book")
    if script.exists():
        return [str(script)]
    found = shutil.which("jupyter-book")
    if not found:
        pytest.fail("jupyter-book is not installed (pip install -r requirements-dev.txt)")
    return [found]


BUILD_JOB, RENDER_JOB = "book build", "book render"


def _build_book(out: Path, run=subprocess.run) -> subprocess.CompletedProcess:
    env = dict(background.environ(), PYTHONWARNINGS="ignore")
    return run([*_jupyter_book(), "build", str(ROOT), "--all", "-W", "-n", "--keep-going",
                "--path-output", str(out)], capture_output=True, text=True, timeout=1200, env=env)


def _background_build(out: Path) -> subprocess.CompletedProcess:
    return _build_book(out, run=lambda cmd, timeout, env, **_: background.run(cmd, timeout, env=env))


def _background_render(out: Path) -> dict[str, "Rendered"]:
    """Every page of the build ahead of its tests, on a server of its own."""
    html = out / "_build" / "html"
    if not (html / "index.html").exists():
        raise RuntimeError("the book did not build (see test_build_has_no_warnings)")
    url, stop = serve(html)
    try:
        return render_all(require_chromium(), url, html)
    finally:
        stop()


def background_jobs(items, tmp_path_factory) -> list:
    """The book's build and its rendering in Chromium, ahead of the tests that read them
    (tests/background.py)."""
    uses = [i for i, item in enumerate(items) if "build" in getattr(item, "fixturenames", ())]
    if not uses:
        return []
    out = _PLANNED["build"] = tmp_path_factory.mktemp("book")
    jobs = [(uses[0], BUILD_JOB, functools.partial(_background_build, out), False, ())]
    renders = [i for i, item in enumerate(items) if "rendered" in getattr(item, "fixturenames", ())]
    if renders:
        jobs.append((renders[0], RENDER_JOB, functools.partial(_background_render, out), False, (BUILD_JOB,)))
    return jobs


background.FIXTURE_PLANS.append(background_jobs)
_PLANNED: dict[str, Path] = {}


def planned_build() -> Path | None:
    """The folder the session's book build (a job) writes to, if one was planned."""
    return _PLANNED.get("build")


@pytest.fixture(scope="session")
def build(tmp_path_factory) -> Build:
    job = background.result(BUILD_JOB)
    if job is None:
        out = tmp_path_factory.mktemp("book")
        proc = _build_book(out)
    elif job.error is not None:
        raise job.error
    else:
        proc = job.value
        out = Path(proc.args[proc.args.index("--path-output") + 1])
    log = proc.stdout + proc.stderr
    html = out / "_build" / "html"
    if not (html / "index.html").exists():
        pytest.fail(f"the book did not build (exit {proc.returncode}):\n{log[-4000:]}")
    unexpected, tolerated = classify_warnings(log)
    return Build(html, proc.returncode, log, unexpected, tolerated)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the built book; ``page.html?probe`` comes with the layout probe injected."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        if parts.path == PROBE_URL:
            return self._send(PROBE_JS.read_bytes(), "text/javascript")
        if parts.path == SEARCH_BATCH_URL:
            return self._send(SEARCH_BATCH_HTML.encode(), "text/html; charset=utf-8")
        if parts.query == "probe" and parts.path.endswith(".html"):
            page = Path(self.directory) / unquote(parts.path).lstrip("/")
            if page.is_file():
                html = page.read_bytes().replace(b"</body>", f'<script src="{PROBE_URL}"></script></body>'.encode(), 1)
                return self._send(html, "text/html; charset=utf-8")
        return super().do_GET()

    def _send(self, body: bytes, kind: str):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


#: The page of :data:`SEARCH_BATCH_URL` (``?q=A&q=B...``): it opens the book's ``search.html?q=``
#: for each query in turn in a frame of its own, waits until that search has finished (Sphinx's
#: summary line is written when the last result is shown), copies the result links (each ``<a>``
#: of a ``<li>`` of ``ul.search``, as :func:`search_hits` reads them from one page's DOM) and
#: leaves them in its own DOM as JSON (``data-search-hits``), with ``data-search-done`` once every
#: query has an answer. One Chromium serves every query: a launch per query cost ~1.6 s each.
SEARCH_BATCH_HTML = """<!doctype html><html><head><meta charset="utf-8"></head><body><script>
const queries = new URLSearchParams(location.search).getAll("q");
const found = {};
function next(i) {
  if (i >= queries.length) {
    document.body.setAttribute("data-search-hits", JSON.stringify(found));
    document.body.setAttribute("data-search-done", "1");
    return;
  }
  const frame = document.createElement("iframe");
  frame.src = "search.html?q=" + encodeURIComponent(queries[i]);
  document.body.appendChild(frame);
  const poll = setInterval(() => {
    const doc = frame.contentDocument;
    const summary = doc && doc.querySelector("#search-results p.search-summary");
    if (!summary || !summary.textContent.trim()) return;        // still searching
    clearInterval(poll);
    found[queries[i]] = Array.from(doc.querySelectorAll("ul.search > li"))
      .map((li) => li.querySelector("a")).filter((a) => a).map((a) => a.getAttribute("href"));
    frame.remove();
    document.body.setAttribute("data-search-hits", JSON.stringify(found));
    next(i + 1);
  }, 50);
}
next(0);
</script></body></html>
"""

SEARCH_BATCH_REPORT = re.compile(r'data-search-hits="([^"]*)"')


def search_hits(binary: str, server: str, queries: list[str]) -> dict[str, list[str]]:
    """The result links (``href`` of each result) that the book's search page at ``server``
    shows for each of ``queries``, every query searched in one Chromium (:data:`SEARCH_BATCH_HTML`).

    Raises:
        AssertionError: a search did not finish (the page gave no answer for a query).
    """
    from urllib.parse import urlencode

    url = f"{server}{SEARCH_BATCH_URL}?{urlencode([('q', q) for q in queries])}"
    proc = chromium(binary, url, "--dump-dom", f"--virtual-time-budget={3000 * max(1, len(queries))}",
                    timeout=120 + 30 * len(queries))
    report = SEARCH_BATCH_REPORT.search(proc.stdout)
    found = json.loads(html_lib.unescape(report.group(1))) if report else {}
    missing = [q for q in queries if q not in found]
    assert not missing, (f"the search page gave no answer for {missing} (chromium exit {proc.returncode}): "
                         f"{proc.stderr[-300:]}")
    return found


def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1 (a thread); returns ``(url, stop)``."""
    handler = functools.partial(_Quiet, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def stop():
        httpd.shutdown()
        httpd.server_close()
    return f"http://127.0.0.1:{httpd.server_address[1]}", stop


@pytest.fixture(scope="session")
def server(build):
    url, stop = serve(build.html)
    yield url
    stop()


PROBE_REPORT = re.compile(r'data-layout-probe="([^"]*)"')


def probe(binary: str, url: str, width: int = 1280) -> dict:
    """Load ``url`` (a page of a server from :func:`serve`) with the layout probe at a window
    ``width`` px wide and return its report (see ``tests/layout_probe.js``).

    Raises:
        AssertionError: the page gave no report (it did not load, or the probe did not run).
    """
    sep = "&" if "?" in url else "?"
    proc = chromium(binary, url + sep + "probe", f"--window-size={width},1600", "--dump-dom")
    found = PROBE_REPORT.search(proc.stdout)
    assert found, f"no layout report from {url} (chromium exit {proc.returncode}): {proc.stderr[-300:]}"
    return json.loads(html_lib.unescape(found.group(1)))


def html_pages(html: Path) -> list[Path]:
    skip = {"_static", "_sources", "_images", "_sphinx_design_static"}
    return sorted(p for p in html.rglob("*.html") if not (set(p.relative_to(html).parts) & skip))


@dataclass
class Rendered:
    path: Path
    returncode: int
    dom: str
    console: list[str]
    page: Page
    layout: dict | None       # the layout probe's report (tests/layout_probe.js), None if it gave none


WINDOW = (1280, 1600)  # the reader's window: a laptop screen, the width the issue measured at


def render_page(binary: str, server: str, html_root: Path, path: Path) -> tuple[str, Rendered]:
    """Load one page in Chromium with the layout probe (window :data:`WINDOW`)."""
    rel = path.relative_to(html_root).as_posix()
    proc = chromium(binary, f"{server}/{rel}?probe", f"--window-size={WINDOW[0]},{WINDOW[1]}", "--dump-dom")
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    found = PROBE_REPORT.search(proc.stdout)
    layout = json.loads(html_lib.unescape(found.group(1))) if found else None
    return rel, Rendered(path, proc.returncode, proc.stdout, console, parse_html(proc.stdout), layout)


@pytest.fixture(scope="session")
def rendered(build, server) -> dict[str, Rendered]:
    """Every page of the build as Chromium rendered it, with its layout report."""
    job = background.result(RENDER_JOB)
    if job is None:
        return render_all(require_chromium(), server, build.html)
    if job.error is not None:
        raise job.error
    return job.value


def render_all(binary: str, server: str, html_root: Path) -> dict[str, Rendered]:
    """Every page under ``html_root`` (served at ``server``) rendered, four pages at a time."""
    def render(path: Path) -> tuple[str, Rendered]:
        return render_page(binary, server, html_root, path)

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        return dict(pool.map(render, html_pages(html_root)))


def notebook_pages(build: Build) -> list[str]:
    """Pages built from an .ipynb (their source was copied to _sources)."""
    return sorted(p.relative_to(build.html / "_sources").as_posix()[: -len(".ipynb")] + ".html"
                  for p in (build.html / "_sources").rglob("*.ipynb"))
