#!/usr/bin/env python3
"""Make the student version of labs: solutions removed, hidden tests removed, outputs cleared.

    python scripts/make_student.py                 # every labs/*.md -> student/labs/*.ipynb,
                                                   # and the reference runs -> student/book/
    python scripts/make_student.py labs/01_roofline.md -o /tmp/out
    python scripts/make_student.py --book DIR      # the book's sources with student labs, in DIR
                                                   # (make book-student builds them)

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

``--book DIR`` stages the student edition of the *book*: DIR gets a copy of the book's sources
(the extensions linked) and, for each lab, its executed reference notebook as a student sees it
(:func:`student_reference`: solutions replaced by the same stubs, their outputs dropped, hidden
tests and markdown solutions removed, the other cells' outputs and the run's provenance kept),
the student sources the course download ships (``DIR/.student_labs/``) and a ``_config.yml``
that says so (``reader_edition: student``). The lab sources stay the full ones, outside the
book (Sphinx reads only the ``.ipynb``), so each page's run status is still decided against the
source that ran.

A missing path or a file that is not a MyST notebook: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
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


def strip_markdown(source: str) -> str:
    """A markdown cell's source without its ``<!-- BEGIN SOLUTION -->`` ... ``<!-- END SOLUTION -->`` parts."""
    return _MD_SOLUTION.sub("", source)


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
            cell.source = strip_markdown(cell.source)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _hidden_labels(source: str) -> list[str]:
    """The string literals (8 characters or more) of a cell's hidden tests: a check prints its
    label (``check_close(x, 124_439_808, "GPT-2 small's parameter count")`` prints
    ``✓ GPT-2 small's parameter count: ...``), so an output line holding one came from them."""
    blocks = "".join(m.group(0) for m in _HIDDEN.finditer(source))
    return [a or b for a, b in re.findall(r'"([^"\n]{8,})"|\'([^\'\n]{8,})\'', blocks)]


def _without_hidden_outputs(outputs: list, source: str, stripped: str) -> list:
    """``outputs`` of a cell with hidden tests, as the student edition may show them: every
    output when the hidden tests print nothing recognisable; none when the cell was only hidden
    tests; otherwise each stream's lines that quote a hidden test's label removed, and any other
    output that quotes one dropped."""
    if not stripped.strip():
        return []
    labels = _hidden_labels(source)
    if not labels:
        return list(outputs)
    kept = []
    for out in outputs:
        if out.get("output_type") == "stream":
            lines = [ln for ln in out.get("text", "").splitlines(keepends=True)
                     if not any(lab in ln for lab in labels)]
            if lines:
                out = nbformat.from_dict({**out, "text": "".join(lines)})
                kept.append(out)
        elif not any(lab in json.dumps(out.get("data", {}), ensure_ascii=False)
                     for lab in labels):
            kept.append(out)
    return kept


def student_reference(ipynb: Path) -> nbformat.NotebookNode:
    """A lab's executed reference notebook as the student edition of the book shows it.

    Code cells get :func:`strip_code` (solutions become stubs, hidden tests go); a cell that held
    a solution keeps only its glued values (which print nothing; the prose may quote them) and
    no other output; a cell with hidden tests loses the output lines those tests printed (all its
    output when it held nothing else); markdown solutions are removed; ``hide-input`` is dropped from solution
    cells (the stub is what a student needs to see). ``metadata.reference_run`` is kept and
    ``metadata.student_edition`` set to True.
    """
    nb = nbformat.read(ipynb, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            stripped = strip_code(cell.source, exercise_number(grade_id))
            if _CODE_SOLUTION.search(cell.source):
                cell.outputs = [o for o in cell.get("outputs", [])
                                if o.get("metadata", {}).get("scrapbook")]
                tags = [t for t in cell.get("metadata", {}).get("tags", []) if t != "hide-input"]
                if "tags" in cell.metadata:
                    cell.metadata["tags"] = tags
            elif _HIDDEN.search(cell.source):
                cell.outputs = _without_hidden_outputs(cell.get("outputs", []), cell.source,
                                                       stripped)
            cell.source = stripped
        elif cell.cell_type == "markdown":
            cell.source = _MD_SOLUTION.sub("", cell.source)
    nb.metadata["student_edition"] = True
    return nb


# what --book does not link into the staged sources (build outputs, environments, the labs)
_NOT_STAGED = {".git", ".venv", "_build", ".cache", "student", ".whl", ".tools", ".pytest_cache", ".ci", "tests",
               "conftest.py",
               "__pycache__", "labs", "_config.yml", "conf.py"}


def stage_book(dest: Path, root: Path = ROOT) -> Path:
    """Stage the book's student edition in ``dest`` (see the module docstring); returns ``dest``.

    Raises:
        ValueError: ``dest`` is the repository itself or holds it.
    """
    import yaml  # the book's configuration (PyYAML comes with jupyter-book)

    dest = dest.resolve()
    if dest == root.resolve() or root.resolve().is_relative_to(dest):
        raise ValueError(f"--book {dest}: stage the student book outside the repository's own sources")
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(root.iterdir()):
        if item.name in _NOT_STAGED:
            continue
        target = dest / item.name
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        if item.name == "_ext":  # linked: the extensions keep the clone's .cache (vendored MathJax)
            target.symlink_to(item.resolve())
        elif item.is_dir():   # copied: a page's paths (pending/, its run status) stay inside the staged book
            shutil.copytree(item, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(item, target)
    labs, sources = dest / "labs", dest / ".student_labs"
    for folder in (labs, sources):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    for item in sorted((root / "labs").iterdir()):
        if item.suffix != ".ipynb" and item.is_file():  # the full sources (never rendered), data files
            shutil.copy2(item, labs / item.name)
    for md in sorted((root / "labs").glob("*.md")):
        jupytext.write(student_notebook(md), sources / md.name, fmt="md:myst")
        if md.with_suffix(".ipynb").exists():
            nbformat.write(student_reference(md.with_suffix(".ipynb")), labs / f"{md.stem}.ipynb")
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    config["title"] = f"{config.get('title', 'The book')} (student edition)"
    extra = config.setdefault("sphinx", {}).setdefault("config", {})
    extra["reader_edition"] = "student"
    extra["reader_student_sources"] = str(sources)
    config.setdefault("exclude_patterns", []).append(".student_labs")
    (dest / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
                                      encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write student versions of the labs.")
    parser.add_argument("paths", nargs="*", help="lab sources (.md); default: labs/*.md")
    parser.add_argument("-o", "--out", default=str(ROOT / "student" / "labs"), help="output folder")
    parser.add_argument("--book", type=Path, default=None, metavar="DIR",
                        help="stage the student edition of the book's sources in DIR instead")
    args = parser.parse_args(argv)
    if args.book is not None:
        try:
            print(f"student edition of the book staged in {stage_book(args.book)}")
        except ValueError as err:
            print(f"make_student.py: {err}", file=sys.stderr)
            return 2
        return 0
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
