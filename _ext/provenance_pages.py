"""Sphinx extension: every page of the built book says where its numbers came from.

The executed notebooks carry ``metadata.reference_run`` (written by ``scripts/execute.py``:
devices, driver, CUDA, torch, Python, start time, duration, SHA-256 of the source's code cells,
git commit). At build time this extension turns it into what a reader sees:

* **A badge at the top** of every notebook page: how many GPUs its reference run needs (the
  front matter's ``perflab: {gpus: N}``, :func:`perflab.record.runs.required_gpus`), the run it shows
  and whether that run is current; a page whose run is stale, or that keeps an older run while
  its revised source waits in ``pending/``, says so there, in a warning box, not only in the
  footer and on the status page.
* **A footer** on every page built from an ``.ipynb``: "This page was run on ...". A notebook
  without a reference run gets a warning (so ``-W`` builds fail) rather than a silent page with no
  provenance. When the notebook's MyST source has changed since the run, the footer says so.
* **A caption line under each figure and table** a notebook cell produced (image outputs and HTML
  tables; a cell tagged ``provenance-caption`` gets one under its text output too): the device
  that did the work (the cell's metadata ``perflab: {measured_on: host | gpu | gpus |
  published}``: the host's CPU model and cores from ``reference_run.host``, one GPU of the run,
  all of its GPUs, or, for numbers from papers, that no device measured them), torch version
  and date of the run, and a link to the status page. One caption per cell, after its last
  figure or table, however many the cell drew; inside a numbered figure (myst-nb's
  ``mystnb: {figure: {name, caption}}`` cell metadata) it goes under the figure's caption.
  Figures carry no stamp of their own: this line is their provenance.
* **The status page**: the ``provenance-status`` directive renders a table of every notebook in
  ``_toc.yml`` (chapters, labs, tools) with its device(s), driver, torch, date, duration and
  whether it is current with its source (``reference_run.source_sha256`` compared with
  :func:`perflab.record.runs.source_code_sha256` of the ``.md``, as ``scripts/execute.py --check``
  does), the GPUs each needs, and the sources waiting in ``pending/`` with what they wait for.
  Pages holding the directive are re-read on every build, and a notebook page is re-read
  when its source's code changes, so neither can go stale.
* **No blank widget boxes**: ipywidgets views (tqdm progress bars, the roofline explorer) need a
  live kernel. Their outputs are dropped from the static pages, which show an equivalent static
  figure where one matters; no widget JavaScript is loaded from a CDN.
* **No duplicated scripts**: repeated ``<script>`` entries are dropped from each page (see
  :func:`dedupe_scripts`).
* **One setting for the repository's location**: ``repository.url`` in ``_config.yml`` (Jupyter
  Book turns it into ``html_theme_options["repository_url"]``) is offered to MyST pages as the
  substitutions ``{{ repository_url }}`` (a link), ``{{ repository_clone }}`` (a git URL),
  ``{{ repository_pip }}`` (the ``%pip install`` line that puts perflab on Colab) and
  ``{{ run_in_the_cloud }}`` (how to open a page on Binder or Colab). The repository, issue,
  Binder and Colab buttons are shown only when it is set: an empty URL (the repository has no
  public address yet) hides them, and the substitutions say so instead of linking nowhere.
* **Math offline**: MathJax is vendored from the npm registry (:data:`MATHJAX_TARBALL`, checked
  against its published SHA-512) into the clone's ``.cache/`` on the first build and copied into
  the built book, so formulas render without a network.

The reference-run data and the "is this notebook current?" decision are
:mod:`perflab.record.runs` (shared with ``scripts/execute.py`` and the tests).

Config values: ``provenance_status_page`` (docname of the status page, default ``"status"``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import json
import math
import re
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # perflab, without requiring an install
    sys.path.insert(0, str(ROOT))

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util import docname_join, logging
from sphinx.util.docutils import SphinxDirective

from perflab.record import runs, verdicts
from perflab.record.provenance import short_devices

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CAPTION_TAG = "provenance-caption"
MATHJAX_VERSION = "3.2.2"
MATHJAX_TARBALL = f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz"
MATHJAX_SHA512 = "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
# what tex-mml-chtml.js loads at run time (fonts, menu, accessibility); not the 4 MB speech engine
MATHJAX_PARTS = ("tex-mml-chtml.js", "input/", "output/chtml/", "a11y/", "ui/", "adaptors/")


# ---------------------------------------------------------------------------------------------
# Words from a reference_run dict
# ---------------------------------------------------------------------------------------------

def is_gpu_run(run: dict) -> bool:
    """True when a reference run came from CUDA devices (:attr:`perflab.record.runs.ReferenceRun.is_gpu`)."""
    return runs.ReferenceRun.from_metadata(run).is_gpu


def run_date(run: dict) -> str:
    """The run's start date, ``YYYY-MM-DD`` (``?`` when unknown)."""
    return (run.get("started") or "?")[:10]


def describe_run(run: dict) -> str:
    """One sentence from a ``reference_run`` dict (the page footer)."""
    parts = [f"This page was run on {short_devices(run.get('devices'))}"]
    if run.get("driver"):
        parts.append(f"driver {run['driver']}")
    if run.get("cuda"):
        parts.append(f"CUDA {run['cuda']}")
    parts.append(f"torch {run.get('torch', '?')}, Python {run.get('python', '?')}")
    when = (run.get("started") or "?").replace("T", " ").replace("Z", " UTC")
    text = ", ".join(parts) + f", started {when}, taking {run.get('duration_s', '?')} s"
    sha = (run.get("source_sha256") or "")[:12]
    git = (run.get("git") or "")[:10]
    if run.get("source_sha256") == EMPTY_SOURCE:   # a page of prose: no code was hashed
        text += "; the page has no code" + (f", commit {git}" if git else "") + "."
        return text
    text += f"; source code hash {sha}" + (f", commit {git}" if git else "") + "."
    return text


