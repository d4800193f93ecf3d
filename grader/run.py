"""One grading run: the student tree every sandbox sees, and each submission graded by a worker
of its own in a sandbox of its own, under its limits, as its job slot's uid (one uid per
submission graded at once, :func:`grader.sandbox.claim_uids`; a slot's uid passes to the next
submission once no process runs as it any more, :func:`grader.sandbox.reclaim`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nbformat

from grader import ROOT
from grader import sandbox as sandboxing
from grader.notebooks import make_student
from grader.worker import STARTUP_S

MAX_SUBMISSION_BYTES = 64 * 2**20
_SIGNALS = {9: "SIGKILL", 11: "SIGSEGV", 6: "SIGABRT", 24: "SIGXCPU: the CPU-time limit",
            25: "SIGXFSZ: the file-size limit", 15: "SIGTERM", 7: "SIGBUS"}
#: what the start-up check imports in a sandbox built like a submission's
STARTUP_IMPORTS = "import ipykernel_launcher, torch, perflab.labs.exercises; print('kernel can start')"


def build_student_tree(labs: list[Path], dest: Path, ceilings: Path | None) -> Path:
    """Write the read-only tree every sandbox sees at ``/course`` and return ``dest``.

    It holds the ``perflab`` package (with its data), the student edition of each lab in
    ``labs`` (``make_student``: no solutions, no hidden tests), the reference chapters and files
    those labs read from ``../book/``, the instructor's measured ceilings (``ceilings``, if the
    file exists) and an empty ``.tools`` mount point when the clone has tools. No lab source,
    reference lab notebook, submission, grader or ``.git``.
    """
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


class Run:
    """What all submissions of one grading run share: arguments, sandbox, student tree, staging."""

    def __init__(self, args, sandbox: sandboxing.Sandbox, tree: Path, staging: Path):
        self.args, self.sandbox, self.tree, self.staging = args, sandbox, tree, staging
        self.stopping = threading.Event()
        self.count = 0
        self.lock = threading.Lock()
        self.slots: queue.Queue[int] = queue.Queue()      # the job slots' uids not in use now
        for uid in sandbox.uids:
            self.slots.put(uid)

    def extra_ro(self) -> list[list[str]]:
        """Read-only binds beside the tree: the clone's tools, when it has them."""
        return [[str(ROOT / ".tools"), sandboxing.TREE + "/.tools"]] if (self.tree / ".tools").is_dir() else []


def sandbox_env(run: Run, token: str) -> dict[str, str]:
    """The whole environment of a sandbox (its kernel and everything it starts)."""
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


def worker_env(scratch: Path) -> dict[str, str]:
    """The worker's environment: the grader's, with every scratch setting inside ``scratch``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_GRADE")}
    for name, sub in (("TMPDIR", "tmp"), ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                      ("MPLCONFIGDIR", "matplotlib"), ("XDG_CACHE_HOME", "xdg"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("TRITON_CACHE_DIR", "triton"), ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
                      ("JUPYTER_DATA_DIR", "jupyter_data")):
        (scratch / sub).mkdir(exist_ok=True)
        env[name] = str(scratch / sub)
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""       # the hidden tests in the worker compute on its CPU
    return env


def startup_check(run: Run, timeout: float = 300) -> str | None:
    """Start the kernel's Python in a sandbox built like a submission's (same binds, user,
    environment) and import what a kernel needs (:data:`STARTUP_IMPORTS`). None when it works,
    else one line saying why not (a Python environment the sandbox cannot reach, say)."""
    scratch = run.staging / "startup"
    ipc = scratch / "ipc"
    ipc.mkdir(parents=True, mode=0o700)
    uid = run.sandbox.uids[0]
    if os.geteuid() == 0:
        os.chown(ipc, uid, uid)
    try:
        argv = sandboxing.command(run.sandbox, tree=run.tree, ipc=ipc, env=sandbox_env(run, uuid.uuid4().hex),
                                  argv=[sys.executable, "-c", STARTUP_IMPORTS], size_bytes=2**30, uid=uid,
                                  hide=[ROOT], extra_ro=[tuple(p) for p in run.extra_ro()])
        got = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except sandboxing.SandboxUnavailable as err:
        return str(err)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the sandbox could not run {sys.executable}: {type(err).__name__}: {err}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if got.returncode != 0 or "kernel can start" not in got.stdout:
        why = (got.stderr.strip().splitlines() or [f"exit status {got.returncode}"])[-1]
        return f"{sys.executable} cannot start a kernel in the sandbox ({why[:200]})"
    return None


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
                except (ValueError, RecursionError):
                    continue
                if isinstance(msg, dict):
                    if "started" in msg:
                        self.started = time.monotonic()
                    self.messages.append(msg)

    def close(self) -> None:
        self.thread.join(timeout=5)
        os.close(self.fd)


def blank_row(name: str, lab: Path | None) -> dict:
    """A submission's row before it is graded."""
    return {"submission": name, "lab": lab.stem if lab else "", "status": "", "note": "", "cells": [],
            "tamper": [], "seconds": 0.0, "peak_bytes": 0, "executed": None, "load": os.getloadavg()[0]}


