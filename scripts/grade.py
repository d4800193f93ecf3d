#!/usr/bin/env python3
"""Grade lab submissions: each run in a sandbox of its own, verdicts decided outside it.

    python scripts/grade.py SUBMISSIONS_DIR --out results.csv
    python scripts/grade.py SUBMISSIONS_DIR --lab labs/01_roofline.md --timeout 600 --memory-gb 16

Every file in ``SUBMISSIONS_DIR`` is one submission (``alice.ipynb``, ``01_roofline-bob.ipynb``).
Its lab is ``--lab`` if given, else the lab whose number starts the file name (``01_...``). The
grader reads every submission and lab before it runs any, then, for each submission:

1. builds the notebook to run from the **instructor's** lab source (set-up, checks with their
   hidden tests, closing cells), with the submission's solution cells (nbgrader
   ``solution: true``) put in by ``grade_id`` (a missing one is the student stub) and any code
   cells the student added after the solution they followed. An edited or deleted check changes
   nothing: checks are re-inserted, never taken from the submission;
2. runs it cell by cell in a fresh kernel inside a sandbox (``scripts/grade_sandbox.py``):
   bubblewrap namespaces (PID, network, mount, IPC), an unprivileged uid, a read-only *student
   tree* (perflab, the student editions, the reference chapters the labs read; no lab source, no
   solution, no other submission, no clone), a private ``/tmp`` and one writable tmpfs home,
   and limits on the memory and process count of the whole sandbox (``--memory-gb``,
   ``--max-procs``; a cgroup where the machine allows one) and on time (``--timeout``). The
   cells are sent to the kernel one at a time by a worker process *outside* the sandbox, which
   the kernel cannot see or signal;
3. decides each check's verdict outside the sandbox: a check cell passes when the kernel reports
   no error, no :class:`~perflab.labs.exercises.ExerciseFailed` was created while it ran, every check
   it called recorded a passing verdict that the grader's own copy of the check confirms from
   the recorded inputs (JSON data in a pipe, the *ledger*), and, for a cell that calls a check
   unconditionally, at least one verdict arrived. After every cell the worker compares the
   kernel's check functions, perflab, torch and its error handling with their state before any
   student code ran (``scripts/grade_probe.py``): a change is reported as
   ``tampering seen: <what>`` for a human to look at;
4. writes, once and atomically at the end (or on SIGINT/SIGTERM, with the rows finished so far),
   ``results.csv`` (one row per submission: status, points, one mark per exercise, peak memory,
   measured numbers), ``results-exercises.csv`` (one row per submission and exercise, with each
   part), and a feedback folder ``results-feedback/<submission>/`` with the executed notebook
   (solutions and hidden tests of the lab's own cells removed) and ``feedback.txt`` (the check
   messages). Nothing else is written; every scratch file stays in the clone's ``.cache/tmp``
   and is removed.

Statuses: ``graded``, ``tampering seen``, ``time limit``, ``memory limit`` (of the whole
sandbox), ``process limit``, ``killed by signal N``, ``crashed`` (the kernel exited),
``not a notebook``, ``unknown lab``, ``error`` (the kernel would not start). A machine where
bubblewrap cannot make the sandbox's namespaces is refused with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import grade_probe  # noqa: E402
import grade_sandbox as sandboxing  # noqa: E402
import make_student  # noqa: E402

MAX_SUBMISSION_BYTES = 64 * 2**20
MAX_OUTPUT_BYTES = 4 * 2**20          # outputs kept per notebook (errors are always kept)
MAX_LEDGER_BYTES = 8 * 2**20          # what a kernel may write to its ledger
STARTUP_S = 120                       # kernel start and the integrity baseline, on top of --timeout
CHECKS = ("check_close", "check_choice", "check_true", "check_ratio_at_least", "check_timer")
_EXERCISE = re.compile(r"ex(?:ercise)?[-_ ]?(\d+)", re.I)
_SIGNALS = {9: "SIGKILL", 11: "SIGSEGV", 6: "SIGABRT", 24: "SIGXCPU: the CPU-time limit",
            25: "SIGXFSZ: the file-size limit", 15: "SIGTERM", 7: "SIGBUS"}


def _perflab():
    """The one place the grader imports perflab: the lab checks it re-runs on recorded inputs
    (the framework's ``perflab.labs.exercises``, and ``check_timer`` of ``perflab.labs.lab01``)
    and where the instructor's machine ceilings are kept (``perflab.machine.ceilings.default_path``).
    """
    import types

    import perflab.labs.exercises
    import perflab.labs.lab01
    import perflab.machine.ceilings

    checks = types.SimpleNamespace(**{n: getattr(perflab.labs.exercises, n) for n in CHECKS
                                      if n != "check_timer"},
                                   check_timer=perflab.labs.lab01.check_timer,
                                   ExerciseFailed=perflab.labs.exercises.ExerciseFailed)
    return checks, perflab.machine.ceilings.default_path


# ---------------------------------------------------------------------------------------------
# Building the notebook to run (used by the worker)
# ---------------------------------------------------------------------------------------------

def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def instructor_notebook(lab: Path):
    """The lab source (``.md``) as a notebook, hidden tests included, outputs empty."""
    import jupytext

    nb = jupytext.read(lab)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def graded_notebook(instructor, submission):
    """The notebook to execute: the instructor's cells, with the submission's solution cells.

    Solution cells (nbgrader ``solution: true``) are taken from ``submission`` by ``grade_id``;
    one the submission lacks becomes the student stub. Every other instructor cell (checks,
    hidden tests, set-up) is the instructor's, whatever the submission holds under its id. Code
    cells the student added (no nbgrader id known to the lab) follow the solution cell they
    followed in the submission (an unlabeled cell whose text is none of the lab's is one the
    student added; an edited copy of an instructor cell counts as added, and runs after the
    original). Each code cell's ``metadata.perflab_origin`` says whose code it is (``student``
    or ``instructor``). Returns a new notebook.
    """
    import copy

    from nbformat.v4 import new_code_cell

    solution_ids = {_nbgrader(c).get("grade_id") for c in instructor.cells if _nbgrader(c).get("solution")}
    theirs: dict[str, str] = {}
    extra: dict[str | None, list[str]] = {}
    anchor = None
    known = {_nbgrader(c).get("grade_id") for c in instructor.cells} - {None}
    # the student edition's copies of the instructor's unlabeled cells (set-up, experiments)
    instructor_sources = {make_student.strip_code(c.source).strip() for c in instructor.cells
                          if c.cell_type == "code"}
    for cell in submission.cells:
        gid = _nbgrader(cell).get("grade_id")
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if gid in solution_ids:
            theirs.setdefault(gid, source)
            anchor = gid
        elif gid not in known and source.strip() not in instructor_sources:
            extra.setdefault(anchor, []).append(source)

    def added(src):
        cell = new_code_cell(src)
        cell.metadata["perflab_origin"] = "student"
        return cell

    nb = copy.deepcopy(instructor)
    cells = [added(src) for src in extra.get(None, [])]
    for cell in nb.cells:
        gid = _nbgrader(cell).get("grade_id")
        if cell.cell_type == "code" and gid in solution_ids:
            cell.source = theirs.get(gid, make_student.strip_code(cell.source, make_student.exercise_number(gid)))
            cell.metadata["perflab_origin"] = "student"
            cells.append(cell)
            cells.extend(added(src) for src in extra.get(gid, []))
        else:
            if cell.cell_type == "code":
                cell.metadata["perflab_origin"] = "instructor"
            cells.append(cell)
    nb.cells = cells
    return nb


def feedback_notebook(nb):
    """The executed notebook as a student may see it: the lab's own cells without solutions or
    hidden tests (their outputs kept), the student's cells as they ran."""
    for cell in nb.cells:
        origin = cell.get("metadata", {}).pop("perflab_origin", None)
        if cell.cell_type == "code" and origin == "instructor":
            cell.source = make_student.strip_code(cell.source, make_student.exercise_number(_nbgrader(cell).get("grade_id")))
        elif cell.cell_type == "markdown":
            cell.source = make_student.strip_markdown(cell.source)
    return nb


