"""Test helper: each lab executed once in a Jupyter kernel, for tests/test_lab_checks.py and
tests/test_student_editions.py (one home for the kernel runs; each lab runs once per session).

:func:`lab_run` starts a python3 kernel in ``labs/`` (as nbval, a student's notebook server or
``scripts/execute.py`` would), and in it

1. executes the lab's ``.md`` cell by cell with its hidden tests (the reference run, as a
   notebook or nbgrader runs it), keeping a shallow copy of the namespace before each solution
   cell, and before the first cell that the student edition changes; after each check cell
   with hidden tests, runs them again as the grader does, in this process against the kernel
   (:class:`grader.remote.HiddenTests`), and records that outcome too (``remote``);
2. replays each wrong solution of ``tests/lab_wrong_solutions.py`` from the namespace before its
   solution cell, as the grader runs it: the wrong cell, then the cells up to its exercise's
   last check cell, each check cell's visible code in the kernel and its hidden tests here
   (the cases of a cell listed in ``SHARED_PREFIX`` that share its first statements with the
   reference start from the namespace the reference run kept after those statements: step 1
   runs such a cell as the shared statements, then the rest; each case then runs the rest of its
   own cell from there; the cases of two
   exercises listed in ``PAIRED`` run two at a time, one of each, in one replay whose launch runs
   both wrong functions, each case judged by its own exercise's checks);
3. runs the student edition (``scripts/make_student.py``) from the namespace before the first
   cell it changes (the cells before it are the same code, already run by step 1), every cell
   whatever the one before raised, as *Run All* with errors allowed does. Where that shared start
   cannot be used (the reference run stopped there, a cell left the kernel busy, or a GPU is
   visible: the student edition is checked as a student without one), the student edition runs
   whole in a fresh kernel with ``CUDA_VISIBLE_DEVICES`` empty.

The kernel is then shut down, and the tests read the recorded outcomes. Asking for one lab
(``pytest -k 05_``) runs all three steps for it.

In a whole session the labs run ahead of their tests, two at a time, each in a process of its own
(``python tests/lab_runs.py LAB OUT``: the same :func:`lab_run`, its :class:`LabRun` pickled to
``OUT``; tests/background.py); labs 5, 8 and 10, which time the CPU against itself, run alone.
"""

from __future__ import annotations

import ast
import functools
import os
import pickle
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import torch
from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # as tests/conftest.py (this file also runs as a script)
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402
import course_download  # noqa: E402
import make_student  # noqa: E402
from lab_wrong_solutions import PAIRED, SHARED_PREFIX, WRONG  # noqa: E402

from perflab.record import runs  # noqa: E402
from perflab.labs.exercises import ExerciseFailed  # noqa: E402
from grader.notebooks import split_hidden  # noqa: E402
from grader.remote import HiddenTests  # noqa: E402

CELL_TIMEOUT_S = 600       # a guard against hangs, not a speed check: lab 9's ex 4 cell
                           # (every precision mode trained, then timed) passed 300 s on a 2-core
                           # host loaded by other work (7 December)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_REPLY = "no reply within"


def _subclass_names(cls) -> set[str]:
    return {cls.__name__}.union(*(_subclass_names(c) for c in cls.__subclasses__()))


# a kernel reports an exception by its class name: ExerciseFailed and its subclasses
# (ExerciseNotDone) are a check's verdict; anything else is a broken cell
VERDICTS = _subclass_names(ExerciseFailed)


