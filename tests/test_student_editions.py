"""Every lab's student edition, executed on CPU as handed out: each exercise stops with one sentence.

The student edition replaces each solution with ``perflab.labs.exercises.not_done(N)``. Executed cell
by cell with nothing filled in (as *Run Selected Cell and All Below* from each exercise would),
every cell either runs or ends in ``ExerciseNotDone`` with the message
"Exercise N is not done yet: ...": never a ``NameError``, ``TypeError`` or bare
``NotImplementedError``. Every exercise's check cell is among those that stop, so nothing
passes without an answer. Labs added later are covered by the glob.

The execution is ``tests/lab_runs.py``'s: in the lab's kernel, the student edition's cells run
from the namespace the identical cells before its first changed cell left (the reference run
executed them; on a GPU machine, or where that run failed there, the whole edition runs in a
fresh kernel without a GPU).
"""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
from pages import lab_sources  # noqa: E402
import make_student  # noqa: E402
from lab_runs import lab_run  # noqa: E402

LABS = lab_sources()  # labs/ and pending/labs/ (tests/pages.py)
NOT_DONE = re.compile(r"^Exercise (\S+( to \S+)?) is not done yet: [^\n]+\.$")


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_student_edition_stops_at_each_exercise_with_one_sentence(lab, tmp_path):
    # the edition as handed out is what was executed
    assert make_student.main([str(lab), "-o", str(tmp_path / "labs")]) == 0
    handed_out = nbformat.read(tmp_path / "labs" / f"{lab.stem}.ipynb", as_version=4)
    run = lab_run(lab)
    assert run.student_error is None, f"{lab.name}: the student edition hung: {run.student_error}"
    assert [c.source for c in handed_out.cells if c.cell_type == "code"] == [c.source for c in run.student]
    print(f"{lab.name}: the student edition's first {run.student_shared} code cells are the lab's own")
    stopped = set()
    for cell in run.student:
        if cell.ename is None:
            continue
        assert cell.ename == "ExerciseNotDone", (
            f"{lab.name}: a cell ended in {cell.ename}: {cell.evalue}\n--- cell:\n{cell.source[:600]}")
        assert NOT_DONE.match(cell.evalue), f"{lab.name}: not one clear sentence: {cell.evalue!r}"
        assert cell.traceback_lines == 1, f"{lab.name}: the student sees a traceback, not one line"
        if cell.grade.get("grade"):
            stopped.add(cell.grade["grade_id"])
    checks = {c.grade["grade_id"] for c in run.student if c.grade.get("grade")}
    assert checks - stopped == set(), f"{lab.name}: these checks pass with no answer: {checks - stopped}"