#: SHA-256 of no code at all: the source hash of a page of prose (chapter 6's overview)
EMPTY_SOURCE = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


MEASURED_ON = ("host", "gpu", "gpus", "published")
PUBLISHED_WORDS = "no device measured them"   # the provenance line of ``published``


def host_cost_words(run: dict) -> str:
    """The run's measured per-call host cost h (``reference_run.ceilings.host_cost_us``, from
    the run's ceilings file), e.g. ``"; per-call cost h 3.4 µs on a CPU tensor, 7.9 µs on a
    CUDA tensor in this run"``; empty for runs that did not record it."""
    h = (run.get("ceilings") or {}).get("host_cost_us") or {}
    parts = [f"{h[k]:.1f} µs on a {name} tensor" for k, name in (("cpu", "CPU"), ("cuda", "CUDA"))
             if isinstance(h.get(k), (int, float))]
    return f"; per-call cost h {', '.join(parts)} in this run" if parts else ""


def host_words(run: dict) -> str:
    """The run's host CPU, e.g. ``"the host CPU, AMD EPYC 9654 (32 logical cores)"``, from
    ``reference_run.host`` (runs before that field existed: "model not recorded")."""
    host = run.get("host") or {}
    model, cores, usable = host.get("cpu"), host.get("logical_cores"), host.get("usable_cores")
    if not model:
        return "the host CPU (model not recorded by this run)"
    if cores and usable and usable < cores:
        return f"the host CPU, {model} ({usable} of its {cores} logical cores usable by the run)"
    return f"the host CPU, {model}" + (f" ({cores} logical cores)" if cores else "")


def device_words(run: dict, measured_on: str | None) -> str:
    """The device that did the work a figure or table shows, from the cell's
    ``perflab: {measured_on: host | gpu | gpus}``: the host CPU, one GPU of the run, or all of
    its GPUs; without ``measured_on``, the run's devices (which may not be the right ones)."""
    devices = list(run.get("devices") or [])
    if measured_on == "host":
        return host_words(run)
    if measured_on == "gpu":
        if not devices or not is_gpu_run(run):
            return f"{short_devices(devices)} (the run had no GPU)"
        more = f" (one of the run's {len(devices)})" if len(devices) > 1 else ""
        return f"one {devices[0]}{more}"
    return short_devices(devices)


def caption_text(run: dict, kinds: list[str], measured_on: str | None = None,
                 bound: str | None = None) -> str:
    """The provenance line under a cell's figure(s)/table(s), e.g.
    ``"Figure measured on one NVIDIA H200 (one of the run's 2) · torch 2.11.0+cu130 · 2026-11-30"``
    (see :func:`device_words`); for ``published``, a figure of numbers from papers, the line
    says no device measured them; without ``measured_on``, the older
    ``"Figure: 2× NVIDIA H200 · torch ... · date"``. Work measured on the host CPU
    (``measured_on: host``) names the CPU and its cores, nothing more (a cache curve or a flame
    graph has nothing to do with the per-call cost: reader M8); a GPU figure whose speed the host
    sets (``bound: host``: a small model's step whose time is the host's issue cost) names the
    CPU and the run's measured per-call cost h (:func:`host_cost_words`), since such a figure
    moves between hosts of the same GPU.
    """
    label = " and ".join(dict.fromkeys(kinds)) or "Output"
    label = label[0].upper() + label[1:]
    if measured_on == "published":
        head = f"{label} of published numbers, drawn by this run: {PUBLISHED_WORDS}"
    elif measured_on in MEASURED_ON:
        head = f"{label} measured on {device_words(run, measured_on)}"
        if measured_on != "host" and bound == "host":
            head += f", its speed set by {host_words(run)}{host_cost_words(run)}"
    else:
        head = f"{label}: {short_devices(run.get('devices'))}"
    text = f"{head} · torch {run.get('torch', '?')} · {run_date(run)}"
    if not is_gpu_run(run):
        text += " · not a GPU reference run"
    return text


# ---------------------------------------------------------------------------------------------
# Notebooks of the table of contents, and whether each is current with its source
# ---------------------------------------------------------------------------------------------

def source_sha(app, docname: str) -> str | None:
    """SHA-256 of the code cells of ``docname``'s MyST source, or None when it has no such source."""
    md = Path(app.srcdir) / f"{docname}.md"
    if not runs.is_myst_notebook(md):
        return None
    return runs.source_code_sha256(md)