def meta(cell) -> dict:
    """A cell's nbgrader metadata ({} if none)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


class CellError(Exception):
    """A cell raised something other than ExerciseFailed, or the kernel did not answer."""


class Kernel:
    """A python3 Jupyter kernel in ``cwd`` that runs cells and keeps named namespace snapshots."""

    def __init__(self, cwd: Path, env: dict | None = None):
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), startup_timeout=120,
                                            **({"env": env} if env is not None else {}))
        self.run("get_ipython().perflab_snapshots = {}", silent=True)

    def execute(self, code: str, silent: bool = False) -> dict:
        """Execute ``code`` as a cell; the reply's content (``status``; ``ename``, ``evalue``,
        ``traceback`` on an error).

        Raises:
            CellError: no reply within ``CELL_TIMEOUT_S``.
        """
        try:
            reply = self.kc.execute_interactive(code, silent=silent, store_history=not silent,
                                                allow_stdin=False, timeout=CELL_TIMEOUT_S,
                                                output_hook=lambda msg: None)
        except TimeoutError:
            raise CellError(f"{NO_REPLY} {CELL_TIMEOUT_S} s") from None
        return reply["content"]

    def run(self, code: str, silent: bool = False) -> str | None:
        """Execute ``code`` as a cell; None, or the message of the ExerciseFailed it raised.

        Raises:
            CellError: another exception (with the cell's traceback), or no reply in time.
        """
        content = self.execute(code, silent)
        if content["status"] == "ok":
            return None
        if content.get("ename") in VERDICTS:
            return content["evalue"]
        trace = ANSI.sub("", "\n".join(content.get("traceback", [])))
        raise CellError(f"{content.get('ename')}: {content.get('evalue')}\n{trace[-3000:]}")

    def ask(self, expression: str, timeout: float):
        """The value of a user expression (as the grader's worker asks it: silent, no history),
        or None."""
        try:
            reply = self.kc.execute_interactive("", silent=True, store_history=False, allow_stdin=False,
                                                user_expressions={"p": expression}, timeout=timeout,
                                                output_hook=lambda msg: None)
        except TimeoutError:
            return None
        got = reply["content"].get("user_expressions", {}).get("p", {})
        if got.get("status") != "ok":
            return None
        try:
            return ast.literal_eval(got.get("data", {}).get("text/plain", ""))
        except (ValueError, SyntaxError):
            return None

    def hidden(self, blocks: list[str]) -> str | None:
        """Run a check cell's hidden tests as the grader does (in this process, the student's
        names and functions reached in the kernel); None, or the first failure."""
        tests = HiddenTests(self.ask, lambda: CELL_TIMEOUT_S)
        for block in blocks:
            error, _ = tests.run(block)
            if error:
                return error
        return None

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
class StudentCell:
    """One executed code cell of the student edition."""

    source: str
    grade: dict                         # its nbgrader metadata
    ename: str | None = None            # the error it ended in, if any
    evalue: str = ""
    traceback_lines: int = 0


@dataclass
class LabRun:
    cells: list                         # the lab's code cells
    results: dict                       # check grade_id (or "cell i") -> None or the failure
    broken: str | None = None           # the reference run stopped: cell and error
    wrong: dict = field(default_factory=dict)     # k -> {grade_id: None or failure} or CellError
    remote: dict = field(default_factory=dict)    # check grade_id -> its hidden tests run as the grader does
    student: list = field(default_factory=list)   # StudentCell per code cell of the student edition
    student_shared: int = 0             # leading cells the student edition took from the reference run
    student_error: str | None = None    # a student-edition cell left the kernel without a reply


_RUNS: dict[Path, LabRun] = {}


def grade_index(cells) -> dict[str, int]:
    """{grade_id: index of its code cell}"""
    return {meta(c)["grade_id"]: i for i, c in enumerate(cells) if meta(c).get("grade_id")}


def _last_check(cells, exercise: str) -> int:
    return max((i for i, c in enumerate(cells)
                if meta(c).get("grade") and make_student.exercise_number(meta(c)["grade_id"]) == exercise),
               default=len(cells) - 1)


def _wrong_outcome(kernel: Kernel, cells, start: int, source: str | dict, stop: int) -> dict:
    """Run ``source`` in place of cell ``start`` (or ``{cell index: source}``: each in place of
    its cell), then the cells up to ``stop``; the checks' outcomes.

    A non-check cell that raises ExerciseFailed ends the run there (what follows needs it)."""
    sources = source if isinstance(source, dict) else {start: source}
    outcome = {}
    for i in range(start, stop + 1):
        g = meta(cells[i])
        visible, blocks = split_hidden(cells[i].source) if g.get("grade") else (None, [])
        err = kernel.run(sources[i] if i in sources else visible if g.get("grade") else cells[i].source)
        if g.get("grade") and err is None and blocks:
            err = kernel.hidden(blocks)
        if g.get("grade"):
            outcome[g["grade_id"]] = err
        elif err is not None:
            outcome[g.get("grade_id", f"cell {i}")] = err
            break
    return outcome


def shared_prefix(reference: str, wrong: str) -> int:
    """How many leading lines of ``wrong`` are the reference cell's own first statements: the
    largest line number at which a top-level statement starts in both cells with every line
    before it the same (0: none, or a cell that does not parse as Python, such as a magic)."""
    try:
        trees = ast.parse(reference), ast.parse(wrong)
    except SyntaxError:
        return 0
    a, b = reference.splitlines(keepends=True), wrong.splitlines(keepends=True)
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1

    def starts(tree) -> set[int]:
        return {min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])]) - 1 for s in tree.body}

    return max((n for n in starts(trees[0]) & starts(trees[1]) if n <= same), default=0)


def _shared_cuts(stem: str, cells, index: dict) -> dict[int, int]:
    """{case k: cut} for the wrong solutions of ``SHARED_PREFIX[stem]``'s cells that share their
    first ``cut`` lines (whole statements, :func:`shared_prefix`) with the reference and with
    another case of the same cell: those lines run once, in the reference run (the cell as its
    first ``cut`` lines, the namespace kept, then the rest), and each case of the group then runs
    the rest of its cell from the namespace they left. The cases of one group differ only after
    the cut, so each runs the code it ran whole (lab 9's exercise 4: every precision mode trained
    and timed, then three wrong choices read the times, as the reference's own choice does)."""
    found: dict[int, tuple[str, int]] = {}
    for k, (sol_id, old, new, *_) in enumerate(WRONG.get(stem, [])):
        start = index.get(sol_id)
        if sol_id in SHARED_PREFIX.get(stem, ()) and start is not None and old in cells[start].source:
            cut = shared_prefix(cells[start].source, cells[start].source.replace(old, new))
            if cut:
                found[k] = (sol_id, cut)
    groups = Counter(found.values())
    return {k: cut for k, (sol_id, cut) in found.items() if groups[sol_id, cut] >= 2}


def _pairs(stem: str, cells, index: dict) -> dict[int, int]:
    """{case k: case j} for the wrong solutions of the two cells of each ``PAIRED[stem]`` pair:
    the i-th case of the first cell runs with the i-th case of the second (both ways in the
    map), the cases left over alone. Cases of a ``SHARED_PREFIX`` cell are not paired."""
    out: dict[int, int] = {}
    for first, second in PAIRED.get(stem, ()):
        assert first not in SHARED_PREFIX.get(stem, ()) and second not in SHARED_PREFIX.get(stem, ())
        of = {sol: [k for k, (s, old, *_) in enumerate(WRONG.get(stem, []))
                    if s == sol and index.get(s) is not None and old in cells[index[s]].source]
              for sol in (first, second)}
        for k, j in zip(of[first], of[second]):
            out[k], out[j] = j, k
    return out


def _paired_outcome(kernel: Kernel, cells, index: dict, stem: str, cases: tuple[int, int]) -> dict | None:
    """{case: its outcome} for two cases of a ``PAIRED`` pair run as one replay: from the
    namespace before the earlier solution cell, both wrong cells in place of their cells and the
    cells up to the later of the two exercises' last checks; each case gets its own exercise's
    check cells' outcomes. None if a cell broke or a non-check cell stopped the replay (the
    caller then runs each case alone, as unpaired)."""
    starts = {k: index[WRONG[stem][k][0]] for k in cases}
    sources = {starts[k]: cells[starts[k]].source.replace(*WRONG[stem][k][1:3]) for k in cases}
    exercises = {k: make_student.exercise_number(WRONG[stem][k][0]) for k in cases}
    stop = max(_last_check(cells, e) for e in exercises.values())
    start = min(starts.values())
    kernel.restore(WRONG[stem][min(cases, key=starts.get)][0])
    try:
        outcome = _wrong_outcome(kernel, cells, start, sources, stop)
    except CellError as e:
        if str(e).startswith(NO_REPLY):
            raise
        return None
    checks = {meta(cells[i])["grade_id"] for i in range(start, stop + 1) if meta(cells[i]).get("grade")}
    if not checks <= set(outcome):
        return None                    # a non-check cell stopped it: not every check ran
    return {k: {gid: err for gid, err in outcome.items()
                if make_student.exercise_number(gid) == exercises[k]} for k in cases}


def _student_cells(kernel: Kernel, cells) -> list[StudentCell]:
    out = []
    for cell in cells:
        content = kernel.execute(cell.source)
        done = StudentCell(cell.source, meta(cell))
        if content["status"] != "ok":
            done.ename, done.evalue = content.get("ename"), content.get("evalue", "")
            done.traceback_lines = len(content.get("traceback", []))
        out.append(done)
    return out


#: labs whose checks time the CPU against itself (lab 5's DataLoader workers against the cores,
#: lab 8's all-reduce against its alpha-beta prediction: 0.49x beside another lab and stress-ng
#: --cpu 2, lab 10's wrong rung that must come out below its target: at a load of 8 on two cores
#: it once did not): run with nothing beside them. Lab 4 no longer: its step and both ceilings
#: are timed in the same interleaved rounds (a load slows them alike), and its checks and wrong
#: solutions held beside stress-ng --cpu 2 (6 December); alone it left a core idle for ~50 s
ALONE = ("05_", "08_", "10_")
RUN_TIMEOUT_S = 3600


def _run_elsewhere(lab: Path, out: Path):
    if course_download.from_download(lab):   # lab 8: its copy in the installed course download
        course, python, env = course_download.installed(out.parent / "download")
        return background.run([str(python), str(Path(__file__).resolve()),
                               str(course / lab.resolve().relative_to(ROOT)), str(out)], RUN_TIMEOUT_S,
                              env=env, cwd=course)
    return background.run_script(Path(__file__).resolve(), [str(lab), str(out)], RUN_TIMEOUT_S)


def _download_run(lab: Path, out: Path) -> LabRun:
    """A lab of :data:`course_download.FROM_DOWNLOAD` run here and now by the installed
    download (no run ahead: ``pytest -k``), read back as this module's :class:`LabRun`."""
    proc = _run_elsewhere(lab, out)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{lab.name} from the course download: {(proc.stdout + proc.stderr)[-3000:]}")
    return pickle.loads(out.read_bytes())


def background_jobs(items, tmp_path_factory) -> list:
    """The lab runs the session's tests read, started ahead (tests/background.py)."""
    jobs, seen = [], set()
    for i, item in enumerate(items):
        lab = getattr(item, "callspec", None) and item.callspec.params.get("lab")
        if isinstance(lab, Path) and lab not in seen and getattr(item.module, "lab_run", None) is lab_run:
            seen.add(lab)
            out = tmp_path_factory.mktemp(f"lab-{lab.stem}") / "run.pickle"
            jobs.append((i, f"lab {lab}", functools.partial(_run_elsewhere, lab, out),
                         lab.stem.startswith(ALONE), background.after_shared_data(lab.stem)))
    return jobs


background.FIXTURE_PLANS.append(background_jobs)


def lab_run(lab: Path) -> LabRun:
    """The lab's reference run, every wrong solution's outcome and its student edition's cells
    (executed on first use, or read from the session's run ahead; see the module docstring)."""
    if lab in _RUNS:
        return _RUNS[lab]
    job = background.result(f"lab {lab}")
    if job is not None:
        out = Path(job.value.args[-1]) if job.error is None else None
        if out is not None and job.value.returncode == 0 and out.exists():
            _RUNS[lab] = pickle.loads(out.read_bytes())
            out.unlink()
            return _RUNS[lab]
        print(f"{lab.name}: the run ahead failed ({job.error or job.value.stderr[-3000:]}); running it here")
    if course_download.from_download(lab):
        import tempfile

        _RUNS[lab] = _download_run(lab, Path(tempfile.mkdtemp(prefix=f"lab-{lab.stem}-")) / "run.pickle")
    else:
        _RUNS[lab] = _lab_run(lab)
    return _RUNS[lab]


def _lab_run(lab: Path) -> LabRun:
    cells = [c for c in jupytext.read(lab).cells if c.cell_type == "code"]
    student = [c for c in make_student.student_notebook(lab).cells if c.cell_type == "code"]
    shared = 0
    while shared < min(len(cells), len(student)) and cells[shared].source == student[shared].source:
        shared += 1
    run = LabRun(cells, {})
    busy = False
    prefix_ok = True                   # the cells before `shared` ran without an error
    # labs/ (pending labs too): closing cells read ../book/. One OMP thread, as the grader runs
    # a class (tests/test_grade.py: --threads 1): on a loaded 2-core CI machine two torch
    # threads wait at every operator's barrier for each other's time slice, and lab 4's step A
    # then read 2-15 GB/s from one timing to the next (one thread: 15-17 GB/s), so a right
    # diagnosis of it came out 'overhead-bound'
    kernel = Kernel(runs.home(lab), env=dict(os.environ, OMP_NUM_THREADS="1"))
    if expect := os.environ.get("PERFLAB_EXPECT_INSTALLED_IN"):   # tests/course_download.py
        where = kernel.ask("__import__('perflab').__file__", 120)
        if not str(where).startswith(expect):
            kernel.close()
            raise RuntimeError(f"the kernel's perflab is {where}, not the course download's in {expect}")
    index = grade_index(cells)
    cuts = _shared_cuts(lab.stem, cells, index)
    prefixes: dict = {}                # (solution id, cut) -> the snapshot after the prefix
    try:
        for i, cell in enumerate(cells):
            g = meta(cell)
            if i == shared:
                kernel.snapshot("student edition")
            if g.get("solution"):
                kernel.snapshot(g["grade_id"])
            # a SHARED_PREFIX cell runs as its shared lines, then the rest: the namespace
            # between them, kept, is where its grouped wrong solutions start (their shared
            # lines are the reference's own, so they need not run again)
            cut = next((c for k, c in cuts.items() if WRONG[lab.stem][k][0] == g.get("grade_id")
                        and not g.get("grade")), 0)
            try:
                if cut:
                    lines = cell.source.splitlines(keepends=True)
                    err = kernel.run("".join(lines[:cut]))
                    if err is None:
                        kernel.snapshot(f"{g['grade_id']} @ {cut}")
                        prefixes[g["grade_id"], cut] = f"{g['grade_id']} @ {cut}"
                        err = kernel.run("".join(lines[cut:]))
                else:
                    err = kernel.run(cell.source)
            except CellError as e:
                run.broken = f"cell {i} ({g.get('grade_id', 'not graded')}): {e}"
                busy = str(e).startswith(NO_REPLY)
                prefix_ok = prefix_ok and i >= shared
                break
            if g.get("grade") or err is not None:
                run.results[g.get("grade_id", f"cell {i}")] = err
            blocks = split_hidden(cell.source)[1] if g.get("grade") else []
            if blocks and err is None:
                run.remote[g["grade_id"]] = kernel.hidden(blocks)
            prefix_ok = prefix_ok and (err is None or i >= shared)
        if run.broken is None and not any(run.results.values()):
            pairs = _pairs(lab.stem, cells, index)
            for k, (sol_id, old, new, *_) in enumerate(WRONG.get(lab.stem, [])):
                start = index.get(sol_id)
                if start is None or old not in cells[start].source or k in run.wrong:
                    continue                   # the test reports it, or its pair's replay ran it
                try:
                    if k in pairs:             # k and its partner in one replay
                        j = pairs.pop(k)
                        pairs.pop(j)
                        both = _paired_outcome(kernel, cells, index, lab.stem, (k, j))
                        if both is not None:
                            run.wrong.update(both)
                            continue           # else each alone, as unpaired
                    kernel.restore(sol_id)
                    source = cells[start].source.replace(old, new)
                    cut = cuts.get(k, 0)
                    # the reference run kept the namespace after the shared lines; where it
                    # could not (they raised there), the case runs its cell whole
                    if cut and (sol_id, cut) in prefixes:
                        kernel.restore(prefixes[sol_id, cut])
                        source = "".join(source.splitlines(keepends=True)[cut:])
                    run.wrong[k] = _wrong_outcome(kernel, cells, start, source,
                                                  _last_check(cells, make_student.exercise_number(sol_id)))
                except CellError as e:
                    run.wrong[k] = e
                    if str(e).startswith(NO_REPLY):    # the kernel is still busy: no later case can run
                        run.wrong.update({j: CellError(f"not run: case {k} left the kernel busy")
                                          for j in range(k + 1, len(WRONG[lab.stem]))})
                        busy = True
                        break
        if prefix_ok and not busy and not torch.cuda.is_available():
            if shared < len(student):
                kernel.restore("student edition")
            run.student_shared = shared
            try:
                run.student = [StudentCell(c.source, meta(c)) for c in student[:shared]]
                run.student += _student_cells(kernel, student[shared:])
            except CellError as e:
                run.student_error = str(e)
    finally:
        kernel.close()
    if not run.student and run.student_error is None:
        fresh = Kernel(runs.home(lab), env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))
        try:
            run.student = _student_cells(fresh, student)
        except CellError as e:
            run.student_error = str(e)
        finally:
            fresh.close()
    return run


def main(argv: list[str]) -> int:
    """``python tests/lab_runs.py LAB OUT``: one lab's :class:`LabRun`, pickled to ``OUT`` (also
    called in a child of tests/forker.py, which imported this module once)."""
    lab, out = Path(argv[0]), Path(argv[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(pickle.dumps(_lab_run(lab)))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":   # python tests/lab_runs.py LAB OUT: one lab's LabRun, pickled to OUT
    os.environ.setdefault("PERFLAB_FORCE_CPU_SIZES", "1")   # as tests/conftest.py
    import lab_runs          # the classes pickled by their importable name, not __main__'s

    sys.exit(lab_runs.main(sys.argv[1:]))
