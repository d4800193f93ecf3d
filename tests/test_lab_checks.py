"""Every lab's checks are proven: the reference solution passes them, each wrong solution fails.

Each lab (``labs/*.md``, so labs added later are covered) is executed once, cell by cell, with
its hidden tests, in a Jupyter kernel started in ``labs/`` (as a student's notebook server, nbval
or ``scripts/execute.py`` would run it): every cell must run and every check must pass. This is
also CI's execution of the lab on CPU (pyproject.toml's ``testpaths`` leave ``labs/*.ipynb`` to
this test instead of nbval: ``tests/test_reference_runs.py`` keeps their code identical to the
``.md``). The kernel's namespace is kept as it was before each solution cell; every wrong
solution of the lab (``tests/lab_wrong_solutions.py``) is then run in the same kernel from
there, followed by the cells up to its exercise's last check cell, one of which must raise
``ExerciseFailed`` saying what is wrong. The reference run and all of a lab's wrong solutions
happen in the first test that asks for the lab, in one kernel that is then shut down (one lab's
kernel alive at a time); the tests read the recorded outcomes. Speed checks are also replayed on
modelled machines in ``tests/test_exercises.py`` (a right answer must not fail on another
host/GPU balance).
"""

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import pytest
from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import make_student  # noqa: E402
from lab_wrong_solutions import WRONG  # noqa: E402

from perflab.exercises import ExerciseFailed  # noqa: E402

LABS = sorted((ROOT / "labs").glob("*.md"))
CELL_TIMEOUT_S = 300       # a lab cell takes well under a minute on a loaded 2-core CPU
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_REPLY = "no reply within"


def _subclass_names(cls) -> set[str]:
    return {cls.__name__}.union(*(_subclass_names(c) for c in cls.__subclasses__()))


# a kernel reports an exception by its class name: ExerciseFailed and its subclasses
# (ExerciseNotDone) are a check's verdict; anything else is a broken cell
VERDICTS = _subclass_names(ExerciseFailed)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


class CellError(Exception):
    """A cell raised something other than ExerciseFailed, or the kernel did not answer."""


class Kernel:
    """A python3 Jupyter kernel in ``cwd`` that runs cells and keeps named namespace snapshots."""

    def __init__(self, cwd: Path):
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), startup_timeout=120)
        self.run("get_ipython().perflab_snapshots = {}", silent=True)

    def run(self, code: str, silent: bool = False) -> str | None:
        """Execute ``code`` as a cell; None, or the message of the ExerciseFailed it raised.

        Raises:
            CellError: another exception (with the cell's traceback), or no reply within
                ``CELL_TIMEOUT_S``.
        """
        try:
            reply = self.kc.execute_interactive(code, silent=silent, store_history=not silent,
                                                allow_stdin=False, timeout=CELL_TIMEOUT_S,
                                                output_hook=lambda msg: None)
        except TimeoutError:
            raise CellError(f"{NO_REPLY} {CELL_TIMEOUT_S} s") from None
        content = reply["content"]
        if content["status"] == "ok":
            return None
        if content.get("ename") in VERDICTS:
            return content["evalue"]
        trace = ANSI.sub("", "\n".join(content.get("traceback", [])))
        raise CellError(f"{content.get('ename')}: {content.get('evalue')}\n{trace[-3000:]}")

    def snapshot(self, name: str) -> None:
        """Keep (a shallow copy of) the namespace under ``name``."""
        self.run(f"(lambda ip: ip.perflab_snapshots.__setitem__({name!r}, dict(ip.user_ns)))"
                 "(get_ipython())", silent=True)

    def restore(self, name: str) -> None:
        """Make the namespace what it was at ``snapshot(name)`` (the snapshot itself is kept)."""
        self.run("(lambda ip: (ip.user_ns.clear(), ip.user_ns.update(ip.perflab_snapshots["
                 f"{name!r}])))(get_ipython())", silent=True)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@dataclass
class LabRun:
    cells: list
    results: dict                      # check grade_id (or "cell i") -> None or the failure
    broken: str | None = None          # the reference run stopped: cell and error
    wrong: dict = field(default_factory=dict)   # k -> {grade_id: None or failure} or CellError


_RUNS: dict[Path, LabRun] = {}


def _index(cells) -> dict[str, int]:
    """{grade_id: index of its code cell}"""
    return {_meta(c)["grade_id"]: i for i, c in enumerate(cells) if _meta(c).get("grade_id")}


def _last_check(cells, exercise: str) -> int:
    return max((i for i, c in enumerate(cells)
                if _meta(c).get("grade") and make_student.exercise_number(_meta(c)["grade_id"]) == exercise),
               default=len(cells) - 1)


