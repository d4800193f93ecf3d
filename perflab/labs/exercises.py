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
a traceback.

Under the grader (``scripts/grade.py``) the environment variable ``PERFLAB_GRADE_LOG`` names the
*ledger*, a pipe the grader reads, and this module appends one JSON object per line to it: what
a check measured (:func:`record`), each check's verdict with the inputs it compared (so that the
grader can re-check the comparison outside the student's process), and every
:class:`ExerciseFailed` when it is created (so that a failure the student's code swallowed is
still seen). Outside the grader nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from perflab.record.numbers import fmt


__all__ = ["answer_or_none", "check_choice", "check_close", "check_ratio_at_least", "check_true",
           "ExerciseFailed", "ExerciseNotDone", "lab_needs", "not_done", "overlay_table", "record",
           "reference_devices", "require", "short_errors"]


class ExerciseFailed(AssertionError):
    """An exercise's answer is wrong; the message says what and, where possible, why.

    Creating one appends ``{"failed": <class name>, "message": ...}`` to the grader's ledger
    (see the module docstring), whether or not it is then raised and caught.
    """

    def __init__(self, *args: Any):
        super().__init__(*args)
        _ledger({"failed": type(self).__name__, "message": str(args[0])[:500] if args else ""})


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


def _ledger(entry: dict[str, Any]) -> None:
    """Append ``entry`` as one JSON line to ``$PERFLAB_GRADE_LOG`` (the grader's ledger), if set."""
    path = os.environ.get("PERFLAB_GRADE_LOG")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data (numbers, strings, booleans, None, short lists), else its ``repr``
    wrapped as ``{"repr": ...}`` (which the grader does not try to re-check)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"repr": repr(value)}
    if isinstance(value, (list, tuple)) and len(value) <= 1000 and depth < 3:
        return [_plain(v, depth + 1) for v in value]
    return {"repr": repr(value)[:200]}


def _verdict(check: str, what: str, passed: bool, **inputs: Any) -> None:
    """Append a check's verdict and the inputs it compared to the grader's ledger."""
    _ledger({"check": check, "what": what, "passed": bool(passed),
             "inputs": {k: _plain(v) for k, v in inputs.items()}})


def record(what: str, value: Any) -> None:
    """Append ``{"what": what, "value": value}`` to the grader's ledger (``$PERFLAB_GRADE_LOG``).

    The grader collects these as each exercise's measured numbers; outside the grader this does
    nothing. Values that are not JSON numbers, strings or booleans are stored as their ``repr``.
    """
    if not isinstance(value, (int, float, str, bool)) or isinstance(value, float) and not math.isfinite(value):
        value = repr(value)
    _ledger({"what": what, "value": value})


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
    """A number in a check's sentence, as a person writes it (four significant digits, no
    scientific notation: ``137.4B``, ``0.0042``)."""
    if isinstance(x, float) and math.isfinite(x):
        return fmt(x, sig=4)
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
    passed = math.isclose(g, e, rel_tol=rtol, abs_tol=0.0 if e else 1e-12)
    _verdict("close", what, passed, got=g, expected=e, rtol=rtol)
    if passed:
        print(f"✓ {what}: {_fmt(g)} is right.")
        return True
    off = _ratio(g / e) if e else "infinitely many times"
    msg = f"✗ {what}: got {_fmt(g)}, expected {_fmt(e)} (±{rtol:.0%}); yours is {off}x the answer."
    raise ExerciseFailed(msg + (f" Hint: {hint}" if hint else ""))


def check_choice(got: Any, expected: Any, what: str, choices: Iterable[Any] | None = None, hint: str = "") -> bool:
    """Pass when ``got == expected``; ``choices`` (if given) lists the valid answers.

    Raises:
        ExerciseFailed: wrong answer, or one that is not among ``choices``.
    """
    choices = list(choices) if choices is not None else None
    valid = choices is None or got in choices
    passed = valid and bool(got == expected)
    _verdict("choice", what, passed, got=got, expected=expected, choices=choices)
    if not valid:
        raise ExerciseFailed(f"✗ {what}: {got!r} is not one of {choices}.")
    if passed:
        print(f"✓ {what}: {got!r} is right.")
        return True
    raise ExerciseFailed(f"✗ {what}: got {got!r}, expected {expected!r}." + (f" Hint: {hint}" if hint else ""))


def check_true(condition: bool, passed: str, failed: str) -> bool:
    """Pass when ``condition`` holds; print ``passed`` or raise with ``failed`` (one sentence each).

    Raises:
        ExerciseFailed: ``condition`` is false.
    """
    _verdict("true", passed, bool(condition), condition=bool(condition))
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
    _verdict("ratio_at_least", what, ratio >= minimum, numerator=n, denominator=d, minimum=minimum)
    if ratio >= minimum:
        print(f"✓ {what}: ratio {_ratio(ratio)} ≥ {_ratio(minimum)}.")
        return True
    raise ExerciseFailed(f"✗ {what}: ratio {_ratio(ratio)} is below the required {_ratio(minimum)}.")


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
    """A ratio with three significant digits, never rounded to a bare zero (``<0.0001``)."""
    return fmt(q, sig=3)


_NO_HEADER = object()


def overlay_table(rows: Iterable[tuple[str, float | None, float | None, str]],
                  reference_run: Any = _NO_HEADER) -> str:
    """A plain-text table of ``(quantity, yours, reference, unit)`` with the ratio yours/reference.

    Missing values print as ``—``; values keep four significant digits and ratios three, written
    by :func:`perflab.record.numbers.fmt` (``0.0042``, ``137.4B``; never ``0.00`` or ``4.2e-03``).
    Returns the table as a string (print it).

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
        m = "—" if mine is None else fmt(mine, sig=4)
        r = "—" if ref is None else fmt(ref, sig=4)
        q = "—" if (mine is None or not ref) else _ratio(mine / ref)
        lines.append(f"{name:38s} {m:>12s} {r:>12s} {q:>8s}  {unit}")
    return "\n".join(lines)
