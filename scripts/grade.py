#!/usr/bin/env python3
"""Grade lab submissions: each executed in its own process, with limits, against the instructor's checks.

    python scripts/grade.py SUBMISSIONS_DIR --out results.csv
    python scripts/grade.py SUBMISSIONS_DIR --lab labs/01_roofline.md --timeout 600 --memory-gb 16

Every file in ``SUBMISSIONS_DIR`` is one submission (``alice.ipynb``, ``01_roofline-bob.ipynb``).
Its lab is ``--lab`` if given, else the lab whose number starts the file name (``01_...``), else
the lab whose nbgrader ``grade_id`` set matches the notebook's. For each submission the grader:

1. builds the notebook to run from the **instructor's** lab: every cell comes from the lab
   source (``labs/NN_*.md``: set-up, checks with their hidden tests, closing cells) except the
   solution cells (nbgrader ``solution: true``), which come from the submission by ``grade_id``
   (a missing one is the student stub). Code cells the student added are kept after the
   solution cell they followed. So an edited or deleted check cell changes nothing: checks are
   re-inserted, never trusted;
2. runs it in a fresh worker process (its own session and process group) with a fresh kernel
   (nbclient), in a scratch directory of its own that holds only that submission and the lab's
   reference notebook; the worker gets the submission's bytes only when its turn comes, so no
   submission can read or delete another, and results are written only by this process at the
   end. Limits: ``RLIMIT_AS`` (``--memory-gb``), ``RLIMIT_CPU`` and a wall-clock limit
   (``--timeout``), ``RLIMIT_FSIZE``, no core files, and a process count (``--max-procs``):
   ``RLIMIT_NPROC`` is per user and ignored for root, so the grader also counts every process
   the submission started (by an environment token and by parentage, with this process as the
   child subreaper) and kills them all when the count or the time is exceeded, and after the
   notebook ends;
3. records, per exercise (``grade_id`` ``exN-...``), pass / fail with the first line of the
   failure, the points, and the numbers the checks measured (``perflab.labs.exercises.record``:
   ratios, times), and prints a summary table.

A submission that crashes, hangs, fills memory, forks, deletes files, edits its checks or is
not a notebook is reported in its own row (``status``); the batch goes on.

Limits of the isolation: the kernel runs as the same user as the grader. As root (as in a
container) nothing stops a submission from reading or writing files it can name; run the grader
as an unprivileged user or in a container holding only what it needs, and keep ``--jobs 1``
(the default) for untrusted batches, so no two submissions exist on disk at the same time.
``RLIMIT_AS`` also caps the address space a CUDA context reserves: on a GPU, raise
``--memory-gb`` (CUDA reserves far more address space than it uses) or pass 0 to disable it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import ctypes
import json
import os
import re
import resource
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

MAX_SUBMISSION_BYTES = 64 * 2**20
_EXERCISE = re.compile(r"ex(?:ercise)?[-_ ]?(\d+)", re.I)


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
    followed in the submission (an unlabeled cell whose text is none of the lab's is one the student
added; an edited copy of an instructor cell counts as added, and runs after the original).
Returns a new notebook.
    """
    import copy

    import make_student

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
        if gid in solution_ids:
            theirs.setdefault(gid, cell.get("source", ""))
            anchor = gid
        elif gid not in known and cell.get("source", "").strip() not in instructor_sources:
            extra.setdefault(anchor, []).append(cell.get("source", ""))
    nb = copy.deepcopy(instructor)
    cells = []
    from nbformat.v4 import new_code_cell

    for src in extra.get(None, []):
        cells.append(new_code_cell(src))
    for cell in nb.cells:
        gid = _nbgrader(cell).get("grade_id")
        if cell.cell_type == "code" and gid in solution_ids:
            cell.source = theirs.get(gid, make_student.strip_code(cell.source, make_student.exercise_number(gid)))
            cells.append(cell)
            cells.extend(new_code_cell(src) for src in extra.get(gid, []))
        else:
            cells.append(cell)
    nb.cells = cells
    return nb


