"""The grader's command line (``python scripts/grade.py`` or ``python -m grader``): arguments,
the start-up checks, the run over every submission, the results. See :mod:`grader`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from perflab.core.progress import progress
from perflab.record.ceilings import default_path

from grader import ROOT
from grader import results as results_
from grader import run as runs
from grader import sandbox as sandboxing
from grader.notebooks import exercises_of
from grader.verdicts import error_row, finish


def _fail(message: str) -> int:
    print(f"grade.py: {message}", file=sys.stderr)
    return 2


def _parse(argv: list[str]):
    parser = argparse.ArgumentParser(prog="grade.py", description="Grade lab submissions (see the grader package's docstring).")
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


def _grade_safely(name: str, data, lab, run: runs.Run, kind: str) -> dict:
    """:func:`grader.run.grade_one`, with anything it raises turned into this row's error."""
    try:
        return runs.grade_one(name, data, lab, run, kind)
    except Exception as err:  # noqa: BLE001 (one submission's failure must not cost the others)
        traceback.print_exc(file=sys.stderr)
        row = runs.blank_row(name, lab)
        row.update(status="error", note=f"the grader failed on this submission: {type(err).__name__}: {err}")
        row["grader_error"] = True
        return row


def main(argv: list[str] | None = None) -> int:
    """Grade a folder of submissions; returns the exit status (0; 2 for bad input or a machine
    where no kernel can start in the sandbox; 128+N when stopped by signal N after writing the
    rows finished so far)."""
    argv = sys.argv[1:] if argv is None else argv
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
    entries = runs.read_entries(folder, labs, forced)
    used = sorted({e[2] for e in entries if e[2]})
    try:
        parts = {lab: exercises_of(lab) for lab in used}
    except Exception as err:  # a lab source that is not a notebook: the instructor's to fix
        return _fail(f"a lab source cannot be read: {type(err).__name__}: {err}")
    width = max((len(v) for v in parts.values()), default=0)
    folders = results_.feedback_folders([e[0] for e in entries])
    os.environ.pop("PERFLAB_GRADE_LOG", None)          # the grader's own checks never write a ledger
    scratch_root = ROOT / ".cache" / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="perflab-grade-", dir=scratch_root))
    os.chmod(staging, 0o700)
    try:
        sandbox = sandboxing.detect(args.limits, hide=[ROOT], scratch=staging / "trial", jobs=args.jobs)
    except sandboxing.SandboxUnavailable as err:
        shutil.rmtree(staging, ignore_errors=True)
        return _fail(f"cannot grade untrusted code: {err}")
    try:
        run = runs.Run(args, sandbox, runs.build_student_tree(used, staging / "tree", default_path()), staging)
        why = runs.startup_check(run) if any(e[3] == "file" and e[2] for e in entries) else None
    except BaseException:
        sandbox.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if why:
        sandbox.close()
        shutil.rmtree(staging, ignore_errors=True)
        return _fail(f"cannot start a kernel in the sandbox: {why}")
    print(sandbox.describe(), flush=True)

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
            futures = [pool.submit(_grade_safely, name, data, lab, run, kind) for name, data, lab, kind in entries]
            for (name, _, lab, _), fut in zip(entries, progress(futures, "grading", enabled=not args.no_progress)):
                row = fut.result()
                if row["status"] == "interrupted":
                    continue
                lab_parts = parts.get(lab, {}) if lab else {}
                try:
                    finish(row, lab_parts)
                    row["feedback"] = folders[name]
                    results_.write_feedback(row, feedback)
                except Exception as err:  # noqa: BLE001 (this row only)
                    traceback.print_exc(file=sys.stderr)
                    row = error_row(name, lab.stem if lab else "", lab_parts,
                                    f"the grader failed on this submission: {type(err).__name__}: {err}")
                    row["feedback"] = folders[name]
                    try:
                        results_.write_feedback(row, feedback)
                    except Exception:  # noqa: BLE001 (its feedback is lost, its row is not)
                        traceback.print_exc(file=sys.stderr)
                if row.get("grader_error"):
                    print(f"grade.py: the grader failed on {name!r}: {row['note']}", file=sys.stderr)
                rows.append(row)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        second = results_.write_results(rows, out, width)      # once, atomically; the rows finished so far
        sandbox.close()
        shutil.rmtree(staging, ignore_errors=True)
    print(results_.render(rows, width))
    print(f"\n{len(rows)} submissions -> {out}, {second.name}, feedback in {feedback}")
    if stopped:
        print(f"grade.py: stopped by signal {stopped[0]} after {len(rows)} of {len(entries)} submissions",
              file=sys.stderr)
        return 128 + stopped[0]
    return 0