def calls_check_unconditionally(source: str) -> bool:
    """Whether a check cell calls one of :data:`CHECKS` in a statement at its top level (not inside
    an ``if``, loop, ``try`` or function), so that running it must record at least one verdict."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in CHECKS:
                return True
    return False


def _first_line(text: str, limit: int = 160) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text or "").strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _perflab_modules(lab_text: str) -> list[str]:
    """The perflab modules a lab names (watched from the start, before student code can patch them)."""
    names = set(re.findall(r"\bperflab\.(\w+)", lab_text)) | set(re.findall(r"from perflab\.(\w+) import", lab_text))
    return ["perflab", "perflab.labs.exercises", "torch"] + sorted(f"perflab.{n}" for n in names)


# ---------------------------------------------------------------------------------------------
# The student tree: what a sandbox may read
# ---------------------------------------------------------------------------------------------

def build_student_tree(labs: list[Path], dest: Path, ceilings: Path | None) -> Path:
    """Write the read-only tree every sandbox sees at ``/course`` and return ``dest``.

    It holds the ``perflab`` package (with its data), the student edition of each lab in
    ``labs`` (``make_student``: no solutions, no hidden tests), the reference chapters and files
    those labs read from ``../book/``, the instructor's measured ceilings (``ceilings``, if the
    file exists) and an empty ``.tools`` mount point when the clone has tools. No lab source,
    reference lab notebook, submission or ``.git``.
    """
    import nbformat

    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "perflab", dest / "perflab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "labs").mkdir()
    (dest / "book").mkdir()
    book = ROOT / "book"
    for lab in labs:
        nbformat.write(make_student.student_notebook(lab), dest / "labs" / (lab.stem + ".ipynb"))
        wanted = set()
        number = re.match(r"(\d+)_", lab.name)
        if number:
            wanted |= set(book.glob(f"{number.group(1)}_*.ipynb"))
        for rel in re.findall(r"\.\./book/([\w./-]+)", lab.read_text()):
            path = (book / rel).resolve()
            if path.is_relative_to(book.resolve()) and path.exists():
                wanted |= {path, *path.parent.glob(path.name + ".*")}    # with its sidecars (.json)
        for path in wanted:
            target = dest / "book" / path.relative_to(book.resolve() if path.is_relative_to(book.resolve()) else book)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True)
            else:
                shutil.copy2(path, target)
    if ceilings is not None and ceilings.is_file():
        shutil.copy2(ceilings, dest / "ceilings.json")
    if (ROOT / ".tools").is_dir():
        (dest / ".tools").mkdir()
    sandboxing.write_hosts(dest)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return dest


# ---------------------------------------------------------------------------------------------
# The worker: one submission, outside the sandbox, talking to a kernel inside it
# ---------------------------------------------------------------------------------------------

class Ledger:
    """The kernel's ledger: a pipe its checks append JSON lines to (``$PERFLAB_GRADE_LOG``).

    The worker keeps a copy of the write end and writes a marker with a secret nonce after each
    cell; a reader thread splits the stream at the markers, so each cell gets exactly the lines
    written before its reply arrived. What a kernel wrote cannot be taken back; at most
    :data:`MAX_LEDGER_BYTES` are read (``overflow`` says when there was more).
    """

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.nonce = uuid.uuid4().hex
        self.overflow = False
        self._lines: list[dict] = []
        self._batches: dict[int, list[dict]] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf, total = b"", 0
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return
            total += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            if len(buf) > 65536:          # an endless line: not an entry
                buf = b""
            for line in lines:
                self._line(line, total)

    def _line(self, line: bytes, total: int) -> None:
        try:
            entry = json.loads(line) if line.strip() else None
        except ValueError:
            entry = None
        with self._cond:
            if isinstance(entry, dict) and entry.get("mark") == self.nonce:
                self._batches[int(entry.get("cell", -1))] = self._lines
                self._lines = []
                self._cond.notify_all()
            elif isinstance(entry, dict) and total <= MAX_LEDGER_BYTES and len(self._lines) < 2000:
                self._lines.append(entry)
            elif total > MAX_LEDGER_BYTES:
                self.overflow = True

    def cut(self, index: int, timeout: float = 10.0) -> list[dict]:
        """The entries written since the previous cut (call after cell ``index`` replied)."""
        os.write(self.write_fd, b"\n" + json.dumps({"mark": self.nonce, "cell": index}).encode() + b"\n")
        with self._cond:
            self._cond.wait_for(lambda: index in self._batches, timeout=timeout)
            return self._batches.pop(index, [])


def _kernel_manager_class():
    """A kernel manager whose kernel starts inside the sandbox, talking over Unix sockets in
    the submission's ipc folder (the sandbox has no network to reach TCP ports)."""
    from jupyter_client.manager import AsyncKernelManager

    class SandboxKernelManager(AsyncKernelManager):
        sandbox_argv: list[str] = []
        ipc_dir: str = ""

        def format_kernel_cmd(self, extra_arguments=None):
            info = {"shell_port": self.shell_port, "iopub_port": self.iopub_port, "stdin_port": self.stdin_port,
                    "control_port": self.control_port, "hb_port": self.hb_port, "ip": sandboxing.IPC + "/k",
                    "key": self.session.key.decode(), "transport": "ipc",
                    "signature_scheme": self.session.signature_scheme, "kernel_name": ""}
            path = Path(self.ipc_dir) / "kernel.json"
            path.write_text(json.dumps(info))
            os.chmod(path, 0o644)
            return self.sandbox_argv + [sys.executable, "-m", "ipykernel_launcher", "-f",
                                        sandboxing.IPC + "/kernel.json"] + list(extra_arguments or [])

    return SandboxKernelManager


