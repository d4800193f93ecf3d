"""Checks for lab exercises: each says in one sentence what passed or what is wrong.

A check prints ``"✓ <what>: ..."`` and returns True when the answer is right, and raises
:class:`ExerciseFailed` (an ``AssertionError``, so nbgrader's autograder counts it as a failed
test) with ``"✗ <what>: ..."`` otherwise. Checks of speed compare ratios measured in the same run,
never absolute times.

An exercise the student has not done yet ends in :class:`ExerciseNotDone` (a subclass of
:class:`ExerciseFailed`) whose message is one sentence, ``"Exercise N is not done yet: ..."``:
the student edition's stubs raise it (:func:`not_done`), and a check reads its inputs through
:func:`require` first so that a stub left at ``None`` gives that sentence rather than a
``TypeError``. :func:`short_errors` makes IPython show these errors as that one line, without
a traceback. When the environment variable ``PERFLAB_GRADE_LOG`` names a file, every check
appends what it measured to it as one JSON object per line (``scripts/grade.py`` reads it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable


__all__ = ["answer_or_none", "check_choice", "check_close", "check_ratio_at_least", "check_true",
           "ExerciseFailed", "ExerciseNotDone", "lab_needs", "not_done", "overlay_table", "record",
           "reference_devices", "require", "short_errors"]


class ExerciseFailed(AssertionError):
    """An exercise's answer is wrong; the message says what and, where possible, why."""


class ExerciseNotDone(ExerciseFailed):
    """An exercise has no answer yet: ``"Exercise N is not done yet: <what to do>."``."""

    def __init__(self, exercise: int | str, what: str):
        self.exercise = exercise
        what = what.rstrip(".")
        super().__init__(f"Exercise {exercise} is not done yet: {what}.")


def not_done(exercise: int | str, what: str = "write your code in place of this line") -> None:
    """Raise :class:`ExerciseNotDone` for ``exercise`` (the student edition's stubs call this).

    Raises:
        ExerciseNotDone: always.
    """
    raise ExerciseNotDone(exercise, what)


def require(exercise: int | str, **answers: Any) -> None:
    """Raise :class:`ExerciseNotDone` if any answer is still ``None`` or ``...`` (its stub value).

    ``require(3, predictions=predictions, measured=measured)``; an empty dict or list counts as
    not done too (stubs such as ``answers = {}``).

    Raises:
        ExerciseNotDone: naming the first unset answer.
    """
    for name, value in answers.items():
        if value is None or value is Ellipsis or (isinstance(value, (dict, list, tuple)) and not value):
            raise ExerciseNotDone(exercise, f"set {name} (it is still {value!r})")