def _walk_site_map(site_map) -> list[tuple[str, str]]:
    """``(part caption, docname)`` for every document of ``site_map``, root first, in book order."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def walk(docname: str, caption: str) -> None:
        if docname in seen:
            return
        seen.add(docname)
        out.append((caption, docname))
        doc = site_map[docname] if docname in site_map else None
        for tree in getattr(doc, "subtrees", []):
            for item in tree.files():
                walk(item, tree.caption or caption)

    walk(site_map.root.docname, "")
    return out


def awaiting_first_run(srcdir: Path, docname: str) -> bool:
    """True for a page of the table of contents that is a MyST notebook with no executed
    ``.ipynb`` yet: a page added (or split off) since the last reference run on a GPU. The book
    is built from the executed notebooks only, so such a page has nothing to show until that
    run; the status page lists it as not executed yet."""
    md = Path(srcdir) / f"{docname}.md"
    return runs.is_myst_notebook(md) and not md.with_suffix(".ipynb").exists()


def drop_pages_awaiting_their_first_run(app, config) -> None:
    """Take the pages of :func:`awaiting_first_run` out of the site map (after
    sphinx-external-toc parsed ``_toc.yml``), so that the book builds with ``-W`` from what was
    run, instead of failing on a toctree entry with no document. The full table of contents is
    kept for the status page (:func:`toc_entries`)."""
    site_map = getattr(config, "external_site_map", None)
    if site_map is None:
        return
    app._perflab_toc_entries = _walk_site_map(site_map)
    gone = {d for _, d in app._perflab_toc_entries
            if d != site_map.root.docname and awaiting_first_run(app.srcdir, d)}
    app._perflab_awaiting = gone
    if not gone:
        return
    for docname in list(site_map):
        doc = site_map[docname]
        for tree in doc.subtrees:
            tree.items = [i for i in tree.items if str(i) not in gone]
        doc.subtrees = [t for t in doc.subtrees if t.items]
    for docname in gone:
        if docname in site_map:
            del site_map[docname]
    logger.info(f"[perflab] not in this build, awaiting their first reference run: {sorted(gone)}")


def link_to_a_page_awaiting_its_run(app, env, node, contnode):
    """A ``{doc}`` link to a page that :func:`drop_pages_awaiting_their_first_run` left out of
    this build: its title as plain text, marked as awaiting its first run, instead of a broken
    link (and a ``-W`` failure). Pages run earlier link to pages split off since then."""
    if node.get("reftype") != "doc":
        return None
    target = docname_join(node.get("refdoc", ""), node.get("reftarget", ""))
    if target not in getattr(app, "_perflab_awaiting", ()):
        return None
    text = contnode.astext()
    if text == node.get("reftarget"):     # no title given: the page's own heading
        md = Path(app.srcdir) / f"{target}.md"
        heading = next((line[2:].strip() for line in md.read_text().splitlines()
                        if line.startswith("# ")), text)
        text = heading
    return nodes.inline(text, f"{text} (awaiting its first reference run)",
                        classes=["perflab-awaiting-link"])


def toc_entries(app) -> list[tuple[str, str]]:
    """``(part caption, docname)`` for every file of ``_toc.yml``, in book order (pages awaiting
    their first reference run included)."""
    if getattr(app, "_perflab_toc_entries", None):
        return list(app._perflab_toc_entries)
    site_map = getattr(app.env, "external_site_map", None) or getattr(app.config, "external_site_map", None)
    return [] if site_map is None else _walk_site_map(site_map)


def notebook_status(app, docname: str) -> dict | None:
    """Status of one toc entry (:func:`perflab.record.runs.status`, the one staleness decision): None
    when it is not a notebook, else a dict with ``run`` (the reference_run metadata or None),
    ``state`` (``current``, ``cpu``, ``stale``, ``missing``, ``no-metadata``) and ``words``
    (what the status page prints). Computed once per build and shared by the page's badge,
    the status page and :func:`on_env_get_outdated`, so the three cannot disagree."""
    cache = getattr(app, "_perflab_status_cache", None)
    if cache is None:
        cache = app._perflab_status_cache = {}
    if docname not in cache:
        cache[docname] = _notebook_status(app, docname)
    return cache[docname]


def status_key(status: dict | None) -> tuple | None:
    """What of a :func:`notebook_status` a page's badge shows (state, words, GPUs, pending):
    recorded when the page is read; a page whose key differs at the next build is read again
    (:func:`on_env_get_outdated`), so its badge always says what the status page says."""
    if status is None:
        return None
    return (status["state"], status["words"], status.get("gpus"), status.get("pending"),
            status.get("pending_gpus"))


def _notebook_status(app, docname: str) -> dict | None:
    src = Path(app.srcdir)
    md = src / f"{docname}.md"
    st = runs.status(md, src / f"{docname}.ipynb")
    if st is None:
        return None
    myst = runs.is_myst_notebook(md)
    later = runs.pending_replacement(md) if myst else None
    return {"run": st.run.as_metadata() if st.run else None, "state": st.state, "words": st.words,
            "gpus": runs.required_gpus(md) if myst else None,
            "pending": str(later.relative_to(src)) if later else None,
            "pending_gpus": runs.required_gpus(later) if later else None}


def _waits_for(status: dict) -> str:
    """What a page's revised source waits for: its run on one GPU, or a machine with N GPUs."""
    n = status.get("pending_gpus") or status.get("gpus")
    return "its reference run on one GPU" if n == 1 else f"a machine with {gpus_text(n)}"


def gpus_text(gpus: int | None) -> str:
    """``"1 GPU"``, ``"2 GPUs"`` (``"?"`` when the page declares nothing readable)."""
    if gpus is None:
        return "?"
    return f"{gpus} GPU" + ("s" if gpus != 1 else "")


# ---------------------------------------------------------------------------------------------
# Footer, captions, widget views (doctree-read of notebook pages)
# ---------------------------------------------------------------------------------------------

