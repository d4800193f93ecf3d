"""Every lab's checks are proven: the reference solution passes them, each wrong solution fails.

Each lab (``labs/*.md``, so labs added later are covered) is executed once in this process on
CPU, cell by cell, with its hidden tests: every check must pass. The namespace is kept as it was
before each solution cell; a wrong solution (``tests/lab_wrong_solutions.py``) is then run from
there, followed by the cells up to its exercise's checks, one of which must raise
``ExerciseFailed`` saying what is wrong. Speed checks are also replayed on modelled machines in
``tests/test_exercises.py`` (a right answer must not fail on another host/GPU balance).
"""

import linecache
import os
import re
import sys
import time
from pathlib import Path

import jupytext
import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import make_student  # noqa: E402
from lab_wrong_solutions import WRONG  # noqa: E402

from perflab.exercises import ExerciseFailed  # noqa: E402

LABS = sorted((ROOT / "labs").glob("*.md"))
_RUNS: dict = {}



def _exec(src: str, name: str, ns: dict) -> None:
    """Execute a cell's source in ``ns`` as a notebook kernel would: with its text registered in
    ``linecache``, so that ``inspect.getsource`` finds the functions it defines (lab 8 sends the
    student's functions to its worker processes by their source)."""
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    exec(compile(src, name, "exec"), ns)

def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _run(cells, ns, start, stop_after_exercise=None, first_source=None):
    """Execute code cells from ``start``; return {check grade_id: None or the ExerciseFailed}."""
    results = {}
    for i in range(start, len(cells)):
        cell = cells[i]
        g = _meta(cell)
        number = make_student.exercise_number(g.get("grade_id"))
        if stop_after_exercise is not None and g.get("grade") and number != stop_after_exercise and results:
            break
        src = first_source if (i == start and first_source is not None) else cell.source
        try:
            _exec(src, f"<cell {i} {g.get('grade_id', '')}>", ns)
            if g.get("grade"):
                results[g["grade_id"]] = None
        except ExerciseFailed as err:
            if not g.get("grade") and stop_after_exercise is None:
                raise
            results[g.get("grade_id", f"cell {i}")] = err
            if not g.get("grade"):
                break
    return results


def reference(lab: Path):
    """(cells, {solution grade_id: namespace before it}, check results, seconds): cached per lab."""
    if lab not in _RUNS:
        cells = [c for c in jupytext.read(lab).cells if c.cell_type == "code"]
        ns: dict = {"__name__": "__lab__"}
        snapshots, results = {}, {}
        cwd = os.getcwd()
        os.chdir(lab.parent)          # the closing cells read ../book/NN_*.ipynb
        t0 = time.perf_counter()
        try:
            for i, cell in enumerate(cells):
                g = _meta(cell)
                if g.get("solution"):
                    snapshots[g["grade_id"]] = (i, dict(ns))
                try:
                    _exec(cell.source, f"<{lab.stem} cell {i}>", ns)
                    if g.get("grade"):
                        results[g["grade_id"]] = None
                except ExerciseFailed as err:
                    results[g.get("grade_id", f"cell {i}")] = err
        finally:
            os.chdir(cwd)
        _RUNS[lab] = (cells, snapshots, results, time.perf_counter() - t0)
    return _RUNS[lab]


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_reference_solution_passes_every_check(lab):
    cells, _, results, seconds = reference(lab)
    print(f"{lab.name}: reference executed in-process in {seconds:.1f} s")
    failed = {gid: str(err) for gid, err in results.items() if err is not None}
    assert not failed, f"{lab.name}: the reference solution fails {failed}"
    checks = {_meta(c)["grade_id"] for c in cells if _meta(c).get("grade")}
    assert checks <= set(results)


CASES = [(lab, k) for lab in LABS for k in range(len(WRONG.get(lab.stem, [])))]


@pytest.mark.parametrize("lab, k", CASES, ids=[f"{lab.stem}-{WRONG[lab.stem][k][0]}-{k}" for lab, k in CASES])
def test_wrong_solution_fails_its_check(lab, k):
    sol_id, old, new, pattern = WRONG[lab.stem][k]
    cells, snapshots, results, _ = reference(lab)
    if any(err is not None for err in results.values()):
        pytest.skip("the reference run failed (see test_reference_solution_passes_every_check)")
    start, before = snapshots[sol_id]
    assert old in cells[start].source, f"{sol_id}: {old!r} is not in the reference solution any more"
    ns = dict(before)
    cwd = os.getcwd()
    os.chdir(lab.parent)
    try:
        outcome = _run(cells, ns, start, stop_after_exercise=make_student.exercise_number(sol_id),
                       first_source=cells[start].source.replace(old, new))
    finally:
        os.chdir(cwd)
    errors = [str(e) for e in outcome.values() if e is not None]
    assert errors, f"{lab.name}: the wrong solution ({new[:60]!r}) passed every check: {list(outcome)}"
    assert any(re.search(pattern, e) for e in errors), f"{lab.name}: failed, but not as expected: {errors}"


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_every_exercise_has_a_wrong_solution(lab):
    exercises = {make_student.exercise_number(_meta(c)["grade_id"])
                 for c in jupytext.read(lab).cells if _meta(c).get("grade")}
    covered = {make_student.exercise_number(entry[0]) for entry in WRONG.get(lab.stem, [])}
    assert lab.stem in WRONG, f"{lab.name}: no wrong solutions in tests/lab_wrong_solutions.py"
    assert exercises <= covered, f"{lab.name}: exercises without a wrong solution: {sorted(exercises - covered)}"