def answer_or_none(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or None when it raises :class:`ExerciseNotDone` (an unfinished stub).

    For the closing cells of a lab, which show what the student has done so far: an unfinished
    exercise leaves its row empty instead of stopping the table. Any other error propagates.
    """
    try:
        return fn(*args, **kwargs)
    except ExerciseNotDone:
        return None


def record(what: str, value: Any) -> None:
    """Append ``{"what": what, "value": value}`` to the file ``$PERFLAB_GRADE_LOG`` if it is set.

    The grader collects these as each exercise's measured numbers; outside the grader this does
    nothing. Values that are not JSON numbers, strings or booleans are stored as their ``repr``.
    """
    path = os.environ.get("PERFLAB_GRADE_LOG")
    if not path:
        return
    if not isinstance(value, (int, float, str, bool)) or isinstance(value, float) and not math.isfinite(value):
        value = repr(value)
    with open(path, "a") as f:
        f.write(json.dumps({"what": what, "value": value}) + "\n")


def short_errors() -> bool:
    """In IPython, show :class:`ExerciseFailed` as its one-line message instead of a traceback.

    The cell still ends in an error (so "Run All" stops there and a grader counts a failure); the
    student sees only the sentence. Returns False (and does nothing) outside IPython.
    """
    try:
        from IPython import get_ipython  # optional: outside IPython there is nothing to set
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False

    def _one_line(shell, etype, value, tb, tb_offset=None):
        stb = [f"{etype.__name__}: {value}"]
        shell._showtraceback(etype, value, stb)
        return stb

    ip.set_custom_exc((ExerciseFailed,), _one_line)
    return True


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return repr(x)


def _number(name: str, value: Any) -> float:
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ {name}: no answer yet (the value is {value!r}).")
    if isinstance(value, bool):
        raise ExerciseFailed(f"✗ {name}: expected a number, got the boolean {value!r}.")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ExerciseFailed(f"✗ {name}: expected a number, got {type(value).__name__} {value!r}.") from None
    if not math.isfinite(v):
        raise ExerciseFailed(f"✗ {name}: the answer is {v}, not a finite number.")
    return v


def check_close(got: Any, expected: float, what: str, rtol: float = 0.01, hint: str = "") -> bool:
    """Pass when ``got`` is within relative tolerance ``rtol`` of ``expected``.

    Raises:
        ExerciseFailed: wrong, missing or non-numeric answer.
        ValueError: ``rtol`` negative.
    """
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    g = _number(what, got)
    e = float(expected)
    record(what, g)
    if math.isclose(g, e, rel_tol=rtol, abs_tol=0.0 if e else 1e-12):
        print(f"✓ {what}: {_fmt(g)} is right.")
        return True
    off = (g / e) if e else float("inf")
    msg = f"✗ {what}: got {_fmt(g)}, expected {_fmt(e)} (±{rtol:.0%}); yours is {off:.3g}x the answer."
    raise ExerciseFailed(msg + (f" Hint: {hint}" if hint else ""))


def check_choice(got: Any, expected: Any, what: str, choices: Iterable[Any] | None = None, hint: str = "") -> bool:
    """Pass when ``got == expected``; ``choices`` (if given) lists the valid answers.

    Raises:
        ExerciseFailed: wrong answer, or one that is not among ``choices``.
    """
    choices = list(choices) if choices is not None else None
    if choices is not None and got not in choices:
        raise ExerciseFailed(f"✗ {what}: {got!r} is not one of {choices}.")
    if got == expected:
        print(f"✓ {what}: {got!r} is right.")
        return True
    raise ExerciseFailed(f"✗ {what}: got {got!r}, expected {expected!r}." + (f" Hint: {hint}" if hint else ""))


def check_true(condition: bool, passed: str, failed: str) -> bool:
    """Pass when ``condition`` holds; print ``passed`` or raise with ``failed`` (one sentence each).

    Raises:
        ExerciseFailed: ``condition`` is false.
    """
    if condition:
        print(f"✓ {passed}")
        return True
    raise ExerciseFailed(f"✗ {failed}")


def check_ratio_at_least(numerator: float, denominator: float, minimum: float, what: str) -> bool:
    """Pass when ``numerator / denominator >= minimum`` (both measured in the same run).

    Raises:
        ExerciseFailed: the ratio is below ``minimum`` or an input is not a positive number.
    """
    n = _number(what, numerator)
    d = _number(what, denominator)
    if d <= 0 or n <= 0:
        raise ExerciseFailed(f"✗ {what}: both measurements must be positive, got {_fmt(n)} and {_fmt(d)}.")
    ratio = n / d
    record(what, ratio)
    if ratio >= minimum:
        print(f"✓ {what}: ratio {ratio:.3g} ≥ {minimum:.3g}.")
        return True
    raise ExerciseFailed(f"✗ {what}: ratio {ratio:.3g} is below the required {minimum:.3g}.")


def lab_needs(md: str | os.PathLike, cpu_runs: dict | None = None) -> dict[str, Any]:
    """What a lab needs, from its source, its reference run and its recorded CPU runs.

    ``md`` is the lab source (``labs/NN_topic.md``); its executed ``.ipynb`` beside it carries the
    reference run's metadata (``reference_run``: ``devices``, ``duration_s``, and, since
    ``scripts/execute.py`` records it, ``gpu_memory_peak_bytes``). ``cpu_runs`` is the content of
    ``labs/cpu_runs.json`` (``scripts/execute.py --record-cpu``), default: read beside ``md``.
    Returns a dict: ``gpus`` (0, 1 or 2: the most GPUs any cell uses; every lab also runs on a
    CPU, with smaller sizes), ``runs_on`` (a phrase), ``reference_devices``, ``reference_minutes``,
    ``gpu_memory_gib`` (None if not recorded), ``cpu_minutes``, ``cpu`` (the CPU it was timed on)
    and ``cpu_current`` (False when the lab's code changed since). Missing records are None.

    Raises:
        FileNotFoundError: ``md`` does not exist.
    """
    md = Path(md)
    text = md.read_text()
    two = "requires_gpu(2)" in text or "gpu_count() >= 2" in text
    one = two or "requires_gpu(" in text or 'pick(' in text and 'gpu=' in text
    gpus = 2 if two else 1 if one else 0
    runs_on = {0: "CPU", 1: "CPU ok; 1 GPU for full sizes",
               2: "CPU ok; 1 GPU for full sizes, 2 for the multi-GPU step"}[gpus]
    out: dict[str, Any] = {"lab": md.stem, "gpus": gpus, "runs_on": runs_on, "reference_devices": None,
                           "reference_minutes": None, "gpu_memory_gib": None, "cpu_minutes": None,
                           "cpu": None, "cpu_current": None}
    ipynb = md.with_suffix(".ipynb")
    if ipynb.exists():
        run = json.loads(ipynb.read_text()).get("metadata", {}).get("reference_run") or {}
        if run:
            out["reference_devices"] = reference_devices(run)
            if run.get("duration_s") is not None:
                out["reference_minutes"] = run["duration_s"] / 60
            if run.get("gpu_memory_peak_bytes") is not None:
                out["gpu_memory_gib"] = run["gpu_memory_peak_bytes"] / 2**30
    if cpu_runs is None:
        path = md.parent / "cpu_runs.json"
        cpu_runs = json.loads(path.read_text()) if path.exists() else {}
    entry = cpu_runs.get(md.stem)
    if entry:
        out["cpu_minutes"] = entry["duration_s"] / 60
        out["cpu"] = f"{entry.get('cpu', '?')}, {entry.get('cores', '?')} cores"
        import jupytext  # optional: only the book build and the instructor page need it

        code = [c.source for c in jupytext.read(md).cells if c.cell_type == "code"]
        joined = "\n\0\n".join(src.strip() for src in code)   # as perflab.record.provenance.code_sha256
        out["cpu_current"] = hashlib.sha256(joined.encode()).hexdigest() == entry.get("source_sha256")
    return out


def reference_devices(run: dict | None) -> str:
    """The devices of a reference run's metadata in one phrase: ``"2x NVIDIA H200"``.

    ``run`` is :func:`perflab.record.provenance.reference_run`'s dict (its ``devices`` list) or None
    (``"no reference run"``).
    """
    if not run or not run.get("devices"):
        return "no reference run"
    counts: dict[str, int] = {}
    for d in run["devices"]:
        counts[d] = counts.get(d, 0) + 1
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.items())


def _ratio(q: float) -> str:
    if q == 0:
        return "0"
    if 0.01 <= abs(q) < 1000:
        return f"{q:.3g}"
    return f"{q:.1e}"


_NO_HEADER = object()


def overlay_table(rows: Iterable[tuple[str, float | None, float | None, str]],
                  reference_run: Any = _NO_HEADER) -> str:
    """A plain-text table of ``(quantity, yours, reference, unit)`` with the ratio yours/reference.

    Missing values print as ``—``; ratios keep three significant digits (``0.0042`` prints as
    ``4.2e-03``, never as ``0.00``). Returns the table as a string (print it).

    Args:
        rows: ``(quantity, yours, reference, unit)`` tuples.
        reference_run: when given (a :func:`perflab.record.provenance.reference_run` dict, or None
            when there is no reference run), the table starts with one header line naming the
            reference devices once, counted (``"reference: 2x NVIDIA H200"``), then a blank line.
    """
    lines = []
    if reference_run is not _NO_HEADER:
        lines += [f"reference: {reference_devices(reference_run)}", ""]
    lines.append(f"{'quantity':38s} {'yours':>12s} {'reference':>12s} {'ratio':>8s}  unit")
    for name, mine, ref, unit in rows:
        m = "—" if mine is None else f"{mine:.4g}"
        r = "—" if ref is None else f"{ref:.4g}"
        q = "—" if (mine is None or not ref) else _ratio(mine / ref)
        lines.append(f"{name:38s} {m:>12s} {r:>12s} {q:>8s}  {unit}")
    return "\n".join(lines)