def _first_line(text: str, limit: int = 160) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text or "").strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# The worker: one submission, in its own process
# ---------------------------------------------------------------------------------------------

def worker(job: dict, emit=lambda cell: None) -> dict:
    """Execute one submission (see :func:`graded_notebook`) and return its result as a dict.

    ``emit(cell_result)`` is called after each cell, so that the parent keeps the results of the
    cells that ran even when it has to kill the worker.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    scratch = Path(job["scratch"])
    result = {"status": "graded", "note": "", "cells": []}
    try:
        submission = nbformat.reads(Path(job["submission"]).read_text(), as_version=4)
        nbformat.validate(submission)
    except Exception as err:  # any parse failure is the submission's, reported in its row
        return {"status": "not a notebook", "note": _first_line(f"{type(err).__name__}: {err}"), "cells": []}
    nb = graded_notebook(instructor_notebook(Path(job["lab"])), submission)
    log = Path(os.environ["PERFLAB_GRADE_LOG"])
    deadline = time.monotonic() + job["timeout"]
    client = NotebookClient(nb, timeout=job["timeout"], allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(scratch / "labs")}})
    t0 = time.monotonic()
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                client.timeout = max(1, int(deadline - time.monotonic()))
                before = log.stat().st_size if log.exists() else 0
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    result.update(status="timeout", note=f"over {job['timeout']} s (cell {index})")
                    break
                except DeadKernelError:
                    result.update(status="kernel died", note=f"in cell {index} (memory or CPU-time limit, "
                                                             "or the process exited)")
                    break
                finally:
                    measured = []
                    if log.exists() and log.stat().st_size > before:
                        with open(log) as f:
                            f.seek(before)
                            for line in f.read().splitlines():
                                try:
                                    entry = json.loads(line)
                                    measured.append((str(entry["what"]), entry["value"]))
                                except (ValueError, KeyError, TypeError):
                                    pass
                    result["cells"].append(_cell_result(cell, index, measured))
                    emit(result["cells"][-1])
    except DeadKernelError as err:
        result.update(status="kernel died", note=_first_line(str(err)))
    except Exception as err:  # the kernel would not start, or shut down badly: this row only
        if result["status"] == "graded":
            result.update(status="error", note=_first_line(f"{type(err).__name__}: {err}"))
    result["seconds"] = time.monotonic() - t0
    return result


def _cell_result(cell, index: int, measured: list) -> dict:
    error = ""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            error = _first_line(f"{out.get('ename', '')}: {out.get('evalue', '')}")
    g = _nbgrader(cell)
    return {"index": index, "grade_id": g.get("grade_id"), "grade": bool(g.get("grade")),
            "points": g.get("points", 0) if g.get("grade") else 0, "error": error, "measured": measured}


# ---------------------------------------------------------------------------------------------
# The parent: limits, process accounting, the table
# ---------------------------------------------------------------------------------------------

def _set_subreaper() -> None:
    """Orphans of a submission are re-parented to this process, so they stay countable."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _processes() -> dict[int, int]:
    """{pid: parent pid} of every process (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                table[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return table


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _has_token(pid: int, token: bytes) -> bool:
    try:
        return token in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


class Tracker:
    """The processes of one submission: descendants of its worker, or carrying its token."""

    def __init__(self, root_pid: int, token: str):
        self.root = root_pid
        self.token = f"PERFLAB_GRADE_TOKEN={token}".encode()
        self.known: set[int] = {root_pid}
        self.peak_vm = 0      # the largest VmPeak (bytes) of any of its processes seen so far

    def scan(self) -> set[int]:
        table = _processes()
        alive = {p for p in self.known if p in table}
        changed = True
        while changed:
            changed = False
            for pid, ppid in table.items():
                if pid not in alive and (ppid in alive or _has_token(pid, self.token)):
                    alive.add(pid)
                    changed = True
        self.known |= alive
        for pid in alive:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmPeak:"):
                        self.peak_vm = max(self.peak_vm, int(line.split()[1]) * 1024)
            except (OSError, ValueError, IndexError):
                pass
        return alive

    def kill_all(self) -> None:
        for _ in range(20):
            alive = self.scan()
            if not alive:
                return
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._reap()
            time.sleep(0.05)

    @staticmethod
    def _reap() -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return


def _limits(memory_gb: float, cpu_s: int, max_procs: int):
    def apply():
        os.setsid()
        if memory_gb > 0:
            nbytes = int(memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**30, 2**30))
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
    return apply


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


def _lab_files(lab: Path) -> dict[str, bytes]:
    """The lab source and its chapter's reference notebooks, read once (before any submission runs)."""
    files = {"lab.md": lab.read_bytes()}
    number = re.match(r"(\d+)", lab.name)
    if number:   # the lab's closing cell reads its chapter's reference run from ../book/
        for ref in (ROOT / "book").glob(f"{number.group(1)}_*.ipynb"):
            files["book/" + ref.name] = ref.read_bytes()
    return files