def _wrong_outcome(kernel: Kernel, cells, start: int, source: str, stop: int) -> dict:
    """Run ``source`` in place of cell ``start``, then the cells up to ``stop``; the checks' outcomes.

    A non-check cell that raises ExerciseFailed ends the run there (what follows needs it)."""
    outcome = {}
    for i in range(start, stop + 1):
        g = _meta(cells[i])
        err = kernel.run(source if i == start else cells[i].source)
        if g.get("grade"):
            outcome[g["grade_id"]] = err
        elif err is not None:
            outcome[g.get("grade_id", f"cell {i}")] = err
            break
    return outcome


def lab_run(lab: Path) -> LabRun:
    """The lab's reference run and every wrong solution's outcome (executed on first use)."""
    if lab in _RUNS:
        return _RUNS[lab]
    cells = [c for c in jupytext.read(lab).cells if c.cell_type == "code"]
    run = LabRun(cells, {})
    kernel = Kernel(lab.parent)        # the closing cells read ../book/NN_*.ipynb
    try:
        for i, cell in enumerate(cells):
            g = _meta(cell)
            if g.get("solution"):
                kernel.snapshot(g["grade_id"])
            try:
                err = kernel.run(cell.source)
            except CellError as e:
                run.broken = f"cell {i} ({g.get('grade_id', 'not graded')}): {e}"
                break
            if g.get("grade") or err is not None:
                run.results[g.get("grade_id", f"cell {i}")] = err
        if run.broken is None and not any(run.results.values()):
            index = _index(cells)
            for k, (sol_id, old, new, _) in enumerate(WRONG.get(lab.stem, [])):
                start = index.get(sol_id)
                if start is None or old not in cells[start].source:
                    continue                   # the test reports it
                try:
                    kernel.restore(sol_id)
                    run.wrong[k] = _wrong_outcome(kernel, cells, start, cells[start].source.replace(old, new),
                                                  _last_check(cells, make_student.exercise_number(sol_id)))
                except CellError as e:
                    run.wrong[k] = e
                    if str(e).startswith(NO_REPLY):    # the kernel is still busy: no later case can run
                        run.wrong.update({j: CellError(f"not run: case {k} left the kernel busy")
                                          for j in range(k + 1, len(WRONG[lab.stem]))})
                        break
    finally:
        kernel.close()
    _RUNS[lab] = run
    return run


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_reference_solution_passes_every_check(lab):
    run = lab_run(lab)
    assert run.broken is None, f"{lab.name}: the reference run stopped at {run.broken}"
    failed = {gid: err for gid, err in run.results.items() if err is not None}
    assert not failed, f"{lab.name}: the reference solution fails {failed}"
    checks = {_meta(c)["grade_id"] for c in run.cells if _meta(c).get("grade")}
    assert checks <= set(run.results)


CASES = [(lab, k) for lab in LABS for k in range(len(WRONG.get(lab.stem, [])))]


@pytest.mark.parametrize("lab, k", CASES, ids=[f"{lab.stem}-{WRONG[lab.stem][k][0]}-{k}" for lab, k in CASES])
def test_wrong_solution_fails_its_check(lab, k):
    sol_id, old, new, pattern = WRONG[lab.stem][k]
    run = lab_run(lab)
    if run.broken is not None or any(run.results.values()):
        pytest.skip("the reference run failed (see test_reference_solution_passes_every_check)")
    start = _index(run.cells).get(sol_id)
    assert start is not None, f"{sol_id} is not a grade_id of {lab.name}"
    assert old in run.cells[start].source, f"{sol_id}: {old!r} is not in the reference solution any more"
    outcome = run.wrong[k]
    if isinstance(outcome, CellError):
        pytest.fail(f"{lab.name}: the wrong solution ({new[:60]!r}) broke a cell: {outcome}")
    errors = [e for e in outcome.values() if e is not None]
    assert errors, f"{lab.name}: the wrong solution ({new[:60]!r}) passed every check: {list(outcome)}"
    assert any(re.search(pattern, e) for e in errors), f"{lab.name}: failed, but not as expected: {errors}"


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_every_exercise_has_a_wrong_solution(lab):
    exercises = {make_student.exercise_number(_meta(c)["grade_id"])
                 for c in jupytext.read(lab).cells if _meta(c).get("grade")}
    covered = {make_student.exercise_number(entry[0]) for entry in WRONG.get(lab.stem, [])}
    assert lab.stem in WRONG, f"{lab.name}: no wrong solutions in tests/lab_wrong_solutions.py"
    assert exercises <= covered, f"{lab.name}: exercises without a wrong solution: {sorted(exercises - covered)}"
