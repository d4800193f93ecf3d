"""Labs: nbgrader structure, and student versions that really have the solutions removed."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

LABS = sorted((ROOT / "labs").glob("*.md"))


def test_strip_code_replaces_solutions_and_drops_hidden_tests():
    src = ("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
           "check(f())\n### BEGIN HIDDEN TESTS\nsecret()\n### END HIDDEN TESTS\n")
    out = make_student.strip_code(src, "3")
    assert "return 1" not in out and "secret" not in out
    assert "    # YOUR CODE HERE\n    perflab.exercises.not_done(3)" in out
    assert "check(f())" in out


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_lab_has_at_least_four_checked_exercises(lab):
    nb = jupytext.read(lab)
    graded = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    solutions = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert len(graded) >= 4, f"{lab.name}: {len(graded)} graded check cells"
    assert len(solutions) >= 4, f"{lab.name}: {len(solutions)} solution cells"
    for cell in solutions:
        assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
    for cell in graded:
        assert "check" in cell.source, "a graded cell must call a perflab.exercises check"


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_student_version_has_no_solutions(lab, tmp_path):
    assert make_student.main([str(lab), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / (lab.stem + ".ipynb"))
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            number = make_student.exercise_number(grade_id)
            assert number.isdigit(), f"{lab.name}: grade_id {grade_id!r} names no exercise (exN-...)"
            assert f"perflab.exercises.not_done({number})" in cell.source
        if cell.cell_type == "code":
            # the student version must still be valid Python (IPython magics aside)
            code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            ast.parse(code)


def test_make_student_rejects_missing_and_non_notebook_paths(tmp_path, capsys):
    assert make_student.main([str(tmp_path / "nope.md")]) == 2
    plain = tmp_path / "plain.md"
    plain.write_text("# prose\n")
    assert make_student.main([str(plain)]) == 2


def test_student_folder_holds_the_reference_runs_the_labs_read(tmp_path):
    out = tmp_path / "student" / "labs"
    assert make_student.main([str(LABS[0]), "-o", str(out)]) == 0
    for ref in (ROOT / "book").glob("*.ipynb"):
        assert (tmp_path / "student" / "book" / ref.name).exists()
    # the labs look for their chapter one folder up, as they do in the repository
    nb = jupytext.read(LABS[0])
    assert any('Path("../book/' in c.source for c in nb.cells if c.cell_type == "code")
