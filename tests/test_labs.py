"""Labs: nbgrader structure, and student versions that really have the solutions removed."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pages import lab_sources  # noqa: E402
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

LABS = lab_sources()  # labs/ and pending/labs/ (tests/pages.py)


def test_strip_code_replaces_solutions_and_drops_hidden_tests():
    src = ("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
           "check(f())\n### BEGIN HIDDEN TESTS\nsecret()\n### END HIDDEN TESTS\n")
    out = make_student.strip_code(src, "3")
    assert "return 1" not in out and "secret" not in out
    assert "    # YOUR CODE HERE\n    perflab.labs.exercises.not_done(3)" in out
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
        assert "check" in cell.source, "a graded cell must call a perflab.labs.exercises check"


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
            assert f"perflab.labs.exercises.not_done({number})" in cell.source
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


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_book_collapses_solutions_and_numbers_exercises(lab):
    nb = jupytext.read(lab)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            assert "hide-input" in cell.metadata.get("tags", []), (
                f"{lab.name}: solution cell {cell.metadata['nbgrader']['grade_id']} needs tags: [hide-input]")
    headings = [int(m) for c in nb.cells if c.cell_type == "markdown"
                for m in __import__("re").findall(r"^##+ Exercises? (\d+)", c.source, flags=__import__("re").M)]
    assert headings and headings[0] == 1, f"{lab.name}: exercises are not numbered from 1"
    assert headings == sorted(headings), f"{lab.name}: exercise numbers out of order: {headings}"
    ids = {int(make_student.exercise_number(c.metadata["nbgrader"]["grade_id"])) for c in nb.cells
           if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    assert max(ids) >= max(headings), f"{lab.name}: a numbered exercise has no check"


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_student_edition_has_no_book_only_tags(lab, tmp_path):
    nb = make_student.student_notebook(lab)
    assert not any("hide-input" in c.get("metadata", {}).get("tags", []) for c in nb.cells)


def test_lab_needs_reads_the_records(tmp_path):
    from perflab.labs.exercises import lab_needs

    md = tmp_path / "09_x.md"
    md.write_text(LABS[0].read_text().replace("import torch", "import torch  # requires_gpu(2)"))
    ipynb = {"cells": [], "metadata": {"reference_run": {"devices": ["NVIDIA H200"] * 2, "duration_s": 90,
                                                         "gpu_memory_peak_bytes": 3 * 2**30}},
             "nbformat": 4, "nbformat_minor": 5}
    md.with_suffix(".ipynb").write_text(__import__("json").dumps(ipynb))
    n = lab_needs(md, cpu_runs={"09_x": {"duration_s": 120, "cpu": "x", "cores": 2, "source_sha256": "old"}})
    assert n["gpus"] == 2 and n["reference_minutes"] == 1.5 and n["gpu_memory_gib"] == 3
    assert n["reference_devices"] == "2x NVIDIA H200" and n["cpu_minutes"] == 2 and n["cpu_current"] is False
    assert lab_needs(LABS[0], cpu_runs={})["cpu_minutes"] is None


# labs whose student edition is checked for cells that would show a check's bare return value;
# labs 3, 4, 5 and 8 still have such cells (a trailing ';' fixes each)
QUIET = tuple(p.stem for p in LABS)        # every lab
_SHOWS_NOTHING = ("print", "not_done", "finish", "display", "glue", "plot_ratios")


@pytest.mark.parametrize("lab", [p for p in LABS if p.stem in QUIET],
                         ids=[p.stem for p in LABS if p.stem in QUIET])
def test_student_cells_do_not_end_in_a_checks_return_value(lab):
    """A check returns True; a cell whose last line calls one shows a bare ``True`` under its
    ticks (in the student edition the hidden tests that followed it are gone). Such a line ends
    in ';', which tells IPython to show nothing."""
    for cell in make_student.student_notebook(lab).cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        code = "\n".join(line for line in cell.source.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        last_stmt = ast.parse(code).body[-1]
        last_line = code.rstrip().splitlines()[-1].split("#")[0].rstrip()
        if isinstance(last_stmt, ast.Expr) and isinstance(last_stmt.value, ast.Call):
            func = last_stmt.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            assert name in _SHOWS_NOTHING or last_line.endswith(";"), (
                f"{lab.name}: a cell ends in {name}(...), whose value the notebook shows:\n"
                f"{cell.source[-200:]}")
