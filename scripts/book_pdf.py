#!/usr/bin/env python3
"""The whole book as one PDF: the single-page HTML build, printed by headless Chromium.

    python scripts/book_pdf.py            # -> _build/pdf/pytorch-performance-course.pdf
    python scripts/book_pdf.py --out X.pdf

Builds the book with Sphinx's ``singlehtml`` builder (``jupyter-book build --builder
singlehtml``: the same pages, extensions and executed notebooks as the HTML book, in one page),
serves it on 127.0.0.1 and prints it with Chromium's ``--print-to-pdf`` (no network: MathJax is
the vendored copy). ``make pdf`` runs this, then rebuilds the HTML book, which publishes the PDF
at its root and links it from the front page and every download menu (``_ext/reader_pages.py``).

After printing, every table of the book is looked for in the PDF (with poppler's ``pdftotext``,
when installed): a table whose last column's words are not all in the PDF was clipped at the
page's edge (issue 43), and the script says which and fails.

Exit status: 0 with the PDF written; 2 when Chromium or jupyter-book is missing (one line);
1 when the build or the print fails (its last lines are printed), or a table is clipped.
"""

from __future__ import annotations

import argparse
import functools
import html as html_lib
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PDF_NAME = "pytorch-performance-course.pdf"  # _ext/reader_pages.py links this name
DEFAULT_OUT = ROOT / "_build" / "pdf" / PDF_NAME
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The first Chromium found on PATH (or /usr/bin/chromium), else None."""
    for name in CHROMIUM_NAMES:
        if shutil.which(name):
            return shutil.which(name)
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def build_singlehtml(source: Path, out_root: Path) -> Path:
    """``jupyter-book build --builder singlehtml`` of ``source`` into ``out_root``; returns the
    folder holding its ``index.html``.

    Raises:
        RuntimeError: the build failed (with the log's tail).
    """
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(source), "--builder", "singlehtml",
           "--path-output", str(out_root)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    html = out_root / "_build" / "singlehtml"
    if proc.returncode != 0 or not (html / "index.html").exists():
        raise RuntimeError(f"the single-page build failed (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    return html


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def print_pdf(chromium: str, html: Path, out: Path, budget_ms: int = 30000) -> Path:
    """Print ``html/index.html`` (served on 127.0.0.1) to ``out`` with headless Chromium.

    Raises:
        RuntimeError: Chromium wrote no PDF.
    """
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(html)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
            proc = subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 f"--virtual-time-budget={budget_ms}", "--no-pdf-header-footer", f"--print-to-pdf={tmp}",
                 f"http://127.0.0.1:{httpd.server_address[1]}/index.html"],
                capture_output=True, text=True, timeout=900)
    finally:
        httpd.shutdown()
        httpd.server_close()
    if not tmp.exists() or tmp.stat().st_size < 10_000 or tmp.read_bytes()[:5] != b"%PDF-":
        raise RuntimeError(f"Chromium wrote no PDF (exit {proc.returncode}): {proc.stderr[-1500:]}")
    tmp.replace(out)
    return out


_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    """The words of a piece of HTML, without its maths (MathJax prints glyphs, not its source)."""
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", text))
    return _WORD.findall(re.sub(r"\\\(.*?\\\)|\\\[.*?\\\]", " ", text, flags=re.S))


def clipped_tables(page_html: str, pdf_text: str) -> list[str]:
    """Tables of the single page ``page_html`` whose last column the PDF's text does not show:
    one line per table, with the first missing words (empty when every table is whole)."""
    printed = set(_WORD.findall(pdf_text))
    out = []
    for k, table in enumerate(re.findall(r"<table\b.*?</table>", page_html, re.S), start=1):
        head = " ".join(_words(table.split("</tr>", 1)[0]))[:60]
        lost = []
        for row in re.findall(r"<tr\b.*?</tr>", table, re.S):
            cells = re.findall(r"<t[hd](?:\s[^>]*)?>(.*?)</t[hd]>", row, re.S)
            lost += [w for w in _words(cells[-1]) if w not in printed] if cells else []
        if lost:
            out.append(f"table {k} ({head!r}...): its last column lacks {lost[:5]} in the PDF")
    return out


def check_tables(html: Path, pdf: Path) -> list[str] | None:
    """:func:`clipped_tables` of the printed book; None when pdftotext is not installed."""
    pdftotext = shutil.which("pdftotext")
    if pdftotext is None:
        return None
    text = subprocess.run([pdftotext, str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    return clipped_tables((html / "index.html").read_text(encoding="utf-8"), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the whole book to one PDF.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the PDF (default {DEFAULT_OUT.relative_to(ROOT)})")
    parser.add_argument("--source", type=Path, default=ROOT, help="the book's folder (default: this repository)")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("book_pdf.py: Chromium is not installed (sudo scripts/install_browser.sh)", file=sys.stderr)
        return 2
    if not (Path(sys.executable).with_name("jupyter-book").exists() or shutil.which("jupyter-book")):
        print(f"book_pdf.py: jupyter-book is not installed in {sys.executable} (use .venv/bin/python)",
              file=sys.stderr)
        return 2
    try:
        html = build_singlehtml(args.source.resolve(), ROOT / ".cache" / "pdf-book")
        out = print_pdf(chromium, html, args.out.resolve())
    except RuntimeError as err:
        print(f"book_pdf.py: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    clipped = check_tables(html, out)
    if clipped is None:
        print("book_pdf.py: pdftotext is not installed: the tables were not checked (poppler-utils)")
    elif clipped:
        print("book_pdf.py: tables clipped in the PDF:\n  " + "\n  ".join(clipped), file=sys.stderr)
        return 1
    else:
        print("every table's last column is in the PDF")
    return 0


if __name__ == "__main__":
    sys.exit(main())
