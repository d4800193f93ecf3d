"""What the grader writes: the two CSV files (once, atomically), a feedback folder per
submission, and the summary table it prints. Every string a submission could have shaped is
written as valid UTF-8 (a lone surrogate becomes ``\\ud800``), so no row can stop the others
from being written.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from grader.notebooks import exercise_of


def clean(value: Any) -> str:
    """``value`` as text that encodes to UTF-8 (lone surrogates escaped, NUL removed)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "")


def feedback_folders(names: list[str]) -> dict[str, str]:
    """{submission name: its feedback folder's name}, one folder per submission.

    A name made only of letters, digits, ``.``, ``_`` and ``-`` (not starting with ``.``) is its
    own folder; any other name, and a name that equals an earlier folder but for case, gets
    its safe form with 8 hex digits of its hash (``pair a.ipynb`` -> ``pair_a.ipynb-1f2e3d4c``),
    so ``pair a.ipynb`` and ``pair_a.ipynb`` never share a folder.
    """
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:100] or "submission"
        if safe != name or safe.casefold() in used:
            safe = f"{safe}-{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
        used.add(safe.casefold())
        out[name] = safe
    return out


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
        lines.append(clean(f"{r['submission'][:24]:24s} {r['lab'][:14]:14s} {r['status'][:19]:19s} {pts:>7s}  "
                           + " ".join(f"{m:>2s}" for m in marks) + f"  {r['note'][:70]}").rstrip())
    lines.append("✓ pass  ½ partial  ✗ fail  … not done yet  · not run")
    return "\n".join(lines)


def _atomic_csv(path: Path, fields: list[str], records: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows([{k: clean(v) for k, v in rec.items()} for rec in records])
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
              + [f"ex{i + 1}" for i in range(width)] + ["measured", "feedback"])
    records, per_ex = [], []
    for r in rows:
        s = r["summary"]
        rec = {"submission": r["submission"], "lab": r["lab"], "status": r["status"], "points": s["points"],
               "max_points": s["max_points"], "seconds": f"{r['seconds']:.1f}",
               "peak_memory_gib": f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "",
               "load": f"{r['load']:.1f}", "note": r["note"],
               "measured": json.dumps(s["measured"], sort_keys=True), "feedback": r.get("feedback", "")}
        for i, (ex, mark) in enumerate(list(s["marks"].items())[:width]):
            rec[f"ex{i + 1}"] = mark
        records.append(rec)
        for ex, mark in s["marks"].items():
            parts = {gid: v for gid, v in s["parts"].items() if exercise_of(gid) == ex}
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


def write_feedback(row: dict, folder: Path) -> None:
    """``folder/<row["feedback"]>/``: ``feedback.txt`` and ``executed.ipynb`` (if the kernel ran)."""
    s = row["summary"]
    target = folder / row["feedback"]
    target.mkdir(parents=True, exist_ok=True)
    lines = [f"{row['submission']}: {row['lab']}, {row['status']}, {s['points']:g}/{s['max_points']:g} points",
             *([row["note"]] if row["note"] else []), ""]
    by_id = {c["grade_id"]: c for c in row["cells"] if isinstance(c, dict) and c.get("grade_id")}
    for ex, mark in s["marks"].items():
        lines.append(f"Exercise {ex}: {mark}")
        for gid, verdict in s["parts"].items():
            if exercise_of(gid) != ex:
                continue
            cell = by_id.get(gid) or {}
            msgs = [ln for ln in str(cell.get("text", "")).splitlines() if ln.startswith(("✓", "✗"))]
            lines += [f"  {gid}: {verdict}"] + [f"    {m}" for m in msgs[:20]]
    if s["tamper"]:
        lines += ["", "Tampering seen (for a human to look at):"] + [f"  - {t}" for t in s["tamper"]]
    (target / "feedback.txt").write_text(clean("\n".join(lines) + "\n"), encoding="utf-8")
    if row.get("executed"):
        (target / "executed.ipynb").write_text(clean(row["executed"]), encoding="utf-8")
