"""scripts/grade.py on a folder of good, partial, broken and hostile submissions of a tiny lab.

Each row must be exactly what that submission deserves, and no submission may change another's
row, the instructor's files, the results or anything outside its sandbox. The attacks
(``tests/grade_attacks.py``) are the classes of an instructor's attack run on the grader: reading
the solutions, writing into the clone, another submission or the results, a process left behind,
in-process tampering with the checks and with the kernel's error reporting, forging the channel
that carries the results, memory held by several children, a fork bomb, the network. Each
attack answers exercise 1 wrongly unless it works, so the expected rows below fail if it does.

The main batch runs two submissions at a time with cgroup limits where this machine has them;
a second, smaller batch uses the polled limits (per-process rlimits plus the grader's own
accounting) that machines without a writable cgroup get. Both together take about two minutes
on a loaded 2-core machine.
"""

import csv
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import grade  # noqa: E402
import grade_attacks as attacks  # noqa: E402
import grade_sandbox  # noqa: E402
import make_student  # noqa: E402

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
        if st.st_uid == grade_sandbox.UID or name.startswith(("perflab-grade", "torchelastic_")) \
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


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
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
        rc = grade.main([str(folder), "--out", str(out), "--lab", str(lab), "--timeout", "30", "--jobs", "2",
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
            "tmp_new": _tmp_leftovers() - tmp_before}


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
    assert json.loads(rows["b_full.ipynb"]["measured"]) == {
        "ex1: double(21)": 42.0, "ex1: double(0.25)": 0.5, "ex2: speed-up": 3.0, "ex2: speed-up of at least 2.5": 3.0}
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
    assert "✓ double(0.25): 0.5 is right." in executed    # one-line results are)
    assert "return x + x" in executed                     # the student's own code is


def test_grading_leaves_nothing_behind(graded):
    assert graded["tmp_new"] == set()
    assert not list((ROOT / ".cache" / "tmp").glob("perflab-grade-*"))
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids")):
        assert not list(mount.rglob(f"perflab-grade-{os.getpid()}")), mount


def test_polled_limits_hold_where_there_is_no_cgroup(tmp_path):
    _sandbox_or_skip(tmp_path)
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in ("b_full.ipynb", "h_fork_bomb.ipynb", "m_memory_children.ipynb"):
        text = attacks.batch(ROOT, TINY, folder, tmp_path / "r.csv", tmp_path / "m", 9, "t")[name]
        (folder / name).write_text(text)
    out = tmp_path / "results.csv"
    rc = grade.main([str(folder), "--out", str(out), "--lab", str(TINY), "--timeout", "30", "--limits", "polled",
                     "--memory-gb", "2", "--max-procs", "12", "--no-progress", "--threads", "1", "--jobs", "2"])
    assert rc == 0
    with open(out) as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    got = {n: (r["status"], float(r["points"])) for n, r in rows.items()}
    assert got == {"b_full.ipynb": ("graded", 4), "h_fork_bomb.ipynb": ("process limit", 2),
                   "m_memory_children.ipynb": ("memory limit", 2)}, got


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
    rc = grade.main([str(folder), "--out", str(tmp_path / "r.csv"), "--lab", str(TINY), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("grade.py: cannot grade untrusted code: bwrap cannot create") and "No permissions" in err[0]
    assert not (tmp_path / "r.csv").exists()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert grade.main([str(folder), "--lab", str(TINY), "--out", str(tmp_path / "r.csv")]) == 2
    assert "bubblewrap is not installed" in capsys.readouterr().err


def test_bad_arguments_are_named_in_one_line(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    for args, words in (([str(tmp_path / "nope")], "SUBMISSIONS_DIR is not a folder"),
                        ([str(folder), "--lab", str(tmp_path / "x.md")], "--lab"),
                        ([str(folder), "--timeout", "0"], "--timeout must be at least 1"),
                        ([str(folder), "--memory-gb", "-1"], "--memory-gb"),
                        ([str(folder), "--out", str(folder / "r.csv")], "inside SUBMISSIONS_DIR")):
        assert grade.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (args, err)


def test_graded_notebook_takes_only_solutions_from_the_submission():
    instructor = grade.instructor_notebook(TINY)
    sub = nbformat.reads(attacks.submission({"ex1-solution": "def double(x):\n    return 3 * x"},
                                            checks={"ex1-check": "print('✓')"}, extra="helper = 1"), as_version=4)
    nb = grade.graded_notebook(instructor, sub)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    origins = [c.metadata["perflab_origin"] for c in nb.cells if c.cell_type == "code"]
    assert any("return 3 * x" in s for s in sources)
    assert any("double(0.25)" in s for s in sources)        # the hidden test is back
    assert not any(s == "print('✓')" for s in sources)
    assert sources.index("helper = 1") == 2, sources        # right after the solution it followed
    assert origins[:4] == ["instructor", "student", "student", "instructor"]


def test_the_student_tree_holds_no_solution(tmp_path):
    labs = [TINY, ROOT / "labs" / "01_roofline.md"]
    tree = grade.build_student_tree(labs, tmp_path / "tree", None)
    blocks = []            # each solution and hidden test, whitespace flattened
    for lab in labs:
        for cell in grade.instructor_notebook(lab).cells:
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
    cell = {"grade_id": "ex1-check", "error": "", "replied": True, "expects_verdict": True}
    assert grade.judge(dict(cell, ledger=[ok])) == ("pass", [])
    assert grade.judge(dict(cell, ledger=[]))[0] == "fail: its checks did not run"
    verdict, seen = grade.judge(dict(cell, ledger=[lied]))
    assert verdict.startswith("fail: ✗ double(21)") and "re-checks" in seen[0]
    verdict, seen = grade.judge(dict(cell, ledger=[ok, {"failed": "ExerciseFailed", "message": "✗ nope"}]))
    assert verdict == "fail: ExerciseFailed: ✗ nope" and "not reported" in seen[0]
    assert grade.judge(dict(cell, error="NameError: x", ledger=[ok])) == ("fail: NameError: x", [])
    assert grade.judge(None) == ("not run", [])
    assert grade.recheck({"check": "choice", "what": "w", "passed": True,
                          "inputs": {"got": {"repr": "device(type='cpu')"}, "expected": "cpu", "choices": None}}) is None
    assert grade.calls_check_unconditionally("check_close(a, 1, 'x')\nif y:\n    check_true(1, '', '')")
    assert not grade.calls_check_unconditionally("if dev.type == 'cuda':\n    check_true(ok, 'a', 'b')")
