"""Every lab's checks are proven: the reference solution passes them, each wrong solution fails.

Each lab (``labs/*.md``, so labs added later are covered) is executed once, cell by cell, with
its hidden tests, in a Jupyter kernel started in ``labs/`` (``tests/lab_runs.py``): every cell
must run and every check must pass, its hidden tests also when the grader runs them in its own
process. This is also CI's execution of the lab on CPU
(pyproject.toml's ``testpaths`` leave ``labs/*.ipynb`` to this test instead of nbval;
``tests/test_reference_runs.py`` keeps their code identical to the ``.md``). The kernel's
namespace is kept as it was before each solution cell; every wrong solution of the lab
(``tests/lab_wrong_solutions.py``) is then run in the same kernel from there, followed by the
cells up to its exercise's last check cell (as the grader runs them: hidden tests in this
process), one of which must fail saying what is wrong. Speed checks are also replayed on modelled machines in
``tests/test_exercises.py`` (a right answer must not fail on another host/GPU balance).
"""

import importlib.util
import re
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
from pages import lab_sources  # noqa: E402
import make_student  # noqa: E402
from lab_runs import CellError, grade_index, lab_run, meta  # noqa: E402
from lab_wrong_solutions import WRONG  # noqa: E402

LABS = lab_sources()  # labs/ and pending/labs/ (tests/pages.py)


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_reference_solution_passes_every_check(lab):
    run = lab_run(lab)
    assert run.broken is None, f"{lab.name}: the reference run stopped at {run.broken}"
    failed = {gid: err for gid, err in run.results.items() if err is not None}
    assert not failed, f"{lab.name}: the reference solution fails {failed}"
    checks = {meta(c)["grade_id"] for c in run.cells if meta(c).get("grade")}
    assert checks <= set(run.results)


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_hidden_tests_pass_the_reference_in_the_graders_process(lab):
    """Under the grader a lab's hidden tests run outside the kernel, reaching the notebook's
    names as plain data and its functions through the kernel: the reference passes them there
    too (a hidden test that changes the notebook's data, or differentiates through a student's
    Function outside ``perflab.labs.exercises.in_kernel``, fails here)."""
    run = lab_run(lab)
    if run.broken is not None:
        pytest.skip("the reference run failed (see test_reference_solution_passes_every_check)")
    failed = {gid: err for gid, err in run.remote.items() if err is not None}
    assert not failed, f"{lab.name}: the reference fails its hidden tests in the grader's process: {failed}"


def _solution_ids(lab):
    return {meta(c)["grade_id"] for c in jupytext.read(lab).cells if meta(c).get("solution")}


# a lab and its pending revision share WRONG[stem]: each gets the entries that name its solutions
CASES = [(lab, k) for lab in LABS for k, entry in enumerate(WRONG.get(lab.stem, []))
         if entry[0] in _solution_ids(lab)]


def _has_cuda() -> bool:
    import torch  # only for the wrong solutions that are wrong on a GPU alone
    return torch.cuda.is_available()


def _has_bf16() -> bool:
    """A GPU, or a CPU whose instructions multiply bf16 (AVX512-BF16, AMX)."""
    import torch
    return torch.cuda.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported()


_NEEDS = {"cuda": _has_cuda, "bf16": _has_bf16}

#: what a wrong solution raises (as a RuntimeError) when its own measurement shows it is a
#: right answer on this machine (a choice that ties the fastest within the check's noise)
NOT_WRONG_HERE = "not wrong here:"


@pytest.mark.parametrize("lab, k", CASES, ids=[f"{lab.stem}-{WRONG[lab.stem][k][0]}-{k}" for lab, k in CASES])
def test_wrong_solution_fails_its_check(lab, k):
    sol_id, old, new, pattern, *needs = WRONG[lab.stem][k]
    missing = [m for m in needs if (not _NEEDS[m]() if m in _NEEDS
                                    else importlib.util.find_spec(m) is None)]
    if missing:
        pytest.skip(f"this wrong solution is wrong only with {', '.join(missing)}, not here")
    run = lab_run(lab)
    if run.broken is not None or any(run.results.values()):
        pytest.skip("the reference run failed (see test_reference_solution_passes_every_check)")
    start = grade_index(run.cells).get(sol_id)
    assert start is not None, f"{sol_id} is not a grade_id of {lab.name}"
    assert old in run.cells[start].source, f"{sol_id}: {old!r} is not in the reference solution any more"
    outcome = run.wrong[k]
    if isinstance(outcome, CellError) and NOT_WRONG_HERE in str(outcome).split("\n")[0]:
        # the wrong solution measured that, on this machine, it is a right answer
        pytest.skip(str(outcome).split("\n")[0])
    if isinstance(outcome, CellError):
        pytest.fail(f"{lab.name}: the wrong solution ({new[:60]!r}) broke a cell: {outcome}")
    errors = [e for e in outcome.values() if e is not None]
    assert errors, f"{lab.name}: the wrong solution ({new[:60]!r}) passed every check: {list(outcome)}"
    assert any(re.search(pattern, e) for e in errors), f"{lab.name}: failed, but not as expected: {errors}"