def _status_link(app, text: str) -> nodes.Node:
    """A link to the status page, or plain text when the book has no status page."""
    target = app.config.provenance_status_page
    if target not in app.env.found_docs:
        return nodes.Text(text)
    ref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/" + target,
                                refdoc=app.env.docname, refexplicit=True, refwarn=True)
    ref += nodes.inline(text, text)
    return ref


def _bundle_mimes(bundle: nodes.Element) -> list[str]:
    return [child.get("mime_type", "") for child in bundle.children if isinstance(child, nodes.Element)]


def _is_bundle(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "mime_bundle"


def _drop_widget_views(doctree) -> int:
    dropped = 0
    for bundle in list(doctree.findall(_is_bundle)):
        if WIDGET_VIEW in _bundle_mimes(bundle):
            parent = bundle.parent
            parent.remove(bundle)
            dropped += 1
            # an output area (or figure) left empty would render as an empty box
            while parent is not None and not parent.children and isinstance(parent, (nodes.container, nodes.figure)):
                grand = parent.parent
                grand.remove(parent)
                parent = grand
    return dropped


def _output_kinds(bundle: nodes.Element) -> list[str]:
    mimes = _bundle_mimes(bundle)
    if any(m in IMAGE_MIMES for m in mimes):
        return ["figure"]
    if "text/html" in mimes and "<table" in bundle.astext().lower():
        return ["table"]
    return []


def _measured_on(app, cell) -> str | None:
    """The cell's ``perflab: {measured_on: ...}`` (None when absent; a warning when unknown)."""
    meta = (cell.get("cell_metadata") or {}).get("perflab") or {}
    value = meta.get("measured_on") if isinstance(meta, dict) else None
    if value is not None and value not in MEASURED_ON:
        logger.warning(f"cell metadata perflab.measured_on is {value!r}; expected one of {MEASURED_ON}",
                       location=cell)
        return None
    return value


def _bound(cell) -> str | None:
    """The cell's ``perflab: {bound: host}`` (what sets the speed the figure shows), or None."""
    meta = (cell.get("cell_metadata") or {}).get("perflab") or {}
    value = meta.get("bound") if isinstance(meta, dict) else None
    return value if value in ("host", "device") else None


def _add_captions(app, doctree, run: dict) -> int:
    added = 0
    for cell in list(doctree.findall(lambda n: isinstance(n, nodes.container)
                                     and n.get("nb_element") == "cell_code")):
        measured_on = _measured_on(app, cell)
        bound = _bound(cell)
        for output in list(cell.findall(lambda n: isinstance(n, nodes.container)
                                        and n.get("nb_element") == "cell_code_output")):
            kinds: list[str] = []
            last = None
            for bundle in output.findall(_is_bundle):
                found = _output_kinds(bundle)
                if found:
                    kinds += found
                    last = bundle
            tags = (cell.get("cell_metadata") or {}).get("tags") or []
            if CAPTION_TAG in tags and output.children:
                kinds.append("table")
                last = output.children[-1]
            if last is None:
                continue
            para = nodes.paragraph("", "", classes=["provenance-caption"])
            para += nodes.Text(caption_text(run, kinds, measured_on, bound) + " · ")
            para += _status_link(app, "run status")
            # a numbered figure (myst-nb's cell metadata mystnb.figure): the line goes inside
            # it, under its caption; else after the output that holds the figure or table
            figure = last.parent if isinstance(last.parent, nodes.figure) else None
            if figure is not None:
                figure += nodes.legend("", para)
                added += 1
                continue
            anchor = last
            while anchor.parent is not output and anchor.parent is not None:
                anchor = anchor.parent
            output.insert(output.index(anchor) + 1, para)
            added += 1
    return added


def _reference_run(app, docname: str) -> dict | None:
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("reference_run") or {}
    except (OSError, ValueError):
        return {}


def on_doctree_read(app, doctree) -> None:
    docname = app.env.docname
    run = _reference_run(app, docname)
    if run is None:
        return
    _drop_widget_views(doctree)
    if not run:
        logger.warning(f"{docname}: the notebook has no reference_run metadata", location=docname)
        return
    sha = source_sha(app, docname)
    # what the page shows that can change without its .ipynb changing: the source's code,
    # and the staleness its badge states (perflab modules, pages it reads, pending sources)
    app.env.provenance_sources[docname] = (sha, status_key(notebook_status(app, docname)))
    _add_captions(app, doctree, run)
    para = nodes.paragraph(text=describe_run(run) + " ")
    para += _status_link(app, "All notebooks' runs.")
    box = nodes.container("", para, classes=["provenance-footer"])
    if sha is not None and sha != run.get("source_sha256"):
        warn = nodes.paragraph(text="The source of this page has changed since this run; the outputs "
                                    "shown are from the code shown, which is no longer the current code.")
        box += warn
        box["classes"].append("provenance-stale")
    sections = list(doctree.findall(nodes.section))
    (sections[0] if sections else doctree).append(box)
    _add_badge(app, doctree, docname, run)


def badge_words(status: dict, run: dict) -> tuple[str, str | None]:
    """The badge line at the top of a notebook page and, when the run shown is not a current
    one, the warning a reader must see before the outputs (None when it is current)."""
    line = (f"Needs {gpus_text(status.get('gpus'))} · reference run: "
            f"{short_devices(run.get('devices'))}, {run_date(run)} · ")
    if status.get("pending"):
        return (line + "an older source's run",
                f"The outputs on this page come from the run of {run_date(run)} on "
                f"{short_devices(run.get('devices'))} of an older source. The revised page "
                f"({status['pending']}) waits for {_waits_for(status)}; "
                "the note below lists what is known to be wrong in these outputs.")
    if status["state"] == "current":
        return line + "current with its source", None
    if status["state"] == "stale":
        return (line + "stale",
                "This page's run is stale: " + status["words"].removeprefix("stale: ") + ". The "
                "outputs shown are those of the code shown; the next reference run refreshes them.")
    return line + status["words"], f"This page has no current GPU reference run ({status['words']})."


def _add_badge(app, doctree, docname: str, run: dict) -> None:
    status = notebook_status(app, docname)
    if status is None:
        return
    line, warning = badge_words(status, run)
    para = nodes.paragraph("", "", classes=["provenance-badge"])
    para += nodes.Text(line + " · ")
    para += _status_link(app, "run status")
    nodes_ = [para]
    if warning:
        box = nodes.warning()
        box += nodes.paragraph(text=warning)
        nodes_.append(box)
    sections = list(doctree.findall(nodes.section))
    host = sections[0] if sections else doctree
    at = 1 if host.children and isinstance(host.children[0], nodes.title) else 0
    for k, node in enumerate(nodes_):
        host.insert(at + k, node)


# ---------------------------------------------------------------------------------------------
# The status page
# ---------------------------------------------------------------------------------------------

STATE_MARK = {"current": "✓", "cpu": "⚠", "stale": "✗", "missing": "—", "no-metadata": "✗"}


def _cell(content) -> nodes.entry:
    entry = nodes.entry()
    if isinstance(content, nodes.Node):
        entry += nodes.paragraph("", "", content)
    else:
        entry += nodes.paragraph(text=str(content))
    return entry


@dataclass(frozen=True)
class StatusRow:
    """One notebook of the status page: its docname, its part of the table of contents, its
    :func:`notebook_status` and its ``reference_run`` (``{}`` when it has none); ``env`` and
    ``page`` (the status page's docname) let a column build links."""

    part: str
    docname: str
    status: dict
    run: dict
    env: Any
    page: str


@dataclass(frozen=True)
class StatusColumn:
    """One column of the status page's tables: its ``header``, its relative ``width`` (the
    tables are laid out at a fixed width, so the columns must add up to a page) and ``value``,
    which makes one row's cell (a string or a docutils node) from a :class:`StatusRow`."""

    header: str
    width: int
    value: Callable[[StatusRow], Any]


def _page_link(row: StatusRow):
    if row.docname not in row.env.found_docs:
        return nodes.literal(text=row.docname)
    link = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/" + row.docname,
                                 refdoc=row.page, refexplicit=False, refwarn=True)
    link += nodes.inline(row.docname, row.docname)
    return link


