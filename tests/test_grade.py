"""The grader (``grader/``, ``scripts/grade.py``) on folders of good, partial, broken and hostile
submissions of a tiny lab and of lab 3.

Each row must be exactly what that submission deserves, and no submission may change another's
row, the instructor's files, the results or anything outside its sandbox. The attacks
(``tests/grade_attacks.py``) are the classes of an instructor's attack run on the grader: reading
the solutions, writing into the clone, another submission or the results, a process left behind,
in-process tampering with the checks and with the kernel's error reporting, forging the channel
that carries the results, memory held by several children, a fork bomb, the network. Each
attack answers exercise 1 wrongly unless it works, so the expected rows below fail if it does.

A second batch holds issue 44's attacks on the verdicts (answers equal to everything, numbers
that read the check's expected value, truths read back from the notebook, a SiLU that is no
autograd.Function, patches of modules loaded late, a check log with a 400-digit integer and a
lone surrogate, hidden tests printed through ``In``, two names that sanitize alike, a dotfile),
with lab 3's reference (full marks) and student edition (zero) beside them. Each was run against
the grader before the fix and won there (the commit that added them says how).

The main batch runs two submissions at a time with cgroup limits where this machine has them;
a smaller batch uses the polled limits (per-process rlimits plus the grader's own accounting)
that machines without a writable cgroup get.
"""

import csv
import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402
import grade_attacks as attacks  # noqa: E402
import make_student  # noqa: E402

from grader import cli, notebooks, results, run as runs, verdicts, worker  # noqa: E402
from grader import sandbox as grade_sandbox  # noqa: E402

TINY = attacks.TINY
GOOD = attacks.GOOD


def _sandbox_or_skip(tmp_path):
    """Skip where bubblewrap cannot sandbox (a developer's laptop); in CI that is a failure."""
    try:
        box = grade_sandbox.detect("polled", hide=[ROOT], scratch=tmp_path / "trial")
    except grade_sandbox.SandboxUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to sandbox submissions: {err}")
        pytest.skip(str(err))
    box.close()


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def _tmp_leftovers() -> set[str]:
    """Entries of /tmp a grading run could leave: anything of the sandbox's uid, the grader's
    staging, a Unix-socket kernel's connection file, Inductor or torchelastic scratch."""
    out = set()
    for entry in Path("/tmp").iterdir():
        try:
            st = entry.lstat()
        except OSError:
            continue
        name = entry.name
        if st.st_uid in (grade_sandbox.UID, *grade_sandbox.SLOT_UIDS) or name.startswith(("perflab-grade", "torchelastic_")) \
                or name.startswith("torchinductor_") and name != f"torchinductor_{os.environ.get('USER', 'root')}":
            out.add(name)
        elif name.startswith("tmp") and name.endswith(".json"):
            try:
                if '"transport": "ipc"' in entry.read_text()[:2000]:
                    out.add(name)
            except OSError:
                pass
    return out


