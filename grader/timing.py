"""How long a class takes to grade: a measured run, recorded for the instructor page.

    python -m grader.timing --lab labs/03_internals.md --copies 10 --jobs 2

grades a class of ``3 x copies`` submissions of one lab (by default 30): ``copies`` of the
reference solution, ``copies`` of the student edition (every exercise stopped at its first
line) and ``copies`` of the reference with a cell added that replaces a check function (it runs
every cell and is flagged), with the grader's own command line, and records in
``labs/grading_runs.json`` how long it took, on which machine and under which load. The
instructor page shows the record (``{grading-time}``, ``_ext/lab_needs.py``): nothing typed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from grader import ROOT

RECORD = ROOT / "labs" / "grading_runs.json"

#: the cell the "tampering" copies add after their first solution
TAMPER = "import perflab.labs.exercises as _E\n_E.check_true = lambda *a, **k: True"


def class_of(lab: Path, copies: int) -> dict[str, str]:
    """``{file name: notebook text}``: ``copies`` each of the reference, the student edition
    and the reference with :data:`TAMPER` added after its first solution cell."""
    import nbformat  # the grader's own dependencies, loaded when a class is graded (the book
    from grader.notebooks import instructor_notebook, make_student  # build reads describe only)

    reference = instructor_notebook(lab)
    student = make_student.student_notebook(lab)
    tampered = nbformat.from_dict(json.loads(nbformat.writes(reference)))
    first = next(i for i, c in enumerate(tampered.cells)
                 if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    tampered.cells.insert(first + 1, nbformat.v4.new_code_cell(TAMPER))
    out = {}
    for i in range(copies):
        out[f"{lab.stem[:2]}_reference_{i:02d}.ipynb"] = nbformat.writes(reference)
        out[f"{lab.stem[:2]}_student_{i:02d}.ipynb"] = nbformat.writes(student)
        out[f"{lab.stem[:2]}_tampered_{i:02d}.ipynb"] = nbformat.writes(tampered)
    return out


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(lab: Path, copies: int, jobs: int, threads: int, timeout: int, memory_gb: float) -> dict:
    """Grade :func:`class_of` ``lab`` once and return the record (see the module docstring).

    Raises:
        RuntimeError: the grader refused to run or exited with an error.
    """
    from grader import cli  # the whole grader (see class_of)

    (ROOT / ".cache" / "tmp").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="grading-time-", dir=ROOT / ".cache" / "tmp"))
    try:
        folder = scratch / "class"
        folder.mkdir()
        for name, text in class_of(lab, copies).items():
            (folder / name).write_text(text)
        out = scratch / "results.csv"
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        rc = cli.main([str(folder), "--out", str(out), "--lab", str(lab), "--jobs", str(jobs),
                       "--threads", str(threads), "--timeout", str(timeout), "--memory-gb", str(memory_gb),
                       "--no-progress"])
        seconds = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"the grader exited with status {rc}")
        with open(out) as f:
            rows = list(csv.DictReader(f))
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        per_kind, points = {}, {}
        for kind in ("reference", "student", "tampered"):
            mine = [r for r in rows if f"_{kind}_" in r["submission"]]
            times = sorted(float(r["seconds"]) for r in mine)
            per_kind[kind] = times[len(times) // 2] if times else None
            got = sorted(float(r["points"]) for r in mine)
            points[kind] = [got[0], got[-1], float(mine[0]["max_points"])] if mine else None
        return {"lab": lab.stem, "submissions": len(rows), "jobs": jobs, "threads": threads,
                "seconds": round(seconds, 1), "median_seconds_by_kind": per_kind, "statuses": statuses,
                "points_by_kind": points,
                "cpu": _cpu(), "cores": os.cpu_count(), "load_before": round(load, 2),
                "load_after": round(os.getloadavg()[0], 2),
                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def describe(record: dict) -> str:
    """One sentence for the instructor page from a record of :func:`measure`."""
    k = record.get("median_seconds_by_kind") or {}
    parts = ", ".join(f"{name} {k[name]:.0f} s" for name in ("reference", "student", "tampered") if k.get(name))
    pts = record.get("points_by_kind") or {}
    scored = "; ".join(f"{name} {p[0]:g}" + (f"-{p[1]:g}" if p[1] != p[0] else "") + f"/{p[2]:g} points"
                       for name, p in pts.items() if p)
    return (f"{record['submissions']} submissions of {record['lab']} took {record['seconds'] / 60:.1f} min with "
            f"--jobs {record['jobs']} --threads {record['threads']} on {record['cpu']} ({record['cores']} cores, "
            f"load average {record['load_before']:.1f} before, {record['load_after']:.1f} after; "
            f"{record['date']}); median per submission: {parts}" + (f" ({scored})" if scored else "") + ".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default=str(ROOT / "labs" / "03_internals.md"))
    parser.add_argument("--copies", type=int, default=10, help="of each kind (default 10: a class of 30)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--memory-gb", type=float, default=4)
    parser.add_argument("--record", default=str(RECORD), help="the JSON file to add the record to")
    args = parser.parse_args(argv)
    record = measure(Path(args.lab).resolve(), args.copies, args.jobs, args.threads, args.timeout, args.memory_gb)
    path = Path(args.record)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[record["lab"]] = record
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(describe(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
