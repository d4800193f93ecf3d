#!/usr/bin/env python3
"""Make the student version of labs: solutions removed, hidden tests removed, outputs cleared.

    python scripts/make_student.py                 # every labs/*.md -> student/labs/*.ipynb,
                                                   # and the reference runs -> student/book/
    python scripts/make_student.py labs/01_roofline.md -o /tmp/out

The labs use nbgrader's markers, so instructors who already use nbgrader can run
``nbgrader generate_assignment`` on the ``.ipynb`` instead; this script does the same for
everybody else, with no extra dependency:

* code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes
  ``# YOUR CODE HERE`` + ``perflab.labs.exercises.not_done(N)`` (indented like the markers), which
  raises ``ExerciseNotDone``: one sentence, "Exercise N is not done yet: ...". ``N`` is the
  number in the cell's nbgrader ``grade_id`` (``ex3-solution`` -> 3). Names that checks read are
  stub lines *outside* the markers in the lab itself (``regimes = None  # set by your code``), so
  they exist in the student edition too;
* code between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` is dropped;
* markdown between ``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->`` is dropped.

A missing path or a file that is not a MyST notebook: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent

_CODE_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)", re.S | re.M)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*(\n|$)", re.S | re.M)
_MD_SOLUTION = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->\n?", re.S)


_EXERCISE = re.compile(r"ex(?:ercise)?[-_ ]?(\d+)", re.I)


def exercise_number(grade_id: str | None) -> str:
    """The exercise number in an nbgrader ``grade_id`` (``"ex3-solution"`` -> ``"3"``), else ``"?"``."""
    m = _EXERCISE.search(grade_id or "")
    return m.group(1) if m else "?"


def strip_code(source: str, exercise: str = "?") -> str:
    """A code cell's source with solutions replaced and hidden tests removed.

    Each solution becomes ``# YOUR CODE HERE`` and ``perflab.labs.exercises.not_done(exercise)``.
    """
    number = exercise if exercise.isdigit() else repr(exercise)
    source = _CODE_SOLUTION.sub(
        lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}perflab.labs.exercises.not_done({number})\n", source)
    return _HIDDEN.sub("", source).rstrip("\n")


def student_notebook(md: Path) -> nbformat.NotebookNode:
    """The student version of a lab source (``.md``) as an unexecuted notebook.

    Raises:
        ValueError: the lab has solution markers but never runs ``import perflab`` (the stubs
            call ``perflab.labs.exercises.not_done``).
    """
    nb = jupytext.read(md)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    if "BEGIN SOLUTION" in code and not re.search(r"^import perflab\b", code, re.M):
        raise ValueError(f"{md}: the student edition's stubs need 'import perflab' in the lab")
    for cell in nb.cells:
        if cell.cell_type == "code":
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            cell.source = strip_code(cell.source, exercise_number(grade_id))
            tags = [t for t in cell.get("metadata", {}).get("tags", []) if t != "hide-input"]
            if "tags" in cell.get("metadata", {}):   # the book collapses solutions; students see stubs
                cell.metadata["tags"] = tags
                if not tags:
                    del cell.metadata["tags"]
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = _MD_SOLUTION.sub("", cell.source)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write student versions of the labs.")
    parser.add_argument("paths", nargs="*", help="lab sources (.md); default: labs/*.md")
    parser.add_argument("-o", "--out", default=str(ROOT / "student" / "labs"), help="output folder")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted((ROOT / "labs").glob("*.md"))
    out = Path(args.out)
    for p in paths:
        if not p.exists():
            print(f"make_student.py: {p}: no such file", file=sys.stderr)
            return 2
        if p.suffix != ".md" or "format_name: myst" not in p.read_text()[:2000]:
            print(f"make_student.py: {p}: not a MyST notebook source", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    for p in paths:
        target = out / (p.stem + ".ipynb")
        nbformat.write(student_notebook(p), target)
        print(f"{p} -> {target}")
    # each lab ends by reading its chapter's reference run at ../book/NN_topic.ipynb: give the
    # student folder the same layout, with copies of the executed reference notebooks
    book = out.parent / "book"
    references = sorted((ROOT / "book").glob("*.ipynb"))
    if references and book.resolve() != (ROOT / "book").resolve():
        book.mkdir(parents=True, exist_ok=True)
        for ref in references:
            shutil.copy2(ref, book / ref.name)
        print(f"{len(references)} reference notebooks -> {book}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
