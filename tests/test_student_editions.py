"""Every lab's student edition, executed on CPU as handed out: each exercise stops with one sentence.

The student edition replaces each solution with ``perflab.exercises.not_done(N)``. Executed cell
by cell with nothing filled in (as *Run Selected Cell and All Below* from each exercise would),
every cell either runs or ends in ``ExerciseNotDone`` with the message
"Exercise N is not done yet: ...": never a ``NameError``, ``TypeError`` or bare
``NotImplementedError``. Every exercise's check cell is among those that stop, so nothing
passes without an answer. Labs added later are covered by the glob.
"""

import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

LABS = sorted((ROOT / "labs").glob("*.md"))
NOT_DONE = re.compile(r"^Exercise (\S+( to \S+)?) is not done yet: [^\n]+\.$")


def execute_student_edition(lab: Path, folder: Path) -> tuple[nbformat.NotebookNode, float]:
    """The lab's student edition executed cell by cell on CPU (errors kept in the outputs)."""
    assert make_student.main([str(lab), "-o", str(folder / "labs")]) == 0
    path = folder / "labs" / f"{lab.stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=300, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, time.perf_counter() - t0


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_student_edition_stops_at_each_exercise_with_one_sentence(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")      # as a student without a GPU
    nb, seconds = execute_student_edition(lab, tmp_path)
    print(f"{lab.name}: student edition executed in {seconds:.1f} s")
    stopped = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if out.output_type != "error":
                continue
            assert out.ename == "ExerciseNotDone", (
                f"{lab.name}: a cell ended in {out.ename}: {out.evalue}\n--- cell:\n{cell.source[:600]}")
            assert NOT_DONE.match(out.evalue), f"{lab.name}: not one clear sentence: {out.evalue!r}"
            assert len(out.traceback) == 1, f"{lab.name}: the student sees a traceback, not one line"
            grade = cell.get("metadata", {}).get("nbgrader", {})
            if grade.get("grade"):
                stopped.add(grade["grade_id"])
    checks = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
              if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    assert checks - stopped == set(), f"{lab.name}: these checks pass with no answer: {checks - stopped}"
