"""Sphinx extension: every executed page says where its numbers came from.

At build time, for each page built from an ``.ipynb``, this reads the notebook's
``metadata.reference_run`` (written by ``scripts/execute.py``) and appends a footer:
"This page was run on <devices> ... from source <sha> at commit <git>". A notebook without a
reference run gets a warning (so ``-W`` builds fail) rather than a silent page with no provenance.
"""

from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)


def describe_run(run: dict) -> str:
    """One sentence from a ``reference_run`` dict (shared with other generated pages)."""
    devices = run.get("devices") or ["?"]
    if len(devices) > 1 and len(set(devices)) == 1:
        dev = f"{len(devices)}× {devices[0]}"
    else:
        dev = ", ".join(devices)
    parts = [f"This page was run on {dev}"]
    if run.get("driver"):
        parts.append(f"driver {run['driver']}")
    if run.get("cuda"):
        parts.append(f"CUDA {run['cuda']}")
    parts.append(f"torch {run.get('torch', '?')}, Python {run.get('python', '?')}")
    when = run.get("started", "?").replace("T", " ").replace("Z", " UTC")
    text = ", ".join(parts) + f", started {when}, taking {run.get('duration_s', '?')} s"
    sha = (run.get("source_sha256") or "")[:12]
    git = (run.get("git") or "")[:10]
    text += f"; source code hash {sha}" + (f", commit {git}" if git else "") + "."
    return text


def _reference_run(app, docname: str) -> dict | None:
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return None
    try:
        return json.loads(path.read_text()).get("metadata", {}).get("reference_run") or {}
    except (OSError, ValueError):
        return {}


def add_footer(app, doctree) -> None:
    docname = app.env.docname
    run = _reference_run(app, docname)
    if run is None:
        return
    if not run:
        logger.warning(f"{docname}: the notebook has no reference_run metadata", location=docname)
        return
    para = nodes.paragraph(text=describe_run(run))
    box = nodes.container("", para, classes=["provenance-footer"])
    sections = list(doctree.findall(nodes.section))
    (sections[0] if sections else doctree).append(box)


def setup(app):
    app.connect("doctree-read", add_footer)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
