"""scripts/grade.py on a folder of good, partial, broken and hostile submissions of a tiny lab.

Each row must be exactly what that submission deserves, and no submission may change another's
row: the deleter (graded first) removes the submissions folder and the lab and forges the
results file; the fork bomb starts busy processes; the memory bomb allocates without bound; the
check editor replaces its checks. The whole batch runs in well under a minute on 2 cores.
"""

import csv
import json
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import grade  # noqa: E402
import make_student  # noqa: E402

TINY = ROOT / "tests" / "data" / "lab_tiny.md"
GOOD = {"ex1-solution": "def double(x):\n    return x + x", "ex2-solution": "speedup = 3.0"}


def submission(solutions: dict, checks: dict | None = None, extra: str | None = None) -> str:
    """The student edition of the tiny lab with some solution (and check) cells replaced."""
    nb = make_student.student_notebook(TINY)
    cells = []
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            cell.source = solutions[gid]
        if checks and gid in checks:
            cell.source = checks[gid]
        cells.append(cell)
        if extra and gid == "ex1-solution":
            cells.append(nbformat.v4.new_code_cell(extra))
    nb.cells = cells
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    folder = base / "submissions"
    folder.mkdir()
    lab = base / "lab_tiny.md"
    shutil.copy2(TINY, lab)
    out = base / "results.csv"
    vandal = (f"import shutil\nshutil.rmtree({str(folder)!r}, ignore_errors=True)\n"
              f"open({str(lab)!r}, 'w').write('gone')\nopen({str(out)!r}, 'w').write('forged')")
    subs = {
        "a_deletes_files.ipynb": submission(GOOD, extra=vandal),
        "b_full.ipynb": submission(GOOD),
        "c_partial.ipynb": submission({"ex1-solution": GOOD["ex1-solution"]}),
        "d_raises.ipynb": submission({"ex1-solution": "raise RuntimeError('boom')",
                                      "ex2-solution": GOOD["ex2-solution"]}),
        "e_loops_forever.ipynb": submission({"ex1-solution": "while True:\n    pass"}),
        "f_memory_bomb.ipynb": submission({"ex1-solution": "hog = []\nwhile True:\n"
                                                           "    hog.append(bytearray(2**26))"}),
        "g_edits_checks.ipynb": submission({"ex1-solution": "def double(x):\n    return 3 * x"},
                                           checks={"ex1-check": "print('✓ all good')", "ex2-check": "pass"}),
        "h_fork_bomb.ipynb": submission({"ex1-solution": GOOD["ex1-solution"],
                                         "ex2-solution": "import os, time\nfor _ in range(24):\n"
                                                         "    if os.fork() == 0:\n        while True:\n"
                                                         "            pass\ntime.sleep(60)"}),
        "i_not_a_notebook.ipynb": "this is not a notebook\n",
    }
    for name, text in subs.items():
        (folder / name).write_text(text)
    t0 = time.perf_counter()
    # 15 s per notebook: kernel start and imports take several seconds on a loaded 2-core CI
    # machine, and with 8 s the memory bomb once ran out of time before it reached its limit
    # (CI, 2026-12-01: "timeout" instead of "memory limit")
    rc = grade.main([str(folder), "--out", str(out), "--lab", str(lab), "--timeout", "15",
                     "--memory-gb", "2", "--max-procs", "12", "--no-progress", "--threads", "1"])
    seconds = time.perf_counter() - t0
    assert rc == 0
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    return rows, seconds


EXPECTED = {  # submission: (status, points, ex1 mark starts with, ex2 mark starts with)
    "a_deletes_files.ipynb": ("graded", 3, "pass", "pass"),
    "b_full.ipynb": ("graded", 3, "pass", "pass"),
    "c_partial.ipynb": ("graded", 2, "pass", "fail: ExerciseNotDone: Exercise 2 is not done yet"),
    "d_raises.ipynb": ("graded", 1, "fail: NameError", "pass"),
    "e_loops_forever.ipynb": ("timeout", 0, "not run", "not run"),
    # after its MemoryError the kernel recovers or hangs (then the time limit ends it): either way
    "f_memory_bomb.ipynb": ("memory limit", 0, "", ""),
    "g_edits_checks.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)",
                             "fail: ExerciseNotDone: Exercise 2 is not done yet"),
    "h_fork_bomb.ipynb": ("killed", 2, "pass", "not run"),
    "i_not_a_notebook.ipynb": ("not a notebook", 0, "not run", "not run"),
}


def test_grader_table_is_exactly_right(graded):
    rows, seconds = graded
    print(f"graded {len(rows)} submissions in {seconds:.1f} s")
    assert set(rows) == set(EXPECTED)
    for name, (status, points, ex1, ex2) in EXPECTED.items():
        r = rows[name]
        got = (r["status"], float(r["points"]), r["ex1"], r["ex2"])
        assert r["status"] == status, (name, got, r["note"])
        assert float(r["points"]) == points, (name, got)
        assert r["ex1"].startswith(ex1) and r["ex2"].startswith(ex2), (name, got)
        assert float(r["max_points"]) == 3
    assert "pass" not in (rows["f_memory_bomb.ipynb"]["ex1"], rows["f_memory_bomb.ipynb"]["ex2"])
    assert "12 processes" in rows["h_fork_bomb.ipynb"]["note"]
    assert json.loads(rows["b_full.ipynb"]["measured"]) == {"ex1: double(21)": 42.0, "ex1: double(0.25)": 0.5,
                                                          "ex2: speed-up": 3.0}


def test_no_process_of_a_submission_survives(graded):
    token_procs = [p for p in grade._processes() if grade._has_token(p, b"PERFLAB_GRADE_TOKEN=")]
    assert token_procs == []


def test_graded_notebook_takes_only_solutions_from_the_submission():
    instructor = grade.instructor_notebook(TINY)
    sub = nbformat.reads(submission({"ex1-solution": "def double(x):\n    return 3 * x"},
                                    checks={"ex1-check": "print('✓')"}, extra="helper = 1"), as_version=4)
    nb = grade.graded_notebook(instructor, sub)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any("return 3 * x" in s for s in sources)
    assert any("double(0.25)" in s for s in sources)        # the hidden test is back
    assert not any(s == "print('✓')" for s in sources)
    assert sources.index("helper = 1") == 2, sources        # right after the solution it followed
