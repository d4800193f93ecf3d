"""What the grader reads from a lab and builds from a submission: the notebook a kernel runs,
the hidden tests it keeps for itself, the names the checks read, and the notebook handed back.
"""

from __future__ import annotations

import ast
import copy
import re
import sys
import textwrap
from pathlib import Path

import jupytext
from nbformat.v4 import new_code_cell

from grader import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402  (scripts/ is not a package)

#: the framework's checks that record a verdict in the ledger (perflab.labs.exercises, lab01)
CHECKS = ("check_close", "check_choice", "check_true", "check_ratio_at_least", "check_timer")
_EXERCISE = re.compile(r"ex(?:ercise)?[-_ ]?(\d+)", re.I)
_HIDDEN_BLOCK = re.compile(r"^([ \t]*)### BEGIN HIDDEN TESTS[^\n]*\n(.*?)^[ \t]*### END HIDDEN TESTS[^\n]*(\n|$)",
                           re.S | re.M)


def nbgrader(cell) -> dict:
    """A cell's nbgrader metadata ({} if none)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def exercise_of(grade_id: str | None) -> str:
    """The exercise a ``grade_id`` belongs to (``"ex3-check"`` -> ``"3"``; else the id itself)."""
    m = _EXERCISE.search(grade_id or "")
    return m.group(1) if m else (grade_id or "?")


def instructor_notebook(lab: Path):
    """The lab source (``.md``) as a notebook, hidden tests included, outputs empty."""
    nb = jupytext.read(lab)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def exercises_of(lab: Path) -> dict[str, list[tuple[str, float]]]:
    """{exercise number: [(check grade_id, points), ...]} of a lab, in order: an exercise with
    several check cells has several parts, each scored on its own."""
    out: dict[str, list[tuple[str, float]]] = {}
    for cell in instructor_notebook(lab).cells:
        g = nbgrader(cell)
        if g.get("grade"):
            out.setdefault(exercise_of(g.get("grade_id", "")), []).append((g["grade_id"], float(g.get("points", 0))))
    return out


def split_hidden(source: str) -> tuple[str, list[str]]:
    """``(visible code, [hidden test blocks])`` of a cell: the visible code is what the student
    edition shows (the blocks between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``
    cut out), each block dedented to run on its own.

    Raises:
        ValueError: a block sits inside a statement (an indented marker): cut out, it would no
            longer mean what it meant there.
    """
    blocks = []
    for m in _HIDDEN_BLOCK.finditer(source):
        if m.group(1):
            raise ValueError("a hidden-test block is indented: put it at the top level of its cell")
        blocks.append(textwrap.dedent(m.group(2)))
    return _HIDDEN_BLOCK.sub("", source), blocks


def graded_notebook(instructor, submission):
    """The notebook to execute: the instructor's cells, with the submission's solution cells.

    Solution cells (nbgrader ``solution: true``) are taken from ``submission`` by ``grade_id``;
    one the submission lacks becomes the student stub. Every other instructor cell (checks,
    set-up) is the instructor's, whatever the submission holds under its id. Code cells the
    student added (no nbgrader id known to the lab) follow the solution cell they followed in the
    submission (an unlabeled cell whose text is none of the lab's is one the student added; an
    edited copy of an instructor cell counts as added, and runs after the original). Each code
    cell's ``metadata.perflab_origin`` says whose code it is (``student`` or ``instructor``); an
    instructor cell's hidden tests are cut out of its source and kept in
    ``metadata.perflab_hidden`` (the grader runs them in its own process). Returns a new notebook.
    """
    solution_ids = {nbgrader(c).get("grade_id") for c in instructor.cells if nbgrader(c).get("solution")}
    theirs: dict[str, str] = {}
    extra: dict[str | None, list[str]] = {}
    anchor = None
    known = {nbgrader(c).get("grade_id") for c in instructor.cells} - {None}
    # the student edition's copies of the instructor's unlabeled cells (set-up, experiments)
    instructor_sources = {make_student.strip_code(c.source).strip() for c in instructor.cells
                          if c.cell_type == "code"}
    for cell in submission.cells:
        gid = nbgrader(cell).get("grade_id")
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if gid in solution_ids:
            theirs.setdefault(gid, source)
            anchor = gid
        elif gid not in known and source.strip() not in instructor_sources:
            extra.setdefault(anchor, []).append(source)

    def added(src):
        cell = new_code_cell(src)
        cell.metadata["perflab_origin"] = "student"
        return cell

    nb = copy.deepcopy(instructor)
    cells = [added(src) for src in extra.get(None, [])]
    for cell in nb.cells:
        gid = nbgrader(cell).get("grade_id")
        if cell.cell_type == "code" and gid in solution_ids:
            cell.source = theirs.get(gid, make_student.strip_code(cell.source, make_student.exercise_number(gid)))
            cell.metadata["perflab_origin"] = "student"
            cells.append(cell)
            cells.extend(added(src) for src in extra.get(gid, []))
        else:
            if cell.cell_type == "code":
                cell.metadata["perflab_origin"] = "instructor"
                cell.source, hidden = split_hidden(cell.source)
                if hidden:
                    cell.metadata["perflab_hidden"] = hidden
            cells.append(cell)
    nb.cells = cells
    return nb


def feedback_notebook(nb):
    """The executed notebook as a student may see it: the lab's own cells without solutions
    (their outputs kept; the hidden tests were never in them, their results are), the student's
    cells as they ran."""
    for cell in nb.cells:
        meta = cell.get("metadata", {})
        origin = meta.pop("perflab_origin", None)
        meta.pop("perflab_hidden", None)
        if cell.cell_type == "code" and origin == "instructor":
            cell.source = make_student.strip_code(cell.source, make_student.exercise_number(nbgrader(cell).get("grade_id")))
        elif cell.cell_type == "markdown":
            cell.source = make_student.strip_markdown(cell.source)
    return nb


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def checks_called(source: str) -> set[str]:
    """The names in :data:`CHECKS` that a cell calls in statements at its top level (not inside
    an ``if``, loop, ``try`` or function): running the cell must record a verdict of each."""
    tree = _parse(source)
    found = set()
    for stmt in tree.body if tree else ():
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in CHECKS:
                found.add(name)
    return found


def calls_check_unconditionally(source: str) -> bool:
    """Whether a cell calls one of :data:`CHECKS` at its top level (see :func:`checks_called`)."""
    return bool(checks_called(source))


def stored_names(source: str) -> set[str]:
    """Every name a cell binds anywhere: assignments, ``for`` targets, definitions, imports."""
    tree = _parse(source)
    out: set[str] = set()
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def loaded_names(source: str) -> set[str]:
    """Every name a cell reads anywhere (nested functions and comprehensions included)."""
    tree = _parse(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} if tree else set()


_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add",
             "discard", "sort", "reverse", "popitem", "copy_", "fill_", "zero_"}


def mutated_names(source: str) -> set[str]:
    """Names whose object a cell changes in place anywhere (``state["x"] = 1``, ``ratios[k] +=``,
    ``obj.attr = v``, ``del d[k]``, ``log.append(...)``, a tensor's ``add_(...)``): for those,
    only a new binding says that someone else changed them."""
    tree = _parse(source)
    out: set[str] = set()

    def base(node):
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree) if tree else ():
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in _MUTATORS or node.func.attr.endswith("_") and not node.func.attr.startswith("_")):
            targets = [node.func.value]
        for t in targets:
            for sub in ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(sub, (ast.Subscript, ast.Attribute)) or (isinstance(node, ast.Call) and sub is t):
                    name = base(sub)
                    if name:
                        out.add(name)
    return out


def free_names(source: str) -> set[str]:
    """Names a cell reads but never binds itself: what it takes from the notebook."""
    return loaded_names(source) - stored_names(source)


def watched_names(nb, instructor) -> dict[int, set[str]]:
    """{index of a code cell of ``nb``: the notebook names a check after it reads}.

    A name that a later check cell (its visible code or its hidden tests) reads and does not bind
    itself, and that is not one of the lab's answers (a name the instructor's solution cells
    bind), must not change under a student's code: a rebound ``expressions``, a mutated ``xs``
    or a ``tuple`` of the student's own would change what the check computes. Builtins count.
    """
    answers: set[str] = set()
    for cell in instructor.cells:
        if cell.cell_type == "code" and nbgrader(cell).get("solution"):
            answers |= stored_names(cell.source)
    later: set[str] = set()
    out: dict[int, set[str]] = {}
    for index in range(len(nb.cells) - 1, -1, -1):
        cell = nb.cells[index]
        if cell.cell_type != "code":
            continue
        out[index] = set(later)
        meta = cell.get("metadata", {})
        if meta.get("perflab_origin") != "student" and nbgrader(cell).get("grade"):
            for src in [cell.source, *meta.get("perflab_hidden", [])]:
                later |= free_names(src) - answers
    return out