def _state_words(row: StatusRow) -> str:
    words = f"{STATE_MARK[row.status['state']]} {row.status['words']}"
    if row.status.get("pending"):
        words += f"; an older source's run: the revised page waits in {row.status['pending']}"
    return words


def _started(row: StatusRow) -> str:
    # the date and the time on two lines when the column is narrow
    return (row.run.get("started") or "").replace("T", " ").replace("Z", "")[:16]


def _duration(row: StatusRow) -> str:
    value = row.run.get("duration_s")
    return f"{float(value):.1f} s" if value is not None else ""


def _torch(row: StatusRow) -> str:
    # "2.11.0+cu130" may wrap after its "+" (a zero-width space), not inside "cu130"
    return (row.run.get("torch") or "").replace("+", "+\u200b")


def _devices(row: StatusRow) -> str:
    return short_devices(row.run.get("devices")) if row.run else ""


_AGREEMENT: dict[str, Any] = {}


def run_agreement(srcdir: str) -> dict[str, Any]:
    """Each page's newest run in the book's run records (``runs/*.json``) compared with the
    latest earlier record that ran the same source on the same device
    (:func:`perflab.record.verdicts.latest_comparable`): ``{"newest": the newest record's name,
    "pages": {docname: PageComparison}, "runs": {docname: its newest run's name}, "against":
    {docname: the earlier run's name}}``, empty when the repository holds no record. Computed
    once per build."""
    if srcdir not in _AGREEMENT:
        newest, found = verdicts.latest_comparable(srcdir)
        if newest is None:
            _AGREEMENT[srcdir] = {}
        else:
            held: dict[str, int] = {}
            for record in verdicts._records(srcdir):
                for page in record.get("pages", {}):
                    held[page] = held.get(page, 0) + 1
            _AGREEMENT[srcdir] = {"newest": newest,
                                  "held": held,
                                  "pages": {page: p for page, (_, _, p) in found.items()},
                                  "runs": {page: run for page, (run, _, _) in found.items()},
                                  "against": {page: run for page, (_, run, _) in found.items()}}
    return _AGREEMENT[srcdir]


def _agreement(row: StatusRow) -> str:
    agreement = run_agreement(row.env.srcdir)
    found = agreement.get("pages", {}).get(row.docname)
    if found is None:
        if not agreement or row.status.get("state") != "current":
            return "—"
        # the records hold earlier runs of the page, but of older code (or another device):
        # its verdicts are compared with them by scripts/compare_runs.py, not here
        earlier = agreement.get("held", {}).get(row.docname, 0) - 1
        return ("first run of this code" + (f"; {earlier} earlier run{'s' if earlier != 1 else ''}"
                                            " ran older code" if earlier > 0 else ""))
    if not found.verdicts:
        return "no verdicts"
    text = f"{found.agreeing} of {found.verdicts}"
    host = len(found.changes) - len(found.defects)
    if found.defects:
        text += f"; ✗ {len(found.defects)} changed"
    if host:
        text += f"; {host} host-bound changed"
    return text