def grade_one(name: str, data: bytes, lab: Path | None, args, staging: Path,
              lab_files: dict[str, bytes] | None = None) -> dict:
    """Grade one submission (its bytes) in a fresh scratch directory and worker process."""
    row = {"submission": name, "lab": lab.stem if lab else "", "status": "", "note": "", "cells": [],
           "seconds": 0.0}
    if lab is None:
        row.update(status="unknown lab", note="name it NN_... or pass --lab")
        return row
    if len(data) > MAX_SUBMISSION_BYTES:
        row.update(status="not a notebook", note=f"{len(data) / 2**20:.0f} MiB: too large")
        return row
    scratch = Path(tempfile.mkdtemp(prefix="sub-", dir=staging))
    (scratch / "labs").mkdir()
    (scratch / "book").mkdir()
    sub = scratch / "labs" / "submission.ipynb"
    sub.write_bytes(data)
    for rel, content in (lab_files or _lab_files(lab)).items():
        (scratch / rel).write_bytes(content)
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES",
                                                         "TERM", "TZ")}
    env.update(HOME=str(scratch), PYTHONPATH=str(ROOT), PERFLAB_GRADE_TOKEN=token,
               PERFLAB_GRADE_LOG=str(scratch / "grade_log.jsonl"), MPLBACKEND="Agg",
               MPLCONFIGDIR=str(scratch / ".mpl"), JUPYTER_RUNTIME_DIR=str(scratch / ".jupyter"),
               JUPYTER_DATA_DIR=str(scratch / ".jupyter"), IPYTHONDIR=str(scratch / ".ipython"),
               TORCHINDUCTOR_CACHE_DIR=str(scratch / ".cache"), PYDEVD_DISABLE_FILE_VALIDATION="1",
               TORCH_EXTENSIONS_DIR=str(scratch / ".cache"), OMP_NUM_THREADS=str(args.threads))
    job = {"submission": str(sub), "lab": str(scratch / "lab.md"), "scratch": str(scratch),
           "timeout": args.timeout}
    read_fd, write_fd = os.pipe()
    job["fd"] = write_fd
    cpu_s = int(args.timeout * 1.5) + 30
    t0 = time.monotonic()
    nproc = args.max_procs
    if os.geteuid() != 0:   # RLIMIT_NPROC counts all of this user's processes (and root ignores it)
        nproc += sum(1 for pid in _processes() if _owner(pid) == os.geteuid())
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
                            cwd=scratch / "labs", env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_limits(args.memory_gb, cpu_s, nproc))
    os.close(write_fd)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 65536), b"")),
                              daemon=True)
    reader.start()
    tracker = Tracker(proc.pid, token)
    verdict = None
    most = 0
    while proc.poll() is None:
        alive = tracker.scan()
        most = max(most, len(alive))
        if len(alive) > args.max_procs:
            verdict = ("killed", f"started more than {args.max_procs} processes")
            break
        if time.monotonic() - t0 > args.timeout + 60:
            verdict = ("timeout", f"over {args.timeout} s (killed)")
            break
        time.sleep(0.1)
    tracker.kill_all()          # whatever is left: the worker on a verdict, forked children always
    proc.wait()
    reader.join(timeout=5)
    os.close(read_fd)
    row["seconds"] = time.monotonic() - t0
    result, streamed = None, []
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and "cell" in msg:
            streamed.append(msg["cell"])
        elif isinstance(msg, dict) and "result" in msg:
            result = msg["result"]
    limit = args.memory_gb * 2**30
    memory_hit = (limit and tracker.peak_vm >= 0.9 * limit) or any(
        c.get("error", "").startswith("MemoryError") for c in streamed)
    if memory_hit:   # the kernel may have recovered (MemoryError) or hung: the row says why either way
        verdict = ("memory limit", f"reached the {args.memory_gb:g} GiB limit (MemoryError)"
                                   + (f"; then {verdict[1]}" if verdict else "")
                                   + (f"; then {result['status']}" if result and result["status"] != "graded" else ""))
        streamed = result["cells"] if result else streamed
    if verdict:
        row.update(status=verdict[0], note=verdict[1], cells=streamed)
    elif result is None:
        row.update(status="crashed", cells=streamed,
                   note=f"the worker exited with {proc.returncode} and no result (CPU-time or file-size limit)")
    else:
        row.update(status=result["status"], note=result.get("note", ""), cells=result.get("cells", []))
    shutil.rmtree(scratch, ignore_errors=True)
    return row