def test_every_wrong_solution_names_a_solution_cell_of_its_lab():
    """Entries are filtered per lab (above), so one that names no lab's solution cell would go untested."""
    for stem, entries in WRONG.items():
        ids = set().union(*(_solution_ids(lab) for lab in LABS if lab.stem == stem))
        assert ids, f"WRONG[{stem!r}]: no lab of that stem among the labs the tests run"
        unknown = sorted({entry[0] for entry in entries} - ids)
        assert not unknown, f"WRONG[{stem!r}] names solution cells no lab of that stem has: {unknown}"


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_every_exercise_has_a_wrong_solution(lab):
    exercises = {make_student.exercise_number(meta(c)["grade_id"])
                 for c in jupytext.read(lab).cells if meta(c).get("grade")}
    covered = {make_student.exercise_number(entry[0]) for entry in WRONG.get(lab.stem, [])}
    assert lab.stem in WRONG, f"{lab.name}: no wrong solutions in tests/lab_wrong_solutions.py"
    assert exercises <= covered, f"{lab.name}: exercises without a wrong solution: {sorted(exercises - covered)}"


def test_wrong_solutions_share_only_whole_leading_statements():
    """tests/lab_runs.py runs a prefix once for the cases of a SHARED_PREFIX cell: the prefix is
    whole top-level statements that come before the first changed line, in both cells."""
    from lab_runs import shared_prefix
    ref = "a = 1\nfor i in range(3):\n    a += i\nb = a\nc = b\n"
    assert shared_prefix(ref, ref.replace("c = b", "c = 0")) == 4
    assert shared_prefix(ref, ref.replace("    a += i", "    a -= i")) == 1   # not inside the loop
    assert shared_prefix(ref, ref.replace("a = 1", "a = 2")) == 0
    assert shared_prefix("%time a = 1\nb = 2\n", "%time a = 1\nb = 3\n") == 0  # not Python: none
    assert shared_prefix("@d\ndef f():\n    pass\nx = 1\n", "@d\ndef f():\n    pass\nx = 2\n") == 3


def test_shared_prefixes_group_cases_that_cut_at_the_same_line():
    """Lab 9's exercise 4: the three wrong choices share the trained and timed modes; the case
    that times them another way differs before and runs its cell whole."""
    from lab_runs import _shared_cuts, grade_index
    lab = next(p for p in LABS if p.stem == "09_advanced")
    cells = [c for c in jupytext.read(lab).cells if c.cell_type == "code"]
    cuts = _shared_cuts(lab.stem, cells, grade_index(cells))
    ex4 = [k for k, entry in enumerate(WRONG[lab.stem]) if entry[0] == "ex4-solution"]
    assert len(set(cuts.values())) == 1 and set(cuts) < set(ex4) and len(cuts) == len(ex4) - 1
    source = cells[grade_index(cells)["ex4-solution"]].source.splitlines()
    assert "interleaved(" in "\n".join(source[:next(iter(cuts.values()))])


def test_paired_cases_run_one_of_each_exercise():
    """Lab 8's exercises 4 and 5: each wrong optimizer runs with one wrong sampler, in one
    launch (tests/lab_runs.py, PAIRED), and a case left over runs alone."""
    from lab_runs import _pairs
    from lab_wrong_solutions import PAIRED
    for lab in (p for p in LABS if p.stem in PAIRED):
        cells = [c for c in jupytext.read(lab).cells if c.cell_type == "code"]
        pairs = _pairs(lab.stem, cells, grade_index(cells))
        for first, second in PAIRED[lab.stem]:
            of = {s: [k for k, e in enumerate(WRONG[lab.stem]) if e[0] == s] for s in (first, second)}
            assert of[first] and of[second], f"{lab.name}: no wrong solutions of {first} or {second}"
            for k, j in pairs.items():
                assert pairs[j] == k and {WRONG[lab.stem][k][0], WRONG[lab.stem][j][0]} == {first, second}
            assert len(pairs) == 2 * min(len(of[first]), len(of[second]))
