"""Verdicts, decided in the grader's main process from what the worker saw: each check cell's
pass or failure, re-checked from plain data, and each row's marks and points.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import perflab.labs.exercises as exercises
import perflab.labs.lab01 as lab01
from grader.worker import first_line

MAX_DEPTH = 12


def decode_input(v: Any, depth: int = 0) -> Any:
    """A check's input as the framework wrote it to the ledger
    (:func:`perflab.labs.exercises._ledger_value`), as plain data: lists as tuples,
    ``{"f": "nan"}`` as a float, ``{"d": [[k, v], ...]}`` as a dict, ``{"s": [...]}`` as a
    frozenset.

    Raises:
        ValueError: anything else, ``{"unplain": ...}`` (an input the kernel could not convert)
            included.
    """
    if v is None or type(v) in (bool, int, float, str):
        return v
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if type(v) is list:
        return tuple(decode_input(x, depth + 1) for x in v)
    if type(v) is dict and len(v) == 1:
        (tag, x), = v.items()
        if tag == "f" and x in ("nan", "inf", "-inf"):
            return float(x)
        if tag == "d" and type(x) is list:
            return {decode_input(k, depth + 1): decode_input(y, depth + 1) for k, y in x}
        if tag == "s" and type(x) is list:
            return frozenset(decode_input(y, depth + 1) for y in x)
    raise ValueError(f"not plain data: {str(v)[:60]}")


def recheck(entry: dict) -> bool:
    """Re-run a recorded check on its recorded inputs with the grader's own copy of the check:
    True only when it passes. A malformed record, an input that is not plain data, a kind of
    check the grader does not know, or anything the re-check raises make it False: a verdict
    that cannot be re-checked outside the sandbox is not a pass."""
    try:
        raw = entry.get("inputs")
        if not isinstance(raw, dict) or "unplain" in raw:       # an answer the kernel could not convert
            return False
        i = {str(k): decode_input(v) for k, v in raw.items()}
        what = str(entry.get("what", ""))
        kind = entry.get("check")
        with contextlib.redirect_stdout(io.StringIO()):
            if kind == "close":
                exercises.check_close(i["got"], i["expected"], what, rtol=i["rtol"])
            elif kind == "choice":
                choices = i["choices"]
                exercises.check_choice(i["got"], i["expected"], what, choices=list(choices) if choices is not None else None)
            elif kind == "true":
                exercises.check_true(i["condition"] is True, what, what)
            elif kind == "ratio_at_least":
                exercises.check_ratio_at_least(i["numerator"], i["denominator"], i["minimum"], what)
            elif kind == "timer":
                lab01.check_timer(list(i["mine_s"]), list(i["library_s"]), what)
            else:
                return False
    except Exception:  # noqa: BLE001 (a hostile record may make the re-check raise anything)
        return False
    return True


def judge(cell: dict | None) -> tuple[str, list[str]]:
    """One check cell's verdict: ``("pass" | "not run" | "fail: <why>", [tampering findings])``.

    A cell passes when it ran without an error, no check it ran failed (even one whose
    :class:`~perflab.labs.exercises.ExerciseFailed` the student's code caught), every verdict it
    recorded passed and passes again when the grader re-checks it, each kind of check it calls
    unconditionally recorded at least one verdict, and its hidden tests passed in the grader.
    """
    if cell is None or not cell.get("replied", True) and not cell.get("error"):
        return "not run", []
    if cell.get("error"):
        return "fail: " + cell["error"], []
    gid = cell.get("grade_id")
    ledger = cell.get("ledger", [])
    raised = [e for e in ledger if isinstance(e, dict) and "failed" in e]
    verdicts = [e for e in ledger if isinstance(e, dict) and "check" in e]
    if raised:
        msg = first_line(f"{raised[0].get('failed')}: {raised[0].get('message', '')}")
        return "fail: " + msg, [f"{gid} raised '{msg}' but its error was not reported"]
    failed = [v for v in verdicts if v.get("passed") is not True]
    if failed:
        what = first_line(str(failed[0].get("what", "")))
        return f"fail: ✗ {what}", [f"{gid}: check '{what}' failed but its error was not reported"]
    for v in verdicts:
        if not recheck(v):
            what = first_line(str(v.get("what", "")))
            return (f"fail: ✗ {what} (re-checked by the grader)",
                    [f"{gid}: check '{what}' passed in the kernel but fails when the grader re-checks it"])
    kinds = {v.get("check") for v in verdicts}
    missing = [k for k in cell.get("checks", []) if k not in kinds]
    if missing:
        return "fail: its checks did not run", [f"{gid} reported success but its check_{missing[0]} did not run"]
    if cell.get("hidden_error"):
        return "fail: " + first_line(cell["hidden_error"]), []
    return "pass", []


def finish(row: dict, parts: dict[str, list[tuple[str, float]]]) -> dict:
    """Judge every check cell of a row; set its marks, points and (for tampering) its status."""
    by_id = {c["grade_id"]: c for c in row["cells"] if isinstance(c, dict) and c.get("grade_id")}
    marks, detail, measured, points, total = {}, {}, {}, 0.0, 0.0
    scored: dict[str, tuple[float, float]] = {}
    tamper = [str(t) for t in row["tamper"]]
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
                if isinstance(entry, dict) and "what" in entry and "value" in entry and "check" not in entry:
                    value = entry["value"]
                    if type(value) in (int, float, str, bool):
                        measured[f"ex{ex}: {first_line(str(entry['what']), 120)}"] = value
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


def error_row(name: str, lab: str, parts: dict[str, list[tuple[str, float]]], why: str) -> dict:
    """The row of a submission whose grading raised: status ``error``, no points, the reason."""
    row = {"submission": name, "lab": lab, "status": "error", "note": first_line(why, 300), "cells": [],
           "tamper": [], "seconds": 0.0, "peak_bytes": 0, "executed": None, "load": 0.0}
    finish(row, parts)
    row["status"], row["note"] = "error", first_line(why, 300)
    return row