def exercises_of(lab: Path) -> dict[str, tuple[list[str], float]]:
    """{exercise number: (check grade_ids, points)} of a lab, in order."""
    out: dict[str, tuple[list[str], float]] = {}
    for cell in instructor_notebook(lab).cells:
        g = _nbgrader(cell)
        if g.get("grade"):
            m = _EXERCISE.search(g.get("grade_id", ""))
            key = m.group(1) if m else g.get("grade_id", "?")
            ids, pts = out.get(key, ([], 0.0))
            out[key] = (ids + [g["grade_id"]], pts + float(g.get("points", 0)))
    return out


def summarize(row: dict, lab_exercises: dict) -> dict:
    """Per exercise: "pass", "fail: <first line>", or "not run"; the points; measured numbers."""
    by_id = {c["grade_id"]: c for c in row["cells"] if c.get("grade_id")}
    marks, measured, points, total = {}, {}, 0.0, 0.0
    for ex, (ids, pts) in lab_exercises.items():
        total += pts
        errors = []
        for gid in ids:
            cell = by_id.get(gid)
            if cell is None:
                errors.append("not run")
            elif cell["error"]:
                errors.append(cell["error"])
            for what, value in (cell or {}).get("measured", []):
                measured[f"ex{ex}: {what}"] = value
        if not errors:
            marks[ex] = "pass"
            points += pts
        else:
            marks[ex] = "not run" if errors[0] == "not run" else "fail: " + errors[0]
    return {"marks": marks, "points": points, "max_points": total, "measured": measured}


def _mark_symbol(mark: str) -> str:
    if mark == "pass":
        return "✓"
    if mark == "not run":
        return "·"
    return "…" if "is not done yet" in mark else "✗"