# The status page's columns, in order: the ONE place that says what the tables show. A column is
# added here (e.g. the verdicts that agree between the last two runs, from the per-run
# records): its header, its share of the width, and a function of a StatusRow.
STATUS_COLUMNS: list[StatusColumn] = [
    StatusColumn("page", 17, _page_link),
    StatusColumn("needs", 8, lambda row: gpus_text(row.status.get("gpus"))),
    StatusColumn("current with its source", 18, _state_words),
    StatusColumn("device(s)", 11, _devices),
    StatusColumn("torch", 11, _torch),
    StatusColumn("started (UTC)", 11, _started),
    StatusColumn("duration", 10, _duration),
    StatusColumn("verdicts agreeing with an earlier run", 14, _agreement),
]


def status_rows(app, page: str) -> list[StatusRow]:
    """A :class:`StatusRow` for every notebook of ``_toc.yml``, in book order."""
    rows = []
    for part, docname in toc_entries(app):
        status = notebook_status(app, docname)
        if status is not None:
            rows.append(StatusRow(part, docname, status, status["run"] or {}, app.env, page))
    return rows


def status_table(rows: list[StatusRow], columns: list[StatusColumn] | None = None) -> nodes.table:
    """One table of the status page: a row per :class:`StatusRow`, a cell per column of
    ``columns`` (default :data:`STATUS_COLUMNS`), laid out at the width of the text column
    (``provenance.css``: fixed layout, cells that wrap)."""
    columns = STATUS_COLUMNS if columns is None else columns
    table = nodes.table(classes=["provenance-status-table", "colwidths-given"])
    group = nodes.tgroup(cols=len(columns))
    table += group
    for column in columns:
        group += nodes.colspec(colwidth=column.width)
    head = nodes.thead()
    row = nodes.row()
    for column in columns:
        row += _cell(column.header)
    head += row
    group += head
    body = nodes.tbody()
    for status_row in rows:
        row = nodes.row(classes=[f"provenance-{status_row.status['state']}"])
        for column in columns:
            cell = _cell(column.value(status_row))
            cell["classes"].append("provenance-col-" + _slug(column.header))
            row += cell
        body += row
    group += body
    return table


def _three(x: float) -> str:
    """``x`` (a claim's measured median: a ratio or seconds, no unit recorded) to three
    significant digits, written out as a person would: ``0.0000508``, ``1.21``, ``1,234``."""
    if not x or not math.isfinite(x):
        return str(x)
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{digits}f}"


def _clip(text: str, n: int = 90) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n - 1] + "…"


def _slug(header: str) -> str:
    """``"current with its source"`` -> ``current-with-its-source`` (a cell's CSS class)."""
    return "-".join(re.findall(r"[a-z0-9]+", header.lower()))


def _common(rows: list[StatusRow], key: str) -> str | None:
    """The one value of ``run[key]`` that every run shares, else None."""
    values = {row.run.get(key) for row in rows if row.run}
    return values.pop() if len(values) == 1 and None not in values else None


def _changes_summary(changes: list) -> str:
    """One sentence on the changed verdicts ``[(page, Change), ...]``: how many, how many of
    them are defects (not declared host-bound), on how many pages."""
    defects = [page for page, c in changes if c.defect]
    if not defects:
        return (f" {len(changes)} verdict(s) changed on {len({p for p, _ in changes})} page(s), "
                "every one of a claim declared host-bound: no device-bound verdict changed.")
    return (f" {len(changes)} verdict(s) changed; ✗ {len(defects)} of them on "
            f"{len(set(defects))} page(s) are not declared host-bound: defects.")