def grade_one(name: str, data: bytes | None, lab: Path | None, run: Run, kind: str = "file") -> dict:
    """Grade one submission (its bytes; ``kind`` says when the entry was no file) in a fresh
    sandbox; returns its row (before judging)."""
    row = blank_row(name, lab)
    if kind != "file":
        row.update(status="not a notebook", note=f"{kind}, not a notebook file")
        return row
    if lab is None:
        row.update(status="unknown lab", note="name it NN_... or pass --lab")
        return row
    if len(data) > MAX_SUBMISSION_BYTES:
        row.update(status="not a notebook", note=f"over {MAX_SUBMISSION_BYTES // 2**20} MiB: too large")
        return row
    if run.stopping.is_set():
        row.update(status="interrupted")
        return row
    with run.lock:
        run.count += 1
        number = run.count
    scratch = run.staging / f"sub-{number}"
    scratch.mkdir(mode=0o700)
    uid = run.slots.get()           # at most --jobs submissions run at once: one is always free
    try:
        return _grade_in_sandbox(row, data, lab, run, scratch, number, uid)
    finally:
        if run.sandbox.privileged:
            sandboxing.reclaim(uid)
        run.slots.put(uid)
        shutil.rmtree(scratch, ignore_errors=True)


def _grade_in_sandbox(row: dict, data: bytes, lab: Path, run: Run, scratch: Path, number: int, uid: int) -> dict:
    args = run.args
    ipc = scratch / "ipc"
    ipc.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(ipc, uid, uid)
    (scratch / "submission.ipynb").write_bytes(data)
    token = uuid.uuid4().hex
    memory = int(args.memory_gb * 2**30)
    limits = sandboxing.Limits(run.sandbox, f"sub-{number}", memory, args.max_procs,
                               int(args.timeout * 1.5) + 30, uid=uid)
    box = run.sandbox
    job = {"submission": str(scratch / "submission.ipynb"), "lab": str(lab), "ipc": str(ipc),
           "executed": str(scratch / "executed.ipynb"), "tree": str(run.tree), "timeout": args.timeout,
           "env": sandbox_env(run, token), "procs_files": limits.procs_files(), "rlimits": limits.rlimits(),
           "uid": uid, "nproc_inside": limits.nproc_inside,
           "tmpfs_bytes": memory or 8 * 2**30, "hide": [str(ROOT)], "parent": os.getpid(),
           "extra_ro": run.extra_ro(),
           "sandbox": {"bwrap": box.bwrap, "privileged": box.privileged, "limits": box.limits,
                       "setpriv": box.setpriv, "prlimit": box.prlimit, "uids": [uid]}}
    read_fd, write_fd = os.pipe()
    t0 = time.monotonic()
    with open(scratch / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "grader.worker", str(write_fd)],
                                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,),
                                cwd=ipc, env=worker_env(scratch), start_new_session=True)
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
    tracker.close()
    proc.wait()
    inbox.close()
    use = limits.usage()
    limits.close()
    row["seconds"] = time.monotonic() - t0
    row["peak_bytes"] = use["peak_bytes"]
    done = None
    for msg in inbox.messages:
        if isinstance(msg.get("cell"), dict):
            row["cells"].append(msg["cell"])
        elif isinstance(msg.get("tamper"), list):
            row["tamper"] += [str(t) for t in msg["tamper"]]
        elif isinstance(msg.get("done"), dict):
            done = msg["done"]
    if (scratch / "executed.ipynb").exists():
        row["executed"] = (scratch / "executed.ipynb").read_text(errors="replace")
    memory_error = any(str(c.get("error", "")).startswith("MemoryError") for c in row["cells"])
    last = row["cells"][-1].get("index") if row["cells"] else None
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
    elif done.get("status") == "kernel died":
        code = done.get("kernel_exit")
        if isinstance(code, int) and (code > 128 or code < 0):
            sig = code - 128 if code > 128 else -code
            label = _SIGNALS.get(sig, signal.Signals(sig).name if sig in signal.valid_signals() else "?")
            row.update(status=f"killed by signal {sig}", note=f"{label}, {done.get('note', '')}")
        else:
            row.update(status="crashed", note=f"the kernel exited with code {code}, {done.get('note', '')}")
    else:
        row.update(status=str(done.get("status", "error")), note=str(done.get("note", "")))
    return row


def find_lab(name: str, labs: list[Path], forced: Path | None) -> Path | None:
    """The lab a submission answers: ``forced``, else by the number that starts its name."""
    if forced:
        return forced
    m = re.match(r"(\d+)", name)
    if m:
        for lab in labs:
            if lab.name.startswith(m.group(1) + "_"):
                return lab
    return labs[0] if len(labs) == 1 else None


def read_entries(folder: Path, labs: list[Path], forced: Path | None) -> list[tuple[str, bytes | None, Path | None, str]]:
    """Every entry of the submissions folder, read now: ``(name, bytes, lab, kind)``, ``kind``
    ``"file"`` for a regular file, else what it is (``"a folder"``, ``"a symbolic link"``, ...).
    Dotfiles included: each entry gets a row."""
    entries = []
    for path in sorted(folder.iterdir(), key=lambda p: p.name):
        if path.is_symlink():
            kind, data = "a symbolic link", None
        elif path.is_dir():
            kind, data = "a folder", None
        elif path.is_file():
            with open(path, "rb") as f:                 # a huge file is refused, not read whole
                kind, data = "file", f.read(MAX_SUBMISSION_BYTES + 1)
        else:
            kind, data = "a special file", None
        entries.append((path.name, data, find_lab(path.name, labs, forced), kind))
    return entries