class Listener:
    """A TCP port on the grader's loopback that records every connection made to it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.done = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.done:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self.done = True
        self.thread.join(timeout=2)
        self.sock.close()


def _feedback_text(base: Path, name: str) -> str:
    """The ATTACK lines a submission printed, from its executed notebook."""
    nb = nbformat.read(base / "results-feedback" / name / "executed.ipynb", as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if "ATTACK" in o.get("text", ""))


# The two batches' gradings (``graded``, ``graded44``) leave the cores mostly idle (a sandbox's
# kernel starting, submissions sleeping or held until their time limit: ~80 s of CPU in ~200 s):
# in a whole session they run ahead as background jobs (tests/background.py), one after the other,
# from the session's start, beside one other job and the tests of other modules (in the test
# process they ran beside one job, the test process waiting on them: ~300 s of a CI=1 session);
# each test here reads exactly the dict the fixture returned when it graded in the test process
# (PERFLAB_TEST_SLOTS=0 still does), and none of this module's tests starts before both are done.
# The job runs the same command line through ``python -c`` (grader.cli.main, as scripts/grade.py)
# in a process of its own, which prints its pid first: its cgroups are named by that pid.
GRADED_JOB, GRADED44_JOB = "grade the attacks", "grade issue 44's attacks"
BACKGROUND_KEYS = (GRADED_JOB, GRADED44_JOB)      # tests/conftest.py waits for them before this module
_GRADE = ("import os, sys; sys.path.insert(0, sys.argv.pop(1)); print(f'grader pid {os.getpid()}', flush=True); "
          "from grader.cli import main; sys.exit(main())")


def _grade_in_process(args: list[str]) -> tuple[int, int]:
    """``grade.py args`` in this process: (its exit status, the grader's pid)."""
    return cli.main(args), os.getpid()


def _grade_in_a_job(output: list, args: list[str]) -> tuple[int, int]:
    """``grade.py args`` in a process of its own (a background job's): (exit status, its pid); its
    output is kept in ``output`` (stdout, stderr), for the test that reads the job to print."""
    proc = background.run([sys.executable, "-c", _GRADE, str(ROOT), *args], 1800, cwd=ROOT)
    output.append((proc.stdout, proc.stderr))
    first = proc.stdout.split("\n", 1)[0]
    assert first.startswith("grader pid "), (proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.returncode, int(first.split()[-1])


def _job(fn, base: Path):
    """A background job: ``fn`` graded into ``base`` by a grader of its own. Returns (what ``fn``
    returned or None, what it raised or None, the grader's output): the test that reads it prints
    the output, then raises or reads the dict, as if it had graded itself."""
    output: list = []
    try:
        return fn(base, functools.partial(_grade_in_a_job, output)), None, output
    except BaseException as err:  # noqa: BLE001 - raised again in the fixture that reads it
        return None, err, output


def _grade_the_attacks(base: Path, grade) -> dict:
    """The main batch graded into ``base`` by ``grade`` (one of the two above): what the tests read."""
    _sandbox_or_skip(base)
    folder = base / "submissions"
    folder.mkdir()
    lab = base / "lab_tiny.md"
    shutil.copy2(TINY, lab)
    reference = base / "lab_tiny.ipynb"      # a "reference notebook" with the solution beside the lab
    reference.write_text(attacks.submission({"ex1-solution": "def double(x):\n    return 2 * x  # BEGIN SOLUTION"}))
    out = base / "results.csv"
    marker = base / "daemon-was-here"
    token = uuid.uuid4().hex
    listener = Listener()
    subs = attacks.batch(ROOT, lab, folder, out, marker, listener.port, token)
    for name, text in subs.items():
        (folder / name).write_text(text)
    watched = [lab, reference, ROOT / "perflab" / "labs" / "exercises.py", ROOT / "tests" / "data" / "lab_tiny.md",
               folder / "b_full.ipynb"]
    before = {p: _hash(p) for p in watched}
    saved = {p: p.read_bytes() for p in watched if p.exists()}
    tmp_before = _tmp_leftovers()
    t0 = time.perf_counter()
    try:
        # 30 s per notebook (its cells, after the kernel started): the cells before the memory
        # bomb import for several seconds on a loaded 2-core CI machine, and with 15 s one run
        # left the bomb too little time to reach the limit ("time limit" instead of "memory
        # limit"); 2 GiB per sandbox; the memory bomb and the memory children exceed it
        rc, pid = grade([str(folder), "--out", str(out), "--lab", str(lab), "--timeout", "30", "--jobs", "2",
                         "--memory-gb", "2", "--max-procs", "12", "--no-progress", "--threads", "1"])
        seconds = time.perf_counter() - t0
        csv_right_after = out.read_bytes()
        time.sleep(2)                         # a process left behind would rewrite the results now
    finally:
        listener.close()
        changed = {p: _hash(p) for p in watched if _hash(p) != before[p]}
        for p, data in saved.items():         # put back whatever an attack changed, then fail
            if _hash(p) != before[p]:
                p.write_bytes(data)
        leaked = [p for p in (ROOT / "labs").glob(f".attack-{token}*")] + \
                 [p for p in (ROOT / "perflab").glob(f"_attack_{token}*")]
        for p in leaked:
            p.unlink()
    assert rc == 0
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    return {"rows": rows, "seconds": seconds, "base": base, "out": out, "marker": marker, "token": token,
            "changed": changed, "leaked": leaked, "csv_right_after": csv_right_after, "listener": listener,
            "tmp_new": _tmp_leftovers() - tmp_before, "pid": pid}


def _grade_issue44(base: Path, grade) -> dict:
    """Issue 44's batch graded into ``base`` by ``grade``: what the tests read."""
    _sandbox_or_skip(base)
    labs = base / "labs"
    labs.mkdir()
    shutil.copy2(TINY, labs / "99_tiny.md")
    shutil.copy2(attacks.LAB03, labs / "03_internals.md")
    folder = base / "submissions"
    folder.mkdir()
    for name, text in attacks.issue44_batch().items():
        (folder / name).write_text(text)
    out = base / "results.csv"
    rc, _ = grade([str(folder), "--out", str(out), "--labs", str(labs), "--timeout", "300", "--jobs", "2",
                   "--memory-gb", "3", "--no-progress", "--threads", "1"])
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    return {"rc": rc, "rows": rows, "base": base}


def background_gradings(items, tmp_path_factory) -> list:
    """The two gradings as background jobs, for a session that runs the tests reading them; issue
    44's after the main batch's, never beside it (each checks what was left in /tmp and which
    processes carry a grading token). Planned as a session fixture's job is (FIXTURE_PLANS), so
    that this module keeps its place among those read no job (tests/conftest.py)."""
    jobs = []
    for key, fixture, fn, folder in ((GRADED_JOB, "graded", _grade_the_attacks, "grading"),
                                     (GRADED44_JOB, "graded44", _grade_issue44, "grading44")):
        uses = [i for i, item in enumerate(items) if fixture in getattr(item, "fixturenames", ())]
        if uses:
            base = tmp_path_factory.mktemp(folder)
            after = (GRADED_JOB,) if key == GRADED44_JOB else ()
            jobs.append((uses[0], key, functools.partial(_job, fn, base), False, after))
    return jobs


background.FIXTURE_PLANS.append(background_gradings)


def _graded(key: str, fn, folder: str, tmp_path_factory) -> dict:
    """The job's dict, or (no job queued) ``fn`` graded here, in this process."""
    job = background.result(key)
    if job is None:
        return fn(tmp_path_factory.mktemp(folder), _grade_in_process)
    if job.error is not None:
        raise job.error
    value, error, output = job.value
    for stdout, stderr in output:
        print(stdout, end="")
        print(stderr, end="", file=sys.stderr)
    if error is not None:
        raise error
    return value


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return _graded(GRADED_JOB, _grade_the_attacks, "grading", tmp_path_factory)


EXPECTED = {  # submission: (status, points, ex1 mark starts with, ex2 mark starts with)
    "a_deletes_files.ipynb": ("graded", 4, "pass", "pass"),
    "b_full.ipynb": ("graded", 4, "pass", "pass"),
    "c_partial.ipynb": ("graded", 2, "pass", "fail: ExerciseNotDone: Exercise 2 is not done yet"),
    "c_partial_credit.ipynb": ("graded", 3, "pass", "partial 1/2: fail: ExerciseFailed: ✗ speed-up of at least 2.5"),
    "d_raises.ipynb": ("graded", 2, "fail: NameError", "pass"),
    "e_loops_forever.ipynb": ("time limit", 0, "not run", "not run"),
    "f_memory_bomb.ipynb": ("memory limit", 0, "", ""),
    "g_edits_checks.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)",
                             "fail: ExerciseNotDone: Exercise 2 is not done yet"),
    "h_fork_bomb.ipynb": ("process limit", 2, "pass", "not run"),
    "i_not_a_notebook.ipynb": ("not a notebook", 0, "not run", "not run"),
    "j_student_edition.ipynb": ("graded", 0, "fail: ExerciseNotDone: Exercise 1 is not done yet",
                                "fail: ExerciseNotDone: Exercise 2 is not done yet"),
    "k_reference.ipynb": ("graded", 4, "pass", "pass"),
    "m_memory_children.ipynb": ("memory limit", 2, "pass", ""),
    "n_killed_by_signal.ipynb": ("killed by signal 11", 2, "pass", "not run"),
    # the attacks: each fails, so exercise 1 (answered 3 * x) fails
    "p_reads_solutions.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "q_writes_files.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "r_daemon.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "s_replaces_checks.ipynb": ("tampering seen", 0, "fail: its checks did not run", "fail: ExerciseNotDone"),
    "t_swallows_errors.ipynb": ("tampering seen", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "u_patches_math.ipynb": ("tampering seen", 0, "fail: ✗ double(21) (re-checked by the grader)",
                             "fail: ExerciseNotDone"),
    "v_forges_replies.ipynb": ("tampering seen", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "w_forges_channel.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
    "x_network.ipynb": ("graded", 0, "fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"),
}


def test_every_row_is_exactly_right(graded):
    rows = graded["rows"]
    print(f"graded {len(rows)} submissions in {graded['seconds']:.1f} s")
    assert set(rows) == set(EXPECTED)
    for name, (status, points, ex1, ex2) in EXPECTED.items():
        r = rows[name]
        got = (r["status"], float(r["points"]), r["ex1"], r["ex2"], r["note"])
        assert r["status"] == status, (name, got)
        assert float(r["points"]) == points, (name, got)
        assert r["ex1"].startswith(ex1) and r["ex2"].startswith(ex2), (name, got)
        assert float(r["max_points"]) == 4
    for name in ("f_memory_bomb.ipynb", "m_memory_children.ipynb"):
        assert "pass" != rows[name]["ex2"] and "2 GiB" in rows[name]["note"], rows[name]
    assert "12-process limit" in rows["h_fork_bomb.ipynb"]["note"]
    assert json.loads(rows["b_full.ipynb"]["measured"]) == {     # the hidden test ran in the grader
        "ex1: double(21)": 42.0, "ex2: speed-up": 3.0, "ex2: speed-up of at least 2.5": 3.0}
    assert 0 < float(rows["b_full.ipynb"]["peak_memory_gib"]) < 2
    assert all(float(r["load"]) >= 0 for r in rows.values())     # the machine's load when each started


def test_tampering_is_named(graded):
    notes = {name: graded["rows"][name]["note"] for name in EXPECTED if name[0] in "stuv"}
    assert "check_close" in notes["s_replaces_checks.ipynb"], notes
    assert "ast_transformers" in notes["t_swallows_errors.ipynb"], notes
    assert "isclose" in notes["u_patches_math.ipynb"] and "re-checks" in notes["u_patches_math.ipynb"], notes
    assert "session.send" in notes["v_forges_replies.ipynb"], notes
    for name in ("b_full.ipynb", "k_reference.ipynb", "a_deletes_files.ipynb", "w_forges_channel.ipynb"):
        assert "tampering" not in graded["rows"][name]["note"], graded["rows"][name]


def test_submissions_see_no_solution_and_write_nothing_outside(graded):
    base = graded["base"]
    assert "ATTACK found solutions: []" in _feedback_text(base, "p_reads_solutions.ipynb")
    assert "ATTACK wrote: []" in _feedback_text(base, "q_writes_files.ipynb")
    assert graded["changed"] == {} and graded["leaked"] == []


def test_nothing_outlives_a_submission(graded):
    assert "ATTACK daemon started" in _feedback_text(graded["base"], "r_daemon.ipynb")
    assert graded["out"].read_bytes() == graded["csv_right_after"]
    assert b"forged" not in graded["csv_right_after"]
    assert not graded["marker"].exists()
    survivors = [p for p in grade_sandbox.processes() if grade_sandbox.has_token(p, b"PERFLAB_GRADE_TOKEN=")]
    assert survivors == []


def test_the_kernel_cannot_reach_the_result_channel_or_the_network(graded):
    assert "ATTACK forged writes:" in _feedback_text(graded["base"], "w_forges_channel.ipynb")
    assert "ATTACK reached: []" in _feedback_text(graded["base"], "x_network.ipynb")
    assert graded["listener"].connections == 0


def test_results_per_exercise_and_feedback_per_submission(graded):
    base = graded["base"]
    with open(base / "results-exercises.csv") as f:
        per_ex = {(r["submission"], r["exercise"]): r for r in csv.DictReader(f)}
    row = per_ex[("c_partial_credit.ipynb", "2")]
    assert (float(row["points"]), float(row["max_points"])) == (1, 2)
    assert json.loads(row["parts"])["ex2-check"] == "pass"
    feedback = (base / "results-feedback" / "c_partial_credit.ipynb" / "feedback.txt").read_text()
    assert "✓ speed-up: ratio 2.2" in feedback and "speed-up of at least 2.5" in feedback
    executed = (base / "results-feedback" / "b_full.ipynb" / "executed.ipynb").read_text()
    assert "check_close(double(0.25)" not in executed     # hidden tests are not handed back (their
    assert "✓ double(0.25): 0.5 is right." in executed    # one-line results, from the grader, are)
    assert "return x + x" in executed                     # the student's own code is


def test_grading_leaves_nothing_behind(graded):
    assert graded["tmp_new"] == set()
    assert not list((ROOT / ".cache" / "tmp").glob("perflab-grade-*"))
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids")):
        assert not list(mount.rglob(f"perflab-grade-{graded['pid']}")), mount


def _grade_polled(folder, out, timeout):
    """Grade ``folder`` two at a time under polled limits (no cgroup): the CSV's rows by
    submission, and each one's (status, points)."""
    rc = cli.main([str(folder), "--out", str(out), "--lab", str(TINY), "--timeout", str(timeout),
                   "--limits", "polled", "--memory-gb", "2", "--max-procs", "12", "--no-progress",
                   "--threads", "1", "--jobs", "2"])
    assert rc == 0
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    return rows, {n: (r["status"], float(r["points"])) for n, r in rows.items()}


def test_polled_limits_hold_where_there_is_no_cgroup(tmp_path):
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in ("b_full.ipynb", "h_fork_bomb.ipynb", "m_memory_children.ipynb"):
        text = attacks.batch(ROOT, TINY, folder, tmp_path / "r.csv", tmp_path / "m", 9, "t")[name]
        (folder / name).write_text(text)
    _, got = _grade_polled(folder, tmp_path / "results.csv", timeout=30)
    assert got == {"b_full.ipynb": ("graded", 4), "h_fork_bomb.ipynb": ("process limit", 2),
                   "m_memory_children.ipynb": ("memory limit", 2)}, got


def test_a_bomb_costs_its_neighbours_nothing_where_there_is_no_cgroup(tmp_path):
    """A thread bomb beside correct submissions, two at a time, polled limits: the bomb is
    stopped as a process limit, both neighbours are graded in full (``c`` starts while the bomb
    runs). When every sandbox ran as uid 65534, RLIMIT_NPROC counted the tasks of all of them
    together: the bomb held them, nothing counted it (one process) and it ran into the time
    limit, while its neighbour's kernel could not start ("crashed"). Each sandbox of the two
    runs as a uid of its own (where the grader is root)."""
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    subs = {"a_thread_bomb.ipynb": {"ex1-solution": attacks.prints_uid(GOOD["ex1-solution"]),
                                    "ex2-solution": attacks.thread_bomb()},
            "b_full.ipynb": dict(GOOD, **{"ex1-solution": attacks.prints_uid(GOOD["ex1-solution"])}),
            "c_full.ipynb": GOOD}
    for name, cells in subs.items():
        (folder / name).write_text(attacks.submission(cells))
    rows, got = _grade_polled(folder, tmp_path / "results.csv", timeout=60)
    assert got == {"a_thread_bomb.ipynb": ("process limit", 2), "b_full.ipynb": ("graded", 4),
                   "c_full.ipynb": ("graded", 4)}, (got, {n: r["note"] for n, r in rows.items()})
    assert "12-process limit" in rows["a_thread_bomb.ipynb"]["note"]
    uids = {}
    for name in ("a_thread_bomb.ipynb", "b_full.ipynb"):
        line = next(x for x in _feedback_text(tmp_path, name).splitlines() if x.startswith("ATTACK uid"))
        uids[name] = tuple(int(v) for v in line.split()[2:])
    if os.geteuid() == 0:            # a uid (and gid) of its own; else uid 65534 in a namespace of its own
        assert uids["a_thread_bomb.ipynb"][0] != uids["b_full.ipynb"][0], uids
        assert {u for pair in uids.values() for u in pair} <= set(grade_sandbox.SLOT_UIDS), uids
        assert all(u == g for u, g in uids.values()), uids


def test_each_job_slot_claims_a_uid_of_its_own(tmp_path):
    """As root: ``--jobs 2`` claims two slot uids (never 65534, never an account's), and a second
    grading run on the same machine claims two others while the first holds its."""
    _sandbox_or_skip(tmp_path)
    first = grade_sandbox.detect("polled", hide=[ROOT], scratch=tmp_path / "trial1", jobs=2)
    try:
        if os.geteuid() != 0:
            assert first.uids == [grade_sandbox.UID] * 2 and first.prlimit
            return
        second = grade_sandbox.detect("polled", hide=[ROOT], scratch=tmp_path / "trial2", jobs=2)
        try:
            assert len(set(first.uids)) == 2 and not set(first.uids) & set(second.uids), (first.uids, second.uids)
            assert set(first.uids + second.uids) <= set(grade_sandbox.SLOT_UIDS)
            assert "65534" not in first.describe()
        finally:
            second.close()
    finally:
        first.close()


def test_claimed_uids_are_unused_and_given_back(tmp_path):
    free = [u for u in range(65520, 65534) if grade_sandbox._uid_in_use(u) is None][:2]
    assert len(free) == 2
    candidates = [0, *free]                                   # 0: root's account, never a sandbox's
    uids, fds = grade_sandbox.claim_uids(2, candidates, locks=tmp_path)
    assert uids == free
    with pytest.raises(grade_sandbox.SandboxUnavailable, match="--jobs 1 needs 1 unused uids"):
        grade_sandbox.claim_uids(1, candidates, locks=tmp_path)   # another run holds both
    for fd in fds:
        os.close(fd)
    again, fds = grade_sandbox.claim_uids(1, candidates, locks=tmp_path)
    assert again == free[:1]
    for fd in fds:
        os.close(fd)


def test_a_slot_uid_passes_on_only_once_nothing_runs_as_it(tmp_path):
    """What a sandbox left running as its slot's uid (as root) is killed before the next
    submission of the slot starts (its tasks would count against the newcomer's limit)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("slot uids are the root grader's")
    uids, fds = grade_sandbox.claim_uids(1, locks=tmp_path)
    try:
        left = subprocess.Popen(["setpriv", f"--reuid={uids[0]}", f"--regid={uids[0]}", "--clear-groups",
                                 "sh", "-c", "sleep 60 & sleep 60 & wait"])
        deadline = time.monotonic() + 30
        while sum(grade_sandbox._owner(p) == uids[0] for p in grade_sandbox.processes()) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert grade_sandbox.reclaim(uids[0])
        assert not [p for p in grade_sandbox.processes() if grade_sandbox._owner(p) == uids[0]]
        left.wait(timeout=10)
    finally:
        for fd in fds:
            os.close(fd)


def _in_new_pid_namespace() -> tuple[subprocess.Popen, int]:
    """``sleep`` in a PID namespace of its own (as a sandbox's kernel is): (unshare, sleep's pid)."""
    unshare = ["unshare", "--pid", "--fork"] if os.geteuid() == 0 else ["unshare", "-Urpf"]
    proc = subprocess.Popen(unshare + ["sleep", "60"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = [p for p, parent in grade_sandbox.processes().items() if parent == proc.pid]
        if kids and grade_sandbox._pidns(kids[0]) != grade_sandbox._pidns(proc.pid):
            return proc, kids[0]
        time.sleep(0.05)
    proc.kill()
    pytest.skip("unshare cannot make a PID namespace here")


def test_a_submission_never_takes_its_neighbours_processes():
    """The kernel reuses a dead PID namespace's inode number (its name in /proc) for the next
    namespace made, often at once, and a pid once its process is gone: the tracker of a
    submission whose sandbox just died took the next sandbox's processes for its own, to count
    and to kill. It holds its namespace open and knows processes by pid and start time."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    first, inner = _in_new_pid_namespace()
    tracker = grade_sandbox.Tracker(first.pid, "t")
    assert tracker.sandboxed() == {inner}
    held = set(tracker.namespaces)
    tracker.kill_all()
    first.wait()
    second, neighbour = _in_new_pid_namespace()          # the next submission's sandbox
    try:
        assert grade_sandbox._pidns(neighbour) not in held
        assert tracker.scan() == set() and tracker.sandboxed() == set()
    finally:
        tracker.close()
        second.kill()
        second.wait()
    other = subprocess.Popen(["sleep", "60"])
    try:
        tracker = grade_sandbox.Tracker(other.pid, "t")
        assert tracker.scan() == {other.pid}
        tracker.known[other.pid] -= 1            # as if the pid had been a process gone since
        assert tracker.scan() == set()
    finally:
        other.kill()
        other.wait()


def test_a_stopped_grader_keeps_the_rows_it_finished(tmp_path):
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "a_full.ipynb").write_text(attacks.submission(GOOD))
    (folder / "b_loops.ipynb").write_text(attacks.submission({"ex1-solution": "while True:\n    pass"}))
    out = tmp_path / "results.csv"
    token_before = {p for p in grade_sandbox.processes() if grade_sandbox.has_token(p, b"PERFLAB_GRADE_TOKEN=")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "grade.py"), str(folder), "--out", str(out),
                             "--lab", str(TINY), "--timeout", "120", "--memory-gb", "2", "--no-progress",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = tmp_path / "results-feedback" / "a_full.ipynb" / "feedback.txt"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)                                       # the second submission is running now
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (stdout, stderr)
    assert "stopped by signal 15 after 1 of 2 submissions" in stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [(r["submission"], r["status"], float(r["points"])) for r in rows] == [("a_full.ipynb", "graded", 4)]
    left = {p for p in grade_sandbox.processes() if grade_sandbox.has_token(p, b"PERFLAB_GRADE_TOKEN=")}
    assert left - token_before == set()
    assert not list((ROOT / ".cache" / "tmp").glob(f"perflab-grade-*"))


def test_no_sandbox_no_grading(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    for tool in ("setpriv", "sh", "id", "touch"):
        if shutil.which(tool):
            (fake / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(fake))
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "a.ipynb").write_text(attacks.submission(GOOD))
    rc = cli.main([str(folder), "--out", str(tmp_path / "r.csv"), "--lab", str(TINY), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("grade.py: cannot grade untrusted code: bwrap cannot create") and "No permissions" in err[0]
    assert not (tmp_path / "r.csv").exists()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert cli.main([str(folder), "--lab", str(TINY), "--out", str(tmp_path / "r.csv")]) == 2
    assert "bubblewrap is not installed" in capsys.readouterr().err


def test_bad_arguments_are_named_in_one_line(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    for args, words in (([str(tmp_path / "nope")], "SUBMISSIONS_DIR is not a folder"),
                        ([str(folder), "--lab", str(tmp_path / "x.md")], "--lab"),
                        ([str(folder), "--timeout", "0"], "--timeout must be at least 1"),
                        ([str(folder), "--memory-gb", "-1"], "--memory-gb"),
                        ([str(folder), "--out", str(folder / "r.csv")], "inside SUBMISSIONS_DIR")):
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (args, err)


def test_graded_notebook_takes_only_solutions_from_the_submission():
    instructor = notebooks.instructor_notebook(TINY)
    sub = nbformat.reads(attacks.submission({"ex1-solution": "def double(x):\n    return 3 * x"},
                                            checks={"ex1-check": "print('✓')"}, extra="helper = 1"), as_version=4)
    nb = notebooks.graded_notebook(instructor, sub)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    origins = [c.metadata["perflab_origin"] for c in nb.cells if c.cell_type == "code"]
    hidden = [h for c in nb.cells for h in c.get("metadata", {}).get("perflab_hidden", [])]
    assert any("return 3 * x" in s for s in sources)
    assert not any("double(0.25)" in s for s in sources)    # the hidden test is the grader's,
    assert hidden == ['check_close(double(0.25), 0.5, "double(0.25)", rtol=0)\n']   # never the kernel's
    assert not any(s == "print('✓')" for s in sources)
    assert sources.index("helper = 1") == 2, sources        # right after the solution it followed
    assert origins[:4] == ["instructor", "student", "student", "instructor"]


def test_the_student_tree_holds_no_solution(tmp_path):
    labs = [TINY, ROOT / "labs" / "01_roofline.md"]
    tree = runs.build_student_tree(labs, tmp_path / "tree", None)
    blocks = []            # each solution and hidden test, whitespace flattened
    for lab in labs:
        for cell in notebooks.instructor_notebook(lab).cells:
            for pattern in (make_student._CODE_SOLUTION, make_student._HIDDEN):
                for block in pattern.finditer(cell.source + "\n") if cell.cell_type == "code" else ():
                    blocks.append(" ".join(ln.strip() for ln in block.group(0).splitlines()[1:-1] if ln.strip()))
    assert len(blocks) > 4

    def flat(p):
        return " ".join(ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip())

    everything = [flat(p) for p in tree.rglob("*") if p.is_file()]
    everything += [" ".join(ln.strip() for ln in "".join(c.source for c in nbformat.read(p, 4).cells).splitlines()
                            if ln.strip()) for p in tree.rglob("*.ipynb")]
    assert [b for b in blocks if b and any(b in t for t in everything)] == []
    assert not list(tree.rglob("*.md")) and not (tree / ".git").exists()
    assert (tree / "labs" / "01_roofline.ipynb").exists() and (tree / "perflab" / "labs" / "exercises.py").exists()


def test_a_check_cell_passes_only_with_its_verdicts():
    ok = {"check": "close", "what": "double(21)", "passed": True, "inputs": {"got": 42.0, "expected": 42.0, "rtol": 0}}
    lied = dict(ok, inputs={"got": 63.0, "expected": 42.0, "rtol": 0})
    cell = {"grade_id": "ex1-check", "error": "", "replied": True, "checks": ["close"]}
    assert verdicts.judge(dict(cell, ledger=[ok])) == ("pass", [])
    assert verdicts.judge(dict(cell, ledger=[]))[0] == "fail: its checks did not run"
    assert verdicts.judge(dict(cell, checks=["close", "true"], ledger=[ok]))[0] == "fail: its checks did not run"
    verdict, seen = verdicts.judge(dict(cell, ledger=[lied]))
    assert verdict.startswith("fail: ✗ double(21)") and "re-checks" in seen[0]
    verdict, seen = verdicts.judge(dict(cell, ledger=[ok, {"failed": "ExerciseFailed", "message": "✗ nope"}]))
    assert verdict == "fail: ExerciseFailed: ✗ nope" and "not reported" in seen[0]
    assert verdicts.judge(dict(cell, error="NameError: x", ledger=[ok])) == ("fail: NameError: x", [])
    assert verdicts.judge(dict(cell, ledger=[ok], hidden_error="ExerciseFailed: ✗ double(0.25)")) == \
        ("fail: ExerciseFailed: ✗ double(0.25)", [])
    assert verdicts.judge(None) == ("not run", [])
    assert notebooks.checks_called("check_close(a, 1, 'x')\nif y:\n    check_true(1, '', '')") == {"check_close"}
    assert not notebooks.calls_check_unconditionally("if dev.type == 'cuda':\n    check_true(ok, 'a', 'b')")


def test_a_verdict_the_grader_cannot_recheck_is_a_failure():
    """The old grader accepted a verdict whose inputs were not plain data (an answer equal to
    everything was recorded as its repr); a hostile record must never raise either."""
    repr_answer = {"check": "choice", "what": "w", "passed": True,
                   "inputs": {"got": {"repr": "Yes()"}, "expected": "cpu", "choices": None}}
    unplain = dict(repr_answer, inputs={"got": None, "expected": None, "choices": None, "unplain": "Yes"})
    huge = {"check": "close", "what": "w", "passed": True, "inputs": {"got": 10**400, "expected": 10**400, "rtol": 0}}
    for entry in (repr_answer, unplain, huge, {"check": "close", "inputs": "x"}, {"check": "nope", "inputs": {}},
                  {"check": "true", "what": "\ud800", "passed": True, "inputs": {"condition": [[[]]]}}):
        assert verdicts.recheck(entry) is False, entry
        cell = {"grade_id": "ex1-check", "error": "", "replied": True, "checks": [], "ledger": [entry]}
        assert verdicts.judge(cell)[0].startswith("fail: "), entry
    good = {"check": "choice", "what": "strides", "passed": True,
            "inputs": {"got": [20, 1, 5], "expected": [20, 1, 5], "choices": None}}
    assert verdicts.recheck(good) is True
    nan = {"check": "choice", "what": "w", "passed": True, "inputs": {"got": {"f": "nan"}, "expected": {"f": "nan"},
                                                                       "choices": None}}
    assert verdicts.recheck(nan) is False                 # NaN is not equal to itself


def test_the_ledger_refuses_what_no_check_writes():
    assert worker.parse_entry(b'{"check": "close", "inputs": {"got": 1}}') == {"check": "close", "inputs": {"got": 1}}
    for line in (b'{"got": ' + b"1" * 401 + b"}", b'{"got": NaN}', b'{"got": Infinity}', b"[1, 2]", b"not json",
                 b"[" * 100000 + b"]" * 100000, b'{"a": "' + b"x" * 70000 + b'"}'):
        assert worker.parse_entry(line) is None, line[:40]


def test_names_the_lab_changes_in_place_are_known():
    source = ("state = {}\ndef f():\n    state['initialised'] = True\nratios['sync'], _ = g()\n"
              "log.append(1)\nx.add_(1)\ny = z\nobj.attr = 3\ndel d['k']\n")
    assert notebooks.mutated_names(source) == {"state", "ratios", "log", "x", "obj", "d"}


def test_feedback_folders_are_one_per_submission():
    names = ["pair a.ipynb", "pair_a.ipynb", ".hidden.ipynb", "hidden.ipynb", "A.ipynb", "a.ipynb", "é.ipynb",
             "_.ipynb", "x" * 300]
    folders = results.feedback_folders(names)
    assert len({f.casefold() for f in folders.values()}) == len(names), folders
    assert folders["pair_a.ipynb"] == "pair_a.ipynb" and folders["pair a.ipynb"].startswith("pair_a.ipynb-")
    assert all(not f.startswith(".") and "/" not in f and len(f) < 120 for f in folders.values())


def test_hidden_tests_are_cut_out_and_must_sit_at_the_top_level():
    visible, hidden = notebooks.split_hidden("a = 1\n### BEGIN HIDDEN TESTS\nb = 2\n### END HIDDEN TESTS\nc = 3\n")
    assert visible == "a = 1\nc = 3\n" and hidden == ["b = 2\n"]
    with pytest.raises(ValueError, match="indented"):
        notebooks.split_hidden("if x:\n    ### BEGIN HIDDEN TESTS\n    b = 2\n    ### END HIDDEN TESTS\n")
    labs = sorted((ROOT / "labs").glob("*.md")) + [TINY]
    for lab in labs:                          # every lab's hidden tests can run in the grader
        for cell in notebooks.instructor_notebook(lab).cells:
            if cell.cell_type == "code":
                notebooks.split_hidden(cell.source)


def test_the_names_a_later_check_reads_are_watched():
    instructor = notebooks.instructor_notebook(attacks.LAB03)
    nb = notebooks.graded_notebook(instructor, nbformat.reads(attacks.lab03_reference(), as_version=4))
    watched = notebooks.watched_names(nb, instructor)
    index = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}
    first = watched[index["ex1-solution"]]
    assert {"expressions", "xs", "ys", "model", "train_slow", "silu_naive", "check_true", "torch"} <= first
    assert "answers" not in first and "SiLU" not in first          # the student's own answers
    assert "expressions" not in watched[index["ex2-solution"]]      # no check after ex1 reads it
    assert "extreme" not in first and "F" in first                 # the hidden test's own name; a module it reads


# ---------------------------------------------------------------------------------------------
# Issue 44: verdicts as strong as the sandbox
# ---------------------------------------------------------------------------------------------

EXPECTED_44 = {  # submission: (status, points, max points, marks' prefixes, words in its note or feedback)
    "03_reference.ipynb": ("graded", 14, 14, ["pass"] * 5, []),
    "03_student.ipynb": ("graded", 0, 14, ["fail: ExerciseNotDone"] * 5, []),
    "03_no_right_answer.ipynb": ("graded", 0, 14, [
        "fail: ExerciseFailed: ✗ answers must map each expression to (strides",
        "fail: ExerciseFailed: ✗ snippet a raises: the answer must be plain data",
        "fail: ExerciseFailed: ✗ SiLU must be a class deriving from torch.autograd.Function",
        "fail: ExerciseFailed: ✗ the losses differ",
        "fail: ExerciseFailed: ✗ your predicted crossover: got 1,"], []),
    # exercise 2's check loops over the notebook's snippets, which the submission emptied: it
    # passes, and the row says that snippets changed under the student's code
    "03_patches.ipynb": ("tampering seen", 2, 14, [
        "fail: ExerciseFailed: ✗ expressions is no longer the lab's list", "pass",
        "fail: ExerciseFailed: ✗ your Function keeps tensors for backward outside save_for_backward",
        "fail: ExerciseFailed: ✗ train_fast still synchronizes", "fail: ExerciseNotDone"],
        ["expressions", "snippets", "perflab.internals.hostsync", "count_host_syncs", "perflab.labs.lab03",
         "torch.autograd"]),
    "99_tiny-aa_ledger_bomb.ipynb": ("tampering seen", 4, 4, ["pass", "pass"], ["check ledger"]),
    "99_tiny-peeks_expected.ipynb": ("graded", 0, 4, ["fail: ExerciseFailed: ✗ double(21): got 1,",
                                                      "fail: ExerciseNotDone"], []),
    "99_tiny-prints_history.ipynb": ("graded", 4, 4, ["pass", "pass"], []),
    "99_tiny-patches_more.ipynb": ("tampering seen", 0, 4, ["fail: ExerciseFailed: ✗ double(21)", "fail: ExerciseNotDone"],
                                   ["numpy", "check_everything (new)", "perflab.labs.lab03"]),
    "99_tiny-pair a.ipynb": ("graded", 4, 4, ["pass", "pass"], []),
    "99_tiny-pair_a.ipynb": ("graded", 0, 4, ["fail: ExerciseNotDone", "fail: ExerciseNotDone"], []),
    ".99_tiny-dotfile.ipynb": ("unknown lab", 0, 0, [], ["pass --lab"]),
    "99_tiny-notes.txt": ("not a notebook", 0, 4, ["not run", "not run"], ["NotJSONError"]),
}


@pytest.fixture(scope="module")
def graded44(tmp_path_factory):
    return _graded(GRADED44_JOB, _grade_issue44, "grading44", tmp_path_factory)


def test_issue44_every_row_is_what_its_answers_deserve(graded44):
    rows = graded44["rows"]
    assert graded44["rc"] == 0
    assert set(rows) == set(EXPECTED_44)                  # every entry has a row, the dotfile included
    for name, (status, points, most, marks, words) in EXPECTED_44.items():
        r = rows[name]
        got = (r["status"], r["points"], [r[f"ex{i + 1}"] for i in range(len(marks))], r["note"])
        assert r["status"] == status, (name, got)
        assert float(r["points"]) == points and float(r["max_points"]) == most, (name, got)
        for i, prefix in enumerate(marks):
            assert r[f"ex{i + 1}"].startswith(prefix), (name, i + 1, got)
        feedback = (graded44["base"] / "results-feedback" / r["feedback"] / "feedback.txt").read_text()
        for word in words:                                # the note names three, the feedback all
            assert word in r["note"] or word in feedback, (name, word, got)
    assert "tampering" not in rows["03_reference.ipynb"]["note"] + rows["03_student.ipynb"]["note"]


def test_issue44_hidden_tests_leave_no_trace_in_the_kernel(graded44):
    executed = (graded44["base"] / "results-feedback" / "99_tiny-prints_history.ipynb" / "executed.ipynb").read_text()
    assert "ATTACK In:" in executed and "ATTACK _ih:" in executed
    assert "double(0.25)" not in executed.split("✓ double(0.25): 0.5 is right.")[0].split("ATTACK In:")[-1]
    assert "0.25), 0.5" not in executed and "HIDDEN" not in executed
    assert "✓ double(0.25): 0.5 is right." in executed   # the grader's own run of them


def test_issue44_feedback_folders_are_unique_and_every_row_has_one(graded44):
    feedback = graded44["base"] / "results-feedback"
    rows = graded44["rows"]
    texts = {name: (feedback / r["feedback"] / "feedback.txt").read_text() for name, r in rows.items()}
    assert texts["99_tiny-pair a.ipynb"].startswith("99_tiny-pair a.ipynb: 99_tiny, graded, 4/4")
    assert texts["99_tiny-pair_a.ipynb"].startswith("99_tiny-pair_a.ipynb: 99_tiny, graded, 0/4")
    assert len({r["feedback"] for r in rows.values()}) == len(rows)
    for r in rows.values():                              # the check log's hostile text spoiled none
        (feedback / r["feedback"] / "feedback.txt").read_bytes().decode("utf-8")


def test_a_row_whose_grading_raises_costs_no_other_row(tmp_path, monkeypatch, capsys):
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        (folder / name).write_text(attacks.submission(GOOD))

    def fake_grade(name, data, lab, run, kind="file"):
        if name == "b.ipynb":
            raise OverflowError("int too large to convert to float")
        row = runs.blank_row(name, lab)
        row["status"] = "graded"
        return row

    real_finish = cli.finish

    def finish(row, parts):
        if row["submission"] == "c.ipynb":
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real_finish(row, parts)

    monkeypatch.setattr(runs, "grade_one", fake_grade)
    monkeypatch.setattr(runs, "startup_check", lambda run: None)
    monkeypatch.setattr(cli, "finish", finish)
    out = tmp_path / "results.csv"
    assert cli.main([str(folder), "--out", str(out), "--lab", str(TINY), "--no-progress"]) == 0
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    assert rows["a.ipynb"]["status"] == "graded"
    for name, why in (("b.ipynb", "OverflowError"), ("c.ipynb", "UnicodeEncodeError")):
        assert rows[name]["status"] == "error" and why in rows[name]["note"], rows[name]
        assert (tmp_path / "results-feedback" / name / "feedback.txt").exists()
    assert "b.ipynb" in capsys.readouterr().err


def test_no_kernel_can_start_no_grading(tmp_path, monkeypatch, capsys):
    """A sandbox that cannot reach the Python environment: one line, exit status 2, no rows
    (the old grader graded every row 'error' 0/N and exited 0)."""
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "a.ipynb").write_text(attacks.submission(GOOD))
    monkeypatch.setattr(grade_sandbox, "python_dirs", lambda: [])
    rc = cli.main([str(folder), "--out", str(tmp_path / "r.csv"), "--lab", str(TINY), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("grade.py: cannot start a kernel in the sandbox"), err
    assert not (tmp_path / "r.csv").exists()


def test_a_clone_and_an_environment_under_tmp_work(tmp_path):
    """The instructor grades from /tmp: the clone and its Python environment there (the
    sandbox's private /tmp used to hide both: every row 'error', exit status 0)."""
    _sandbox_or_skip(tmp_path)
    place = Path(tempfile.mkdtemp(prefix="perflab-tmp-clone-", dir="/tmp"))
    try:
        clone = place / "clone"
        for part in ("grader", "perflab"):
            shutil.copytree(ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
        (clone / "scripts").mkdir()
        for script in ("grade.py", "make_student.py"):
            shutil.copy2(ROOT / "scripts" / script, clone / "scripts" / script)
        (clone / "venv").symlink_to(Path(sys.prefix).resolve())      # the environment, reached through /tmp
        python = clone / "venv" / "bin" / Path(sys.executable).name
        folder = tmp_path / "submissions"
        folder.mkdir()
        (folder / "a.ipynb").write_text(attacks.submission(GOOD))
        out = tmp_path / "results.csv"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        got = subprocess.run([str(python), str(clone / "scripts" / "grade.py"), str(folder), "--lab", str(TINY),
                              "--out", str(out), "--timeout", "60", "--memory-gb", "2", "--no-progress",
                              "--threads", "1"], capture_output=True, text=True, env=env, timeout=900)
        assert got.returncode == 0, got.stderr[-2000:]
        with open(out) as f:
            rows = list(csv.DictReader(f))
        assert [(r["submission"], r["status"], float(r["points"])) for r in rows] == [("a.ipynb", "graded", 4)], rows
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_a_class_for_the_timing_run_and_its_sentence():
    from grader import timing

    subs = timing.class_of(TINY, 2)
    assert sorted(subs) == ["la_reference_00.ipynb", "la_reference_01.ipynb", "la_student_00.ipynb",
                            "la_student_01.ipynb", "la_tampered_00.ipynb", "la_tampered_01.ipynb"]
    tampered = nbformat.reads(subs["la_tampered_00.ipynb"], as_version=4)
    assert any(c.source == timing.TAMPER for c in tampered.cells)
    record = {"lab": "03_internals", "submissions": 30, "jobs": 2, "threads": 1, "seconds": 600.0,
              "median_seconds_by_kind": {"reference": 40.0, "student": 12.0, "tampered": 41.0},
              "cpu": "AMD EPYC", "cores": 2, "load_before": 1.5, "load_after": 2.5, "date": "2026-12-04"}
    sentence = timing.describe(record)
    assert sentence.startswith("30 submissions of 03_internals took 10.0 min with --jobs 2 --threads 1 on AMD EPYC")
    assert "reference 40 s, student 12 s, tampered 41 s" in sentence
    record["points_by_kind"] = {"reference": [11.0, 14.0, 14.0], "student": [0.0, 0.0, 14.0]}
    assert "(reference 11-14/14 points; student 0/14 points)" in timing.describe(record)