def _client_class():
    from nbclient import NotebookClient

    class GradingClient(NotebookClient):
        """nbclient with a cap on the outputs it keeps (error outputs always kept, shortened)."""

        kept = 0
        truncated = False

        def output(self, outs, msg, display_id, cell_index):
            if msg.get("msg_type") == "error":
                content = msg.get("content", {})
                content["traceback"] = [t[:2000] for t in (content.get("traceback") or [])[-30:]]
                return super().output(outs, msg, display_id, cell_index)
            size = len(json.dumps(msg.get("content", {}), default=str))
            if self.kept + size > MAX_OUTPUT_BYTES:
                if not self.truncated:
                    self.truncated = True
                    from nbformat.v4 import new_output
                    outs.append(new_output("stream", name="stderr",
                                           text=f"[grader: outputs past {MAX_OUTPUT_BYTES // 2**20} MiB not kept]\n"))
                return None
            self.kept += size
            return super().output(outs, msg, display_id, cell_index)

    return GradingClient


def worker(job: dict, send) -> None:
    """Run one submission (see :func:`graded_notebook`) in a sandboxed kernel; ``send(msg)``
    reports to the grader: ``{"cell": ...}`` after each cell, ``{"tamper": [...]}`` when the
    integrity check sees a change, and ``{"done": ...}`` last."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbclient.util import run_sync

    t0 = time.monotonic()
    try:
        submission = nbformat.reads(Path(job["submission"]).read_text(), as_version=4)
        nbformat.validate(submission)
    except Exception as err:  # any parse failure is the submission's, reported in its row
        send({"done": {"status": "not a notebook", "note": _first_line(f"{type(err).__name__}: {err}")}})
        return
    lab = Path(job["lab"])
    nb = graded_notebook(instructor_notebook(lab), submission)
    ledger = Ledger()
    if os.geteuid() == 0:      # the kernel (another uid) reopens the pipe as /dev/fd/N: give it the pipe
        os.fchown(ledger.write_fd, sandboxing.UID, sandboxing.UID)
    env = dict(job["env"], PERFLAB_GRADE_LOG=f"/dev/fd/{ledger.write_fd}")
    box = sandboxing.Sandbox(**{k: v for k, v in job["sandbox"].items() if k != "cgroups"})
    argv = sandboxing.command(box, tree=Path(job["tree"]), ipc=Path(job["ipc"]), env=env, argv=[],
                              size_bytes=job["tmpfs_bytes"], hide=[Path(p) for p in job["hide"]],
                              extra_ro=[tuple(p) for p in job["extra_ro"]])
    client = _client_class()(nb, timeout=job["timeout"], allow_errors=True, kernel_name="python3",
                             startup_timeout=STARTUP_S, shutdown_kernel="immediate",
                             kernel_manager_class=_kernel_manager_class())
    replies: dict[int, dict] = {}
    client.on_cell_executed = lambda cell, cell_index, execute_reply: replies.__setitem__(
        cell_index, execute_reply.get("content", {}))
    km = client.km = client.create_kernel_manager()
    km.sandbox_argv, km.ipc_dir = argv, job["ipc"]
    km.transport, km.ip = "ipc", "k"            # socket names relative to the ipc folder (the cwd)
    km.connection_file = str(Path(job["ipc"]) / "client.json")
    status, note, kernel_exit, process = "graded", "", None, None

    def ask(expression: str, timeout: float) -> str | None:
        msg_id = client.kc.execute("", silent=True, store_history=False, user_expressions={"p": expression},
                                   allow_stdin=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = run_sync(client.kc.get_shell_msg)(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # no reply in time (queue.Empty) or the kernel went away
                return None
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                got = reply.get("content", {}).get("user_expressions", {}).get("p", {})
                if got.get("status") != "ok":
                    return None
                try:
                    return ast.literal_eval(got.get("data", {}).get("text/plain", ""))
                except (ValueError, SyntaxError):
                    return None
        return None

    watch = grade_probe.Watch(ask, _perflab_modules(lab.read_text()))
    stderr = _Tail()
    index = -1
    try:
        with client.setup_kernel(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=job["ipc"],
                                 pass_fds=(ledger.write_fd,), stdout=subprocess.DEVNULL, stderr=stderr.fd,
                                 preexec_fn=lambda: sandboxing.enter(job["procs_files"], job["rlimits"])):
            process = getattr(km.provisioner, "process", None)
            stderr.close_write()
            _lock_ipc(Path(job["ipc"]))
            findings = watch.baseline()
            if findings:
                send({"tamper": findings})
            send({"started": True})
            deadline = time.monotonic() + job["timeout"]
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                client.timeout = max(1, int(deadline - time.monotonic()))
                origin = cell.metadata.get("perflab_origin", "instructor")
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    status, note = "time limit", f"over {job['timeout']} s (cell {index})"
                    break
                except DeadKernelError:
                    status, note = "kernel died", f"in cell {index}"
                    break
                finally:
                    entries = ledger.cut(index) if status == "graded" else []
                    send({"cell": _cell_result(cell, index, replies.get(index), entries, origin)})
                findings = watch.after(origin, f"cell {index} ({'your code' if origin == 'student' else 'the lab'})")
                if findings:
                    send({"tamper": findings})
            if ledger.overflow:
                send({"tamper": [f"the kernel wrote more than {MAX_LEDGER_BYTES // 2**20} MiB to the check ledger"]})
    except DeadKernelError as err:
        status, note = "kernel died", _first_line(str(err))
    except Exception as err:  # the kernel would not start, or shut down badly: this row only
        if status == "graded":
            why = stderr.last_line()
            status, note = "error", _first_line(f"{type(err).__name__}: {err}" + (f" ({why})" if why else ""))
    stderr.close_write()
    if process is not None:
        try:
            kernel_exit = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kernel_exit = None
    if status == "kernel died" and index >= 0:
        note = f"in cell {index}"
    try:
        out = Path(job["executed"])
        out.write_text(nbformat.writes(feedback_notebook(nb)))
    except Exception:  # feedback is best effort; the verdict does not depend on it
        pass
    send({"done": {"status": status, "note": note, "kernel_exit": kernel_exit,
                   "seconds": time.monotonic() - t0}})


class _Tail:
    """A pipe for the sandbox's stderr, drained by a thread that keeps only its last 4 KiB."""

    def __init__(self):
        self._read, self.fd = os.pipe()
        self.data = b""
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while chunk := os.read(self._read, 65536):
            self.data = (self.data + chunk)[-4096:]
        os.close(self._read)

    def close_write(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def last_line(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""


def _lock_ipc(ipc: Path) -> None:
    """After the kernel made its sockets: the sandbox may no longer add, remove or replace any
    entry in its ipc folder (a socket swapped for a symlink would be followed by the worker)."""
    try:
        if os.geteuid() == 0:
            os.chown(ipc, 0, 0)
        os.chmod(ipc, 0o555)
    except OSError:
        pass


def _cell_result(cell, index: int, reply: dict | None, entries: list[dict], origin: str) -> dict:
    error = ""
    if reply and reply.get("status") == "error":
        error = _first_line(f"{reply.get('ename', '')}: {reply.get('evalue', '')}")
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error" and not error:
            error = _first_line(f"{out.get('ename', '')}: {out.get('evalue', '')}")
    g = _nbgrader(cell)
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return {"index": index, "grade_id": g.get("grade_id"), "grade": bool(g.get("grade")),
            "points": g.get("points", 0) if g.get("grade") else 0, "error": error, "origin": origin,
            "replied": reply is not None, "text": text[-4000:] if g.get("grade") else "",
            "expects_verdict": bool(g.get("grade")) and calls_check_unconditionally(cell.source),
            "ledger": entries}


# ---------------------------------------------------------------------------------------------
# The grader: one worker and one sandbox per submission, verdicts, statuses, files
# ---------------------------------------------------------------------------------------------

class Run:
    """What all submissions of one grading run share: arguments, sandbox, student tree, staging."""

    def __init__(self, args, sandbox: sandboxing.Sandbox, tree: Path, staging: Path):
        self.args, self.sandbox, self.tree, self.staging = args, sandbox, tree, staging
        self.stopping = threading.Event()
        self.count = 0
        self.lock = threading.Lock()


def _sandbox_env(run: Run, token: str) -> dict[str, str]:
    home = sandboxing.HOME
    env = {"PATH": ":".join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": home, "USER": "student", "LOGNAME": "student", "LANG": "C.UTF-8", "TERM": "dumb",
           "TMPDIR": "/tmp", "PYTHONPATH": sandboxing.TREE, "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg",
           "MPLCONFIGDIR": f"{home}/.cache/matplotlib", "IPYTHONDIR": f"{home}/.ipython",
           "JUPYTER_RUNTIME_DIR": f"{home}/.jupyter/runtime", "JUPYTER_DATA_DIR": f"{home}/.jupyter/data",
           "JUPYTER_CONFIG_DIR": f"{home}/.jupyter", "XDG_CACHE_HOME": f"{home}/.cache",
           "TORCHINDUCTOR_CACHE_DIR": f"{home}/.cache/inductor", "TRITON_CACHE_DIR": f"{home}/.cache/triton",
           "TORCH_EXTENSIONS_DIR": f"{home}/.cache/torch_extensions", "PERFLAB_DATA_DIR": f"{home}/.cache/perflab",
           "PERFLAB_CEILINGS": (f"{sandboxing.TREE}/ceilings.json" if (run.tree / "ceilings.json").exists()
                                else f"{home}/.cache/perflab/ceilings.json"),
           "PYDEVD_DISABLE_FILE_VALIDATION": "1", "OMP_NUM_THREADS": str(run.args.threads),
           "PERFLAB_GRADE_TOKEN": token}
    for k in ("CUDA_VISIBLE_DEVICES", "TZ"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def _worker_env(scratch: Path) -> dict[str, str]:
    """The worker's environment: the grader's, with every scratch setting inside ``scratch``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_GRADE")}
    for name, sub in (("TMPDIR", "tmp"), ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                      ("MPLCONFIGDIR", "matplotlib"), ("XDG_CACHE_HOME", "xdg"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("TRITON_CACHE_DIR", "triton"), ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
                      ("JUPYTER_DATA_DIR", "jupyter_data")):
        (scratch / sub).mkdir(exist_ok=True)
        env[name] = str(scratch / sub)
    env["PYTHONPATH"] = str(ROOT)
    return env


class _Inbox:
    """Messages from a worker (JSON lines on a pipe only it holds), parsed as they arrive."""

    def __init__(self, fd: int):
        self.fd, self.messages, self.started = fd, [], None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self.fd, 65536):
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    if "started" in msg:
                        self.started = time.monotonic()
                    self.messages.append(msg)

    def close(self) -> None:
        self.thread.join(timeout=5)
        os.close(self.fd)


def grade_one(name: str, data: bytes, lab: Path | None, run: Run) -> dict:
    """Grade one submission (its bytes) in a fresh sandbox; returns its row (before judging)."""
    args = run.args
    row = {"submission": name, "lab": lab.stem if lab else "", "status": "", "note": "", "cells": [],
           "tamper": [], "seconds": 0.0, "peak_bytes": 0, "executed": None, "load": os.getloadavg()[0]}
    if lab is None:
        row.update(status="unknown lab", note="name it NN_... or pass --lab")
        return row
    if len(data) > MAX_SUBMISSION_BYTES:
        row.update(status="not a notebook", note=f"{len(data) / 2**20:.0f} MiB: too large")
        return row
    if run.stopping.is_set():
        row.update(status="interrupted")
        return row
    with run.lock:
        run.count += 1
        number = run.count
    scratch = run.staging / f"sub-{number}"
    scratch.mkdir(mode=0o700)
    ipc = scratch / "ipc"
    ipc.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(ipc, sandboxing.UID, sandboxing.UID)
    (scratch / "submission.ipynb").write_bytes(data)
    token = uuid.uuid4().hex
    memory = int(args.memory_gb * 2**30)
    limits = sandboxing.Limits(run.sandbox, f"sub-{number}", memory, args.max_procs,
                               int(args.timeout * 1.5) + 30, jobs=args.jobs)
    box = run.sandbox
    job = {"submission": str(scratch / "submission.ipynb"), "lab": str(lab), "ipc": str(ipc),
           "executed": str(scratch / "executed.ipynb"), "tree": str(run.tree), "timeout": args.timeout,
           "env": _sandbox_env(run, token), "procs_files": limits.procs_files(), "rlimits": limits.rlimits(),
           "tmpfs_bytes": memory or 8 * 2**30, "hide": [str(ROOT)], "parent": os.getpid(),
           "extra_ro": [[str(ROOT / ".tools"), sandboxing.TREE + "/.tools"]] if (run.tree / ".tools").is_dir() else [],
           "sandbox": {"bwrap": box.bwrap, "privileged": box.privileged, "limits": box.limits,
                       "setpriv": box.setpriv}}
    read_fd, write_fd = os.pipe()
    t0 = time.monotonic()
    with open(scratch / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(write_fd)],
                                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,),
                                cwd=ipc, env=_worker_env(scratch), start_new_session=True)
    os.close(write_fd)
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()
    inbox = _Inbox(read_fd)
    tracker = sandboxing.Tracker(proc.pid, token)
    verdict = None
    interval = 0.2 if box.limits == "polled" else 0.1
    while proc.poll() is None:
        over = limits.exceeded(tracker)
        started = inbox.started
        if over == "memory":
            verdict = ("memory limit", f"the sandbox reached its {args.memory_gb:g} GiB limit")
        elif over == "processes":
            verdict = ("process limit", f"the sandbox reached its {args.max_procs}-process limit")
        elif (started is None and time.monotonic() - t0 > STARTUP_S
              or started is not None and time.monotonic() - started > args.timeout + 30):
            verdict = ("time limit", f"over {args.timeout} s (killed)" if started else
                       f"the kernel did not start within {STARTUP_S} s")
        elif run.stopping.is_set():
            verdict = ("interrupted", "the grader was stopped")
        if verdict:
            break
        time.sleep(interval)
    if verdict:
        limits.kill()                                   # the sandbox first: the worker reports what ran
        for pid in tracker.sandboxed():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    tracker.kill_all()                                  # the worker too, and anything left
    proc.wait()
    inbox.close()
    use = limits.usage()
    limits.close()
    row["seconds"] = time.monotonic() - t0
    row["peak_bytes"] = use["peak_bytes"]
    done = None
    for msg in inbox.messages:
        if "cell" in msg:
            row["cells"].append(msg["cell"])
        elif "tamper" in msg:
            row["tamper"] += msg["tamper"]
        elif "done" in msg:
            done = msg["done"]
    if (scratch / "executed.ipynb").exists():
        row["executed"] = (scratch / "executed.ipynb").read_text()
    memory_error = any(c.get("error", "").startswith("MemoryError") for c in row["cells"])
    last = row["cells"][-1]["index"] if row["cells"] else None
    where = f" (cell {last})" if last is not None else ""
    if verdict and verdict[0] == "interrupted":
        row.update(status="interrupted", note=verdict[1])
    elif use["oom_kills"] or memory_error or (verdict and verdict[0] == "memory limit"):
        row.update(status="memory limit", note=f"the sandbox reached its {args.memory_gb:g} GiB limit{where}")
    elif use["fork_refused"] or (verdict and verdict[0] == "process limit"):
        row.update(status="process limit", note=f"the sandbox reached its {args.max_procs}-process limit{where}")
    elif verdict:
        row.update(status=verdict[0], note=verdict[1])
    elif done is None:
        log = (scratch / "worker.log").read_bytes()[-2000:].decode(errors="replace").strip().splitlines()
        row.update(status="crashed", note=f"the grader's worker exited with {proc.returncode} and no result"
                                          + (f": {log[-1]}" if log else ""))
    elif done["status"] == "kernel died":
        code = done.get("kernel_exit")
        if code is not None and (code > 128 or code < 0):
            sig = code - 128 if code > 128 else -code
            label = _SIGNALS.get(sig, signal.Signals(sig).name if sig in signal.valid_signals() else "?")
            row.update(status=f"killed by signal {sig}", note=f"{label}, {done['note']}")
        else:
            row.update(status="crashed", note=f"the kernel exited with code {code}, {done['note']}")
    else:
        row.update(status=done["status"], note=done.get("note", ""))
    shutil.rmtree(scratch, ignore_errors=True)
    return row


def _exercise(grade_id: str) -> str:
    m = _EXERCISE.search(grade_id or "")
    return m.group(1) if m else (grade_id or "?")


def exercises_of(lab: Path) -> dict[str, list[tuple[str, float]]]:
    """{exercise number: [(check grade_id, points), ...]} of a lab, in order: an exercise with
    several check cells has several parts, each scored on its own."""
    out: dict[str, list[tuple[str, float]]] = {}
    for cell in instructor_notebook(lab).cells:
        g = _nbgrader(cell)
        if g.get("grade"):
            out.setdefault(_exercise(g.get("grade_id", "")), []).append((g["grade_id"], float(g.get("points", 0))))
    return out


def _has_repr(value) -> bool:
    if isinstance(value, dict):
        return "repr" in value or any(_has_repr(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_repr(v) for v in value)
    return False


def recheck(entry: dict) -> bool | None:
    """Re-run a recorded check on its recorded inputs with the grader's own copy of the check:
    True (passes), False (fails, or the record is malformed), None (not re-checkable: an input
    was not plain data)."""
    checks, _ = _perflab()
    inputs = entry.get("inputs")
    if not isinstance(inputs, dict):
        return False
    if _has_repr(inputs):
        return None
    what = str(entry.get("what", ""))
    calls = {"close": lambda i: checks.check_close(i["got"], i["expected"], what, rtol=i["rtol"]),
             "choice": lambda i: checks.check_choice(i["got"], i["expected"], what, choices=i["choices"]),
             "true": lambda i: checks.check_true(i["condition"] is True, what, what),
             "ratio_at_least": lambda i: checks.check_ratio_at_least(i["numerator"], i["denominator"],
                                                                     i["minimum"], what),
             "timer": lambda i: checks.check_timer(i["mine_s"], i["library_s"], what)}
    call = calls.get(entry.get("check"))
    if call is None:
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            call(inputs)
        except checks.ExerciseFailed:
            return False
        except (KeyError, TypeError, ValueError, AttributeError):
            return False
    return True


def judge(cell: dict | None) -> tuple[str, list[str]]:
    """One check cell's verdict, decided here from what the worker saw: ``("pass" | "not run" |
    "fail: <why>", [tampering findings])``."""
    if cell is None or not cell.get("replied", True) and not cell.get("error"):
        return "not run", []
    if cell.get("error"):
        return "fail: " + cell["error"], []
    gid = cell.get("grade_id")
    ledger = cell.get("ledger", [])
    raised = [e for e in ledger if "failed" in e]
    verdicts = [e for e in ledger if "check" in e]
    if raised:
        msg = _first_line(f"{raised[0].get('failed')}: {raised[0].get('message', '')}")
        return "fail: " + msg, [f"{gid} raised '{msg}' but its error was not reported"]
    failed = [v for v in verdicts if v.get("passed") is not True]
    if failed:
        what = _first_line(str(failed[0].get("what", "")))
        return f"fail: ✗ {what}", [f"{gid}: check '{what}' failed but its error was not reported"]
    for v in verdicts:
        if recheck(v) is False:
            what = _first_line(str(v.get("what", "")))
            return (f"fail: ✗ {what} (re-checked by the grader)",
                    [f"{gid}: check '{what}' passed in the kernel but fails when the grader re-checks it"])
    if cell.get("expects_verdict") and not verdicts:
        return "fail: its checks did not run", [f"{gid} reported success but none of its checks ran"]
    return "pass", []


def finish(row: dict, parts: dict[str, list[tuple[str, float]]]) -> dict:
    """Judge every check cell of a row; set its marks, points and (for tampering) its status."""
    by_id = {c["grade_id"]: c for c in row["cells"] if c.get("grade_id")}
    marks, detail, measured, points, total = {}, {}, {}, 0.0, 0.0
    scored: dict[str, tuple[float, float]] = {}
    tamper = list(row["tamper"])
    for ex, items in parts.items():
        got, most, first_fail, states = 0.0, 0.0, None, []
        for gid, pts in items:
            most += pts
            verdict, seen = judge(by_id.get(gid))
            tamper += seen
            states.append(verdict)
            detail[gid] = verdict
            scored[gid] = (pts if verdict == "pass" else 0.0, pts)
            if verdict == "pass":
                got += pts
            elif first_fail is None:
                first_fail = verdict
            for entry in (by_id.get(gid) or {}).get("ledger", []):
                if "what" in entry and "value" in entry and "check" not in entry:
                    measured[f"ex{ex}: {entry['what']}"] = entry["value"]
        total += most
        points += got
        if all(s == "pass" for s in states):
            marks[ex] = "pass"
        elif all(s == "not run" for s in states):
            marks[ex] = "not run"
        elif got > 0:
            marks[ex] = f"partial {got:g}/{most:g}: " + (first_fail or "")
        else:
            marks[ex] = first_fail or "not run"
    seen: list[str] = []
    for t in tamper:
        if t not in seen:
            seen.append(t)
    if seen:
        what = "; ".join(seen[:3]) + (f" (and {len(seen) - 3} more)" if len(seen) > 3 else "")
        if row["status"] == "graded":
            row["status"], row["note"] = "tampering seen", f"tampering seen: {what}"
        else:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"tampering seen: {what}"
    row["summary"] = {"marks": marks, "parts": detail, "scored": scored, "points": points, "max_points": total,
                      "measured": measured, "tamper": seen}
    return row


def _mark_symbol(mark: str) -> str:
    if mark == "pass":
        return "✓"
    if mark == "not run":
        return "·"
    if mark.startswith("partial"):
        return "½"
    return "…" if "is not done yet" in mark else "✗"


def render(rows: list[dict], width: int) -> str:
    """The summary table printed at the end (✓ pass, ½ partial, ✗ fail, … not done, · not run)."""
    head = f"{'submission':24s} {'lab':14s} {'status':19s} {'points':>7s}  " + " ".join(
        f"{i + 1:>2d}" for i in range(width)) + "  note"
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["summary"]
        marks = [_mark_symbol(s["marks"][k]) for k in s["marks"]] + [" "] * (width - len(s["marks"]))
        pts = f"{s['points']:g}/{s['max_points']:g}" if s["max_points"] else "—"
        lines.append((f"{r['submission'][:24]:24s} {r['lab'][:14]:14s} {r['status'][:19]:19s} {pts:>7s}  "
                      + " ".join(f"{m:>2s}" for m in marks) + f"  {r['note'][:70]}").rstrip())
    lines.append("✓ pass  ½ partial  ✗ fail  … not done yet  · not run")
    return "\n".join(lines)


def _atomic_csv(path: Path, fields: list[str], records: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(records)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_results(rows: list[dict], out: Path, width: int) -> Path:
    """Write ``out`` (one row per submission) and, beside it, ``<stem>-exercises.csv`` (one row
    per submission and exercise), each atomically. Returns the second path."""
    fields = (["submission", "lab", "status", "points", "max_points", "seconds", "peak_memory_gib", "load", "note"]
              + [f"ex{i + 1}" for i in range(width)] + ["measured"])
    records, per_ex = [], []
    for r in rows:
        s = r["summary"]
        rec = {"submission": r["submission"], "lab": r["lab"], "status": r["status"], "points": s["points"],
               "max_points": s["max_points"], "seconds": f"{r['seconds']:.1f}",
               "peak_memory_gib": f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "",
               "load": f"{r['load']:.1f}",
               "note": r["note"], "measured": json.dumps(s["measured"], sort_keys=True)}
        for i, (ex, mark) in enumerate(s["marks"].items()):
            rec[f"ex{i + 1}"] = mark
        records.append(rec)
        for ex, mark in s["marks"].items():
            parts = {gid: v for gid, v in s["parts"].items() if _exercise(gid) == ex}
            per_ex.append({"submission": r["submission"], "lab": r["lab"], "exercise": ex,
                           "points": sum(s["scored"][gid][0] for gid in parts),
                           "max_points": sum(s["scored"][gid][1] for gid in parts),
                           "mark": mark, "parts": json.dumps(parts, ensure_ascii=False),
                           "measured": json.dumps({k: v for k, v in s["measured"].items()
                                                   if k.startswith(f"ex{ex}:")}, sort_keys=True)})
    _atomic_csv(out, fields, records)
    second = out.with_name(out.stem + "-exercises.csv")
    _atomic_csv(second, ["submission", "lab", "exercise", "points", "max_points", "mark", "parts", "measured"],
                per_ex)
    return second


def _safe_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "submission"
    return safe[:120]


def write_feedback(row: dict, folder: Path) -> None:
    """``folder/<submission>/``: ``executed.ipynb`` (if the kernel ran) and ``feedback.txt``."""
    s = row["summary"]
    target = folder / _safe_name(row["submission"])
    target.mkdir(parents=True, exist_ok=True)
    lines = [f"{row['submission']}: {row['lab']}, {row['status']}, {s['points']:g}/{s['max_points']:g} points",
             *( [row["note"]] if row["note"] else []), ""]
    by_id = {c["grade_id"]: c for c in row["cells"] if c.get("grade_id")}
    for ex, mark in s["marks"].items():
        lines.append(f"Exercise {ex}: {mark}")
        for gid, verdict in s["parts"].items():
            if _exercise(gid) != ex:
                continue
            cell = by_id.get(gid) or {}
            msgs = [ln for ln in cell.get("text", "").splitlines() if ln.startswith(("✓", "✗"))]
            lines += [f"  {gid}: {verdict}"] + [f"    {m}" for m in msgs[:20]]
    if s["tamper"]:
        lines += ["", "Tampering seen (for a human to look at):"] + [f"  - {t}" for t in s["tamper"]]
    (target / "feedback.txt").write_text("\n".join(lines) + "\n")
    if row.get("executed"):
        (target / "executed.ipynb").write_text(row["executed"])


def find_lab(path: Path, labs: list[Path], forced: Path | None) -> Path | None:
    """The lab a submission answers: ``forced``, else by the number that starts its name."""
    if forced:
        return forced
    m = re.match(r"(\d+)", path.name)
    if m:
        for lab in labs:
            if lab.name.startswith(m.group(1) + "_"):
                return lab
    return labs[0] if len(labs) == 1 else None


def _fail(message: str) -> int:
    print(f"grade.py: {message}", file=sys.stderr)
    return 2


def _parse(argv: list[str]):
    parser = argparse.ArgumentParser(description="Grade lab submissions (see the module docstring).")
    parser.add_argument("submissions", help="folder with one file per submission")
    parser.add_argument("--out", default="results.csv", help="CSV of the results (default results.csv)")
    parser.add_argument("--feedback", help="folder for per-submission feedback (default: <out>-feedback/)")
    parser.add_argument("--lab", help="the lab every submission answers (default: by file name)")
    parser.add_argument("--labs", default=str(ROOT / "labs"), help="folder of lab sources (labs/*.md)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds of cell execution per notebook (default 900)")
    parser.add_argument("--memory-gb", type=float, default=12,
                        help="memory of each sandbox, GiB (default 12; 0: none)")
    parser.add_argument("--max-procs", type=int, default=64, help="processes per sandbox (default 64)")
    parser.add_argument("--limits", default="auto", choices=("auto", "cgroup", "polled"),
                        help="how limits are enforced: a cgroup if possible (auto), only a cgroup, or "
                             "per-process rlimits plus the grader's accounting (polled)")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)), help="OMP threads each")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Grade a folder of submissions; returns the exit status (0, 2 for bad input, 128+N when
    stopped by signal N after writing the rows finished so far)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(int(argv[1]))
    args = _parse(argv)
    folder = Path(args.submissions)
    if not folder.is_dir():
        return _fail(f"{folder}: SUBMISSIONS_DIR is not a folder")
    forced = Path(args.lab).resolve() if args.lab else None
    if forced and (not forced.is_file() or forced.suffix != ".md"):
        return _fail(f"--lab {args.lab}: no such lab source (.md)")
    for name, value, low in (("--timeout", args.timeout, 1), ("--max-procs", args.max_procs, 4),
                             ("--jobs", args.jobs, 1), ("--threads", args.threads, 1)):
        if value < low:
            return _fail(f"{name} must be at least {low}, got {value}")
    if args.memory_gb < 0:
        return _fail(f"--memory-gb must be 0 (no limit) or positive, got {args.memory_gb}")
    out = Path(args.out).resolve()
    if not out.parent.is_dir():
        return _fail(f"--out {args.out}: its folder does not exist")
    if out.is_relative_to(folder.resolve()):
        return _fail(f"--out {args.out}: inside SUBMISSIONS_DIR")
    feedback = Path(args.feedback).resolve() if args.feedback else out.with_name(out.stem + "-feedback")
    labs = sorted(Path(args.labs).resolve().glob("*.md"))
    # read everything first: what runs later changes no row
    entries = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        entries.append((path.name, data, find_lab(path, labs, forced)))
    used = sorted({e[2] for e in entries if e[2]})
    parts = {lab: exercises_of(lab) for lab in used}
    width = max((len(v) for v in parts.values()), default=0)
    os.environ.pop("PERFLAB_GRADE_LOG", None)          # the grader's own checks never write a ledger
    _, ceilings_path = _perflab()
    scratch_root = ROOT / ".cache" / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="perflab-grade-", dir=scratch_root))
    os.chmod(staging, 0o700)
    try:
        sandbox = sandboxing.detect(args.limits, hide=[ROOT], scratch=staging / "trial")
    except sandboxing.SandboxUnavailable as err:
        shutil.rmtree(staging, ignore_errors=True)
        return _fail(f"cannot grade untrusted code: {err}")
    run = Run(args, sandbox, build_student_tree(used, staging / "tree", ceilings_path()), staging)
    print(sandbox.describe(), flush=True)
    from perflab.core.progress import progress

    stopped: list[int] = []

    def stop(signum, frame):
        stopped.append(signum)
        run.stopping.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, stop)
    rows: list[dict] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(grade_one, name, data, lab, run) for name, data, lab in entries]
            for fut in progress(futures, "grading", enabled=not args.no_progress):
                row = fut.result()
                if row["status"] == "interrupted":
                    continue
                lab_parts = next((p for lab, p in parts.items() if lab.stem == row["lab"]), {})
                finish(row, lab_parts)
                write_feedback(row, feedback)
                rows.append(row)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        second = write_results(rows, out, width)      # once, atomically; the rows finished so far
        sandbox.close()
        shutil.rmtree(staging, ignore_errors=True)
    print(render(rows, width))
    print(f"\n{len(rows)} submissions -> {out}, {second.name}, feedback in {feedback}")
    if stopped:
        print(f"grade.py: stopped by signal {stopped[0]} after {len(rows)} of {len(entries)} submissions",
              file=sys.stderr)
        return 128 + stopped[0]
    return 0


def _worker_main(fd: int) -> int:
    """The worker process: the job arrives on stdin, messages go to ``fd`` (never inherited by
    the kernel)."""
    os.set_inheritable(fd, False)
    sandboxing.die_with_parent()
    job = json.loads(sys.stdin.read())
    if os.getppid() != job["parent"]:      # the grader died before we could ask to die with it
        return 1
    out = os.fdopen(fd, "w", buffering=1)

    def send(msg: dict) -> None:
        out.write(json.dumps(msg, default=str) + "\n")

    worker(job, send)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