class ProvenanceStatus(SphinxDirective):
    """``provenance-status``: the table of every notebook's reference run, built at build time.

    Option ``:summary-only:`` prints only the one-sentence summary.
    """

    has_content = False
    option_spec = {"summary-only": directives.flag}

    def run(self) -> list[nodes.Node]:
        app = self.env.app
        self.env.provenance_status_docs.add(self.env.docname)
        rows = status_rows(app, self.env.docname)
        current = sum(1 for r in rows if r.status["state"] == "current")
        total_s = sum(float(r.run.get("duration_s") or 0) for r in rows)
        built = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        text = (f"{current} of {len(rows)} notebooks carry a current reference run from a GPU; their "
                f"runs took {total_s:.0f} s in all. This table was generated when the book was built "
                f"({built}) from the notebooks' reference_run metadata.")
        driver, cuda = _common(rows, "driver"), _common(rows, "cuda")
        if driver or cuda:
            shared = " and ".join(x for x in (f"NVIDIA driver {driver}" if driver else "",
                                              f"CUDA {cuda}" if cuda else "") if x)
            text += f" Every run used {shared}."
        summary = nodes.paragraph(text=text)
        summary["classes"].append("provenance-status-summary")
        if "summary-only" in self.options:
            return [summary]

        columns = list(STATUS_COLUMNS)
        if driver is None:   # drivers differ: each row says its own
            at = next(i for i, c in enumerate(columns) if c.header == "device(s)")
            columns.insert(at + 1, StatusColumn("driver", 10, lambda row: row.run.get("driver") or ""))
        tables: list[nodes.Node] = []
        for part in dict.fromkeys(r.part for r in rows):
            # a heading, not a table title: the status tables are not numbered figures
            tables.append(nodes.rubric(text=part or "Notebooks", classes=["provenance-status-part"]))
            tables.append(status_table([r for r in rows if r.part == part], columns))
        legend = nodes.paragraph(text=(
            "✓ the .ipynb's reference run executed exactly the code now in its .md source, on a GPU; "
            "⚠ it did, but on a CPU (sizes scaled down: not a reference run); "
            "✗ stale: the code changed after the run, or the run left no metadata; "
            "— the notebook has not been executed yet."))
        legend["classes"].append("provenance-status-legend")
        waiting = self._pending(app)
        return [summary, *tables, legend, *self._changed(app), *waiting]

    def _changed(self, app) -> list[nodes.Node]:
        """The verdicts that changed between each page's newest run and its latest earlier run
        of the same source on the same device, each with both values: a changed host-bound verdict is a fact about two hosts; any other is a defect of its page
        (its measurement needs rounds)."""
        found = run_agreement(app.srcdir)
        if not found:
            return [nodes.paragraph(text=(
                "The last column compares each page's newest run with an earlier run of the "
                "same source on the same device (scripts/compare_runs.py); runs/ holds no "
                "run record."))]
        against = sorted(set(found["against"].values()))
        newer = sorted(set(found.get("runs", {}).values()))
        changes = [(page, c) for page, p in found["pages"].items() for c in p.changes]
        intro = nodes.paragraph(text=(
            "The last column compares each page's newest run"
            + (f" ({'; '.join(map(str, newer))})" if newer else f" ({found['newest']})")
            + " with the latest earlier run of the same source (its code and the perflab "
            "modules it imports) on the same device, from the run records in runs/"
            + (f" ({'; '.join(map(str, against))})" if against else "")
            + "; scripts/compare_runs.py compares any two. A page without one says so: until "
            "its source has run twice on one device, its verdicts are not yet shown to survive "
            "a second run. A changed verdict of a claim declared host-bound is a fact about "
            "two hosts, shown below with both values; any other changed verdict is a defect "
            "of its page, marked ✗."
            + (_changes_summary(changes) if changes else " No verdict changed."
               if found["pages"] else
               " No page has an earlier run of its source on its device yet.")))
        if not changes:
            return [intro]
        items = nodes.bullet_list(classes=["provenance-changed-verdicts"])
        for page, c in changes:
            kind = "host-bound" if not c.defect else ("✗ " + (f"{c.bound}-bound" if c.bound
                                                              else "bound not declared"))
            ratio = c.over_predicted
            values = ("" if not ratio else f" (measured {_three(ratio[0])}x, then "
                      f"{_three(ratio[1])}x its prediction)")
            item = nodes.list_item()
            item += nodes.paragraph(text=f"{page}, {c.name} [{kind}]{values}: "
                                         f"“{_clip(c.a)}” → “{_clip(c.b)}”")
            items += item
        return [intro, items]

    def _pending(self, app) -> list[nodes.Node]:
        """The sources waiting in ``pending/`` (not in the book yet), with what each waits for."""
        src = Path(app.srcdir)
        found = runs.pending_sources(src)
        if not found:
            return []
        para = nodes.paragraph(text=("Waiting, outside the book, for their reference run: on a "
                                     "machine with more GPUs than the course's runs have now, or "
                                     "(one GPU) on the next run (pending/README.md says what each "
                                     "replaces or joins; CI runs them on a CPU):"))
        items = nodes.bullet_list()
        for md in found:
            item = nodes.list_item()
            item += nodes.paragraph(text=f"{md.relative_to(src)}: needs "
                                         f"{gpus_text(runs.required_gpus(md))}")
            items += item
        return [para, items]


# ---------------------------------------------------------------------------------------------
# Keeping generated content current, and parallel builds
# ---------------------------------------------------------------------------------------------

def on_env_get_outdated(app, env, added, changed, removed) -> list[str]:
    """Pages to read again although their files did not change: the status pages (every
    build), and each notebook page whose source's code or whose staleness (:func:`status_key`:
    a perflab module it imports changed, a page it reads was re-run, a revised source waits
    in ``pending/``) differs from what its badge and footer were built from. Without this, an
    incremental build keeps a page whose ``.ipynb`` did not change with the badge of an older
    build, while the status page, re-read every build, says otherwise."""
    outdated = set(env.provenance_status_docs) - set(removed)
    app._perflab_status_cache = {}          # a new build: every status computed afresh
    for docname, recorded in list(env.provenance_sources.items()):
        if docname in removed:
            continue
        if not isinstance(recorded, tuple) or recorded != (
                source_sha(app, docname), status_key(notebook_status(app, docname))):
            outdated.add(docname)
    return sorted(outdated)


def on_env_purge_doc(app, env, docname) -> None:
    env.provenance_status_docs.discard(docname)
    env.provenance_sources.pop(docname, None)


def on_env_merge_info(app, env, docnames, other) -> None:
    env.provenance_status_docs.update(getattr(other, "provenance_status_docs", set()))
    env.provenance_sources.update(getattr(other, "provenance_sources", {}))


def on_builder_inited(app) -> None:
    app._perflab_status_cache = {}
    env = app.env
    if not hasattr(env, "provenance_status_docs"):
        env.provenance_status_docs = set()
    if not hasattr(env, "provenance_sources"):
        env.provenance_sources = {}


def dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated ``<script>`` entries from a page (first copy kept, order preserved).

    With jupyter-book 1.0.4 and Sphinx 7.4, the inline configuration scripts of sphinx-thebe and
    sphinx-togglebutton are emitted twice on every page (once registered with ``filename=None``,
    once with ``""``, so Sphinx's own de-duplication misses them); the second ``const
    THEBE_JS_URL`` declaration is a JavaScript SyntaxError in every reader's console (found by
    tests/test_book.py).
    """
    files = context.get("script_files")
    if not files:
        return
    seen, kept = set(), []
    for js in files:
        attrs = getattr(js, "attributes", {}) or {}
        key = (getattr(js, "filename", str(js)) or "",  # None and "" both mean an inline script
               tuple(sorted((k, str(v)) for k, v in attrs.items() if k != "priority")))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    if len(kept) != len(files):
        context["script_files"] = kept


def vendored_mathjax(cache: Path) -> Path:
    """A folder holding ``mathjax/tex-mml-chtml.js`` and what it loads, vendored from the npm
    registry into ``cache`` on first use (the tarball's SHA-512 is checked); returned for
    ``html_static_path``.

    Raises:
        OSError: the registry cannot be reached (no network on a fresh clone's first build).
        ValueError: the download does not match :data:`MATHJAX_SHA512`.
    """
    root = cache / f"mathjax-{MATHJAX_VERSION}"
    if (root / "mathjax" / "tex-mml-chtml.js").exists():
        return root
    with urllib.request.urlopen(MATHJAX_TARBALL, timeout=60) as response:
        data = response.read()
    if base64.b64encode(hashlib.sha512(data).digest()).decode() != MATHJAX_SHA512:
        raise ValueError(f"{MATHJAX_TARBALL} does not match its published SHA-512")
    partial = cache / f".mathjax-{MATHJAX_VERSION}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.removeprefix("package/es5/")
            if member.isfile() and rel != member.name and rel.startswith(MATHJAX_PARTS):
                target = partial / "mathjax" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return root


def _use_vendored_mathjax(config) -> None:
    try:
        root = vendored_mathjax(ROOT / ".cache")
    except (OSError, ValueError) as err:
        logger.warning(f"MathJax {MATHJAX_VERSION} could not be vendored from {MATHJAX_TARBALL} ({err}): "
                       "the book's math would load from a CDN")
        return
    config.mathjax_path = "mathjax/tex-mml-chtml.js"  # relative: served from the book's _static
    if str(root) not in config.html_static_path:
        config.html_static_path = list(config.html_static_path) + [str(root)]


def on_config_inited(app, config) -> None:
    opts = dict(config.html_theme_options or {})
    url = (opts.get("repository_url") or "").strip()
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    if url:
        subs.setdefault("repository_url", f"[{url}]({url})")
        subs.setdefault("repository_clone", url.rstrip("/") + ".git")
        subs.setdefault("repository_pip", f"`%pip install -q myst-nb git+{url.rstrip('/')}.git`")
        subs.setdefault("run_in_the_cloud", "The rocket button at the top of a notebook page opens it on Binder "
                                            "(which installs the course's requirements, CPU only) or on Colab (which "
                                            "may have a GPU, but not the course's helper package: run "
                                            f"`%pip install -q myst-nb git+{url.rstrip('/')}.git` in the first cell).")
        if getattr(config, "html_theme", None) == "sphinx_book_theme":  # other themes lack these options
            opts["use_repository_button"] = opts["use_issues_button"] = True
    else:  # no public address yet: no button may link to an invented one
        # what a reader can do, in words that read in the front page's sentences ("Clone
        # {{ repository_url }} and run ..."), not what this build lacks (reader review M7)
        subs.setdefault("repository_url", "the course's repository")
        subs.setdefault("repository_clone", "")
        subs.setdefault("repository_pip", "`%pip install -q myst-nb` and upload the repository's `perflab` folder")
        subs.setdefault("run_in_the_cloud", "Download the course (.zip) above, unpack it, and open a "
                                            "notebook in Colab or any Jupyter server with its `perflab` "
                                            "folder beside it; a Colab session may have a GPU.")
        opts.pop("repository_url", None)
        if "launch_buttons" in opts:
            opts["launch_buttons"] = {}
        for key in ("use_repository_button", "use_issues_button", "use_edit_page_button", "use_source_button"):
            if key in opts:
                opts[key] = False
    config.html_theme_options = opts
    config.myst_substitutions = subs
    static = str(STATIC)
    if static not in config.html_static_path:
        config.html_static_path = list(config.html_static_path) + [static]
    if app is not None:
        _use_vendored_mathjax(config)


def setup(app):
    app.add_config_value("provenance_status_page", "status", "env")
    app.add_directive("provenance-status", ProvenanceStatus)
    app.add_css_file("provenance.css")
    app.connect("config-inited", on_config_inited)
    # after sphinx-external-toc (priority 900) parsed _toc.yml into the site map
    app.connect("config-inited", drop_pages_awaiting_their_first_run, priority=950)
    app.connect("missing-reference", link_to_a_page_awaiting_its_run)
    app.connect("builder-inited", on_builder_inited)
    app.connect("env-get-outdated", on_env_get_outdated)
    app.connect("env-purge-doc", on_env_purge_doc)
    app.connect("env-merge-info", on_env_merge_info)
    app.connect("doctree-read", on_doctree_read)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"version": "0.2", "parallel_read_safe": True, "parallel_write_safe": True}
