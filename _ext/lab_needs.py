"""Sphinx extension: the ``lab-needs`` directive, a table of what each lab needs to run.

For every lab source ``labs/*.md`` it shows (via :func:`perflab.labs.exercises.lab_needs`) the GPUs
its cells use (every lab runs on a CPU too), the GPU memory and minutes of its reference run
(``reference_run`` metadata of the committed ``.ipynb``), and the minutes of the last CPU run
recorded in ``labs/cpu_runs.json`` by ``scripts/execute.py --record-cpu``. Nothing is typed: a
missing record shows as "not recorded". The page is re-read whenever a lab or a record changes.

The ``grading-time`` directive shows the grader's measured runs on a class
(``labs/grading_runs.json``, written by ``python -m grader.timing``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _cell(text: str) -> nodes.entry:
    entry = nodes.entry()
    entry += nodes.paragraph(text=text)
    return entry


def _table(head: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["lab-needs"])
    group = nodes.tgroup(cols=len(head))
    table += group
    for _ in head:
        group += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    group += thead
    row = nodes.row()
    for h in head:
        row += _cell(h)
    thead += row
    body = nodes.tbody()
    group += body
    for r in rows:
        row = nodes.row()
        for text in r:
            row += _cell(text)
        body += row
    return table


class LabNeeds(SphinxDirective):
    has_content = False

    def run(self):
        root = Path(self.env.srcdir)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        from perflab.labs.exercises import lab_needs

        labs = sorted((root / "labs").glob("*.md"))
        rows = []
        for md in labs:
            for dep in (md, md.with_suffix(".ipynb"), md.parent / "cpu_runs.json"):
                if dep.exists():
                    self.env.note_dependency(str(dep))
            n = lab_needs(md)
            gpu = (f"{n['reference_minutes']:.1f} min on {n['reference_devices']}"
                   if n["reference_minutes"] is not None else "not recorded")
            gib = n["gpu_memory_gib"]
            mem = ("not recorded yet" if gib is None else
                   "under 0.1 GiB" if gib < 0.05 else f"{gib:.1f} GiB")
            cpu = "not recorded"
            if n["cpu_minutes"] is not None:
                cpu = f"{n['cpu_minutes']:.1f} min on {n['cpu']}" + ("" if n["cpu_current"] else " (older code)")
            rows.append([md.stem, n["runs_on"], mem, gpu, cpu])
        head = ["lab", "runs on", "GPU memory (reference run)", "reference GPU", "CPU"]
        return [_table(head, rows)]


class GradingTime(SphinxDirective):
    """``grading-time``: how long the grader took on a class, one sentence per lab recorded in
    ``labs/grading_runs.json`` (written by ``python -m grader.timing``)."""

    has_content = False

    def run(self):
        root = Path(self.env.srcdir)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        from grader.timing import describe

        path = root / "labs" / "grading_runs.json"
        if path.exists():
            self.env.note_dependency(str(path))
        records = json.loads(path.read_text()) if path.exists() else {}
        if not records:
            return [nodes.paragraph(text="No grading run is recorded yet (python -m grader.timing records one).")]
        items = nodes.bullet_list()
        for lab in sorted(records):
            item = nodes.list_item()
            item += nodes.paragraph(text=describe(records[lab]))
            items += item
        return [items]


def setup(app):
    app.add_directive("lab-needs", LabNeeds)
    app.add_directive("grading-time", GradingTime)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