def render(rows: list[dict], width: int) -> str:
    """The summary table printed at the end (✓ pass, ✗ fail, … not done, · not run)."""
    head = f"{'submission':24s} {'lab':14s} {'status':14s} {'points':>9s}  " + " ".join(
        f"{i + 1:>2d}" for i in range(width)) + "  note"
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["summary"]
        marks = [_mark_symbol(s["marks"][k]) for k in s["marks"]] + [" "] * (width - len(s["marks"]))
        pts = f"{s['points']:g}/{s['max_points']:g}" if s["max_points"] else "—"
        lines.append(f"{r['submission'][:24]:24s} {r['lab'][:14]:14s} {r['status'][:14]:14s} {pts:>9s}  "
                     + " ".join(f"{m:>2s}" for m in marks) + f"  {r['note'][:60]}")
    lines.append("✓ pass  ✗ fail  … not done yet  · not run")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path, width: int) -> None:
    fields = (["submission", "lab", "status", "points", "max_points", "seconds", "note"]
              + [f"ex{i + 1}" for i in range(width)] + ["measured"])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            s = r["summary"]
            rec = {"submission": r["submission"], "lab": r["lab"], "status": r["status"],
                   "points": s["points"], "max_points": s["max_points"], "seconds": f"{r['seconds']:.1f}",
                   "note": r["note"], "measured": json.dumps(s["measured"], sort_keys=True)}
            for i, (ex, mark) in enumerate(s["marks"].items()):
                rec[f"ex{i + 1}"] = mark
            w.writerow(rec)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        job = json.loads(argv[1])
        out = os.fdopen(job["fd"], "w", buffering=1)

        def emit(cell: dict) -> None:
            out.write(json.dumps({"cell": cell}) + "\n")

        result = worker(job, emit)
        out.write(json.dumps({"result": result}) + "\n")
        out.close()
        return 0
    parser = argparse.ArgumentParser(description="Grade lab submissions (see the module docstring).")
    parser.add_argument("submissions", help="folder with one file per submission")
    parser.add_argument("--out", default="results.csv", help="CSV of the results (default results.csv)")
    parser.add_argument("--lab", help="the lab every submission answers (default: by file name)")
    parser.add_argument("--labs", default=str(ROOT / "labs"), help="folder of lab sources (labs/*.md)")
    parser.add_argument("--timeout", type=int, default=900, help="wall seconds per notebook (default 900)")
    parser.add_argument("--memory-gb", type=float, default=12, help="RLIMIT_AS per submission, GiB (0: none)")
    parser.add_argument("--max-procs", type=int, default=64, help="processes per submission (default 64)")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)), help="OMP threads each")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    folder = Path(args.submissions)
    if not folder.is_dir():
        print(f"grade.py: {folder}: not a folder", file=sys.stderr)
        return 2
    forced = Path(args.lab) if args.lab else None
    if forced and not forced.exists():
        print(f"grade.py: {forced}: no such lab", file=sys.stderr)
        return 2
    labs = sorted(Path(args.labs).glob("*.md"))
    # read everything first: what a submission deletes later changes no other row
    entries = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        data = path.read_bytes() if path.is_file() else b""
        entries.append((path.name, data, find_lab(path, labs, forced)))
    used = sorted({e[2] for e in entries if e[2]})
    lab_exercises = {lab: exercises_of(lab) for lab in used}
    files = {lab: _lab_files(lab) for lab in used}
    width = max((len(v) for v in lab_exercises.values()), default=0)
    out = Path(args.out).resolve()
    _set_subreaper()
    from perflab.core.progress import progress

    staging = Path(tempfile.mkdtemp(prefix="perflab-grade-"))
    os.chmod(staging, 0o700)
    rows: list[dict] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(grade_one, name, data, lab, args, staging, files.get(lab)) for name, data, lab in entries]
            for fut in progress(futures, "grading", enabled=not args.no_progress):
                rows.append(fut.result())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for row in rows:
        row["summary"] = summarize(row, lab_exercises.get(next((lab for lab in lab_exercises
                                                                if lab.stem == row["lab"]), None), {}))
    write_csv(rows, out, width)
    print(render(rows, width))
    print(f"\n{len(rows)} submissions -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
