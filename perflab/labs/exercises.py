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

Answers cross as plain data. Every check first converts the student's answer with
:func:`plain` (or :func:`as_float`, :func:`as_bool`, :func:`as_tensor`) into a value of a type it
expects, built from the answer's stored value and never by calling the answer's own methods: an
object whose ``__eq__`` is always true, or whose ``__float__`` looks for the expected value up
the stack, is refused with one sentence before the check computes or compares anything.

Under the grader (``scripts/grade.py``, the ``grader`` package) the environment variable
``PERFLAB_GRADE_LOG`` names the *ledger*, a pipe the grader reads, and this module appends one
JSON object per line to it: what a check measured (:func:`record`), each check's verdict with
the plain inputs it compared (so that the grader can re-check the comparison outside the
student's process), and every :class:`ExerciseFailed` when it is created (so that a failure the
student's code swallowed is still seen). Outside the grader nothing is written. The grader runs
a lab's hidden tests in its own process; :func:`in_kernel` marks the calls in them that must run
in the student's kernel.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

from perflab.record.numbers import fmt


__all__ = ["NotPlain", "answer_or_none", "as_bool", "as_float", "as_tensor", "check_choice",
           "check_close", "check_ratio_at_least", "check_true", "ExerciseFailed", "ExerciseNotDone",
           "in_kernel", "lab_needs", "not_done", "overlay_table", "plain", "record",
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


#: the most elements :func:`plain` converts in one answer (lists, tuples, dicts and sets together)
MAX_PLAIN_ITEMS = 100_000
_MAX_DEPTH = 8
# numpy's scalar types whose .item() is a Python bool, int or float
_NUMPY_SCALARS = frozenset(t for t in set(np.sctypeDict.values())
                           if isinstance(t, type) and issubclass(t, (np.bool_, np.integer, np.floating)))
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class NotPlain(ValueError):
    """An answer that is not plain data (see :func:`plain`); the message names what it is."""


def _kind(value: Any) -> str:
    return type(value).__name__


def plain(value: Any) -> Any:
    """``value`` as plain data, read from what it stores, never through its own methods.

    Plain data is ``None``, ``bool``, ``int``, ``float``, ``str``, and tuples, dicts and
    frozensets of plain data (lists become tuples, so ``[1, 2] == (1, 2)`` after conversion).
    Subclasses of these (``numpy.float64``, an ``IntEnum``, ``torch.Size``) give their stored
    value through the base type's own slot (``float.__float__(x)``, ``tuple.__iter__(x)``), so a
    subclass that overrides ``__eq__`` or ``__float__`` converts to what it holds. numpy scalars
    and one-element tensors (of type ``torch.Tensor`` exactly) give their ``.item()``. Anything
    else (an object with its own ``__eq__``, a model, a function) is not plain.

    Raises:
        NotPlain: ``value`` (or something inside it) is not plain data, is nested deeper than 8
            levels, or holds more than :data:`MAX_PLAIN_ITEMS` elements.
    """
    budget = [MAX_PLAIN_ITEMS]
    return _plain(value, 0, budget)


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if depth > _MAX_DEPTH:
        raise NotPlain(f"nested deeper than {_MAX_DEPTH} levels")
    try:
        if issubclass(t, int):                  # bool cannot be subclassed; IntEnum and the like
            return int.__int__(value)
        if issubclass(t, float):                # numpy.float64 and any float subclass
            return float.__float__(value)
        if issubclass(t, str):
            return str.__str__(value)
        if t in _NUMPY_SCALARS:
            return value.item()
        if t in _TENSOR_TYPES:
            return _plain(_tensor_item(value), depth + 1, budget)
        if t is np.ndarray:
            if np.ndarray.__len__(value.reshape(-1)) != 1:
                raise NotPlain(f"an array of shape {tuple(value.shape)}, not one value")
            return _plain(value.reshape(-1)[0].item(), depth + 1, budget)
        if issubclass(t, (tuple, list)):
            items = list(tuple.__iter__(value) if issubclass(t, tuple) else list.__iter__(value))
            budget[0] -= len(items)
            if budget[0] < 0:
                raise NotPlain(f"more than {MAX_PLAIN_ITEMS} elements")
            return tuple(_plain(v, depth + 1, budget) for v in items)
        if issubclass(t, dict):
            pairs = list(dict.items(value))
            budget[0] -= len(pairs)
            if budget[0] < 0:
                raise NotPlain(f"more than {MAX_PLAIN_ITEMS} elements")
            return {_plain(k, depth + 1, budget): _plain(v, depth + 1, budget) for k, v in pairs}
        if issubclass(t, (set, frozenset)):
            items = list(frozenset.__iter__(value) if issubclass(t, frozenset) else set.__iter__(value))
            budget[0] -= len(items)
            if budget[0] < 0:
                raise NotPlain(f"more than {MAX_PLAIN_ITEMS} elements")
            return frozenset(_plain(v, depth + 1, budget) for v in items)
    except NotPlain:
        raise
    except (TypeError, ValueError, OverflowError, RuntimeError) as err:   # a faked layout or item
        raise NotPlain(f"{_kind(value)} ({type(err).__name__})") from None
    raise NotPlain(f"{_kind(value)}")


def _tensor_item(t: torch.Tensor) -> Any:
    """The one value of ``t``, read with every torch function and dispatch mode switched off.

    Raises:
        NotPlain: ``t`` holds more or fewer than one element.
    """
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        if torch.Tensor.numel(t) != 1:
            raise NotPlain(f"a tensor of shape {tuple(torch.Tensor.size(t))}, not one value")
        return torch.Tensor.item(torch.Tensor.detach(t))


def as_float(what: str, value: Any) -> float:
    """The answer ``value`` as a finite Python float (see :func:`plain`).

    Raises:
        ExerciseFailed: no answer yet (None), a boolean, anything that is not one number, or a
            number that is not finite; the sentence names ``what``.
    """
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ {what}: no answer yet (the value is {value!r}).")
    try:
        v = plain(value)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ {what}: expected a number, got {err} (give a plain number).") from None
    if isinstance(v, bool):
        raise ExerciseFailed(f"✗ {what}: expected a number, got the boolean {v!r}.")
    if not isinstance(v, (int, float)):
        raise ExerciseFailed(f"✗ {what}: expected a number, got {type(v).__name__} {v!r:.60}.")
    try:
        v = float(v)
    except OverflowError:
        raise ExerciseFailed(f"✗ {what}: the answer is an integer too large for a float.") from None
    if not math.isfinite(v):
        raise ExerciseFailed(f"✗ {what}: the answer is {v}, not a finite number.")
    return v


def as_bool(what: str, value: Any) -> bool:
    """``value`` as a Python bool: a ``bool``, a numpy bool or a one-element bool tensor.

    Raises:
        ExerciseFailed: anything else (an object with its own ``__bool__`` included); the
            sentence names ``what``.
    """
    try:
        v = plain(value)
    except NotPlain as err:
        v = err
    if type(v) is not bool:
        raise ExerciseFailed(f"✗ {what} (the check's condition is {_kind(value)}, not True or False).")
    return v


def as_tensor(what: str, value: Any, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
    """The answer ``value`` (a ``torch.Tensor`` or numpy array) copied into a fresh contiguous
    tensor of ``dtype`` on ``device`` (default: the answer's own), with no autograd history.

    The copy is made with torch functions and dispatch modes switched off, so a tensor subclass
    or a mode the answer left active cannot change what is copied.

    Raises:
        ExerciseFailed: ``value`` is not a tensor (of type ``torch.Tensor`` or
            ``torch.nn.Parameter`` exactly) or a numpy array (``numpy.ndarray`` exactly).
    """
    t = type(value)
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        if t is np.ndarray:
            value = torch.from_numpy(np.array(value, copy=True))
        elif t not in _TENSOR_TYPES:
            raise ExerciseFailed(f"✗ {what}: expected a tensor, got {_kind(value)}.")
        src = torch.Tensor.detach(value)
        out = torch.empty(tuple(src.shape), dtype=dtype or src.dtype,
                          device=device if device is not None else src.device)
        out.copy_(src)
    return out


def _ledger_value(value: Any) -> Any:
    """A plain value as JSON: tuples as lists, non-finite floats as ``{"f": "nan"}``, dicts as
    ``{"d": [[key, value], ...]}`` and frozensets as ``{"s": [...]}`` (the grader reads them
    back with the same meaning)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"f": repr(value)}
    if isinstance(value, tuple):
        return [_ledger_value(v) for v in value]
    if isinstance(value, dict):
        return {"d": [[_ledger_value(k), _ledger_value(v)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"s": [_ledger_value(v) for v in value]}
    return value


def _verdict(check: str, what: str, passed: bool, **inputs: Any) -> None:
    """Append a check's verdict and the plain inputs it compared to the grader's ledger. An input
    that is not plain data is recorded as ``{"unplain": <type>}``, which the grader cannot
    re-check and so counts as a failure."""
    out = {}
    for k, v in inputs.items():
        try:
            out[k] = _ledger_value(plain(v))
        except NotPlain:
            out[k] = {"unplain": _kind(v)}
    _ledger({"check": check, "what": str(what), "passed": passed is True, "inputs": out})


#: set by the grader while it runs a lab's hidden tests in its own process (see :func:`in_kernel`)
_IN_KERNEL: Callable[..., Any] | None = None


def in_kernel(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, run where the student's code runs.

    In a notebook this is the call itself. The grader runs a lab's hidden tests in its own
    process, where no student code runs: there, each call to a student's function goes to the
    student's kernel and only plain data comes back, and this helper sends a whole computation
    there (``fn``, a function of perflab, with the notebook's objects as arguments: a student's
    ``autograd.Function`` differentiated in the kernel, say). The result must be plain data or
    tensors.
    """
    if _IN_KERNEL is not None:
        return _IN_KERNEL(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def record(what: str, value: Any) -> None:
    """Append ``{"what": what, "value": value}`` to the grader's ledger (``$PERFLAB_GRADE_LOG``).

    The grader collects these as each exercise's measured numbers; outside the grader this does
    nothing. A number that is not finite is stored as its ``repr`` (``"nan"``), a value that is
    not a plain number, string or boolean as the name of its type (``"<Yes>"``).
    """
    try:
        v = plain(value)
    except NotPlain:
        v = None
    if isinstance(v, float) and not math.isfinite(v):
        v = repr(v)
    elif not isinstance(v, (int, float, str, bool)):
        v = f"<{_kind(value)}>"
    _ledger({"what": str(what), "value": v})


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
    """:func:`as_float` (the name lab checks have used)."""
    return as_float(name, value)


def check_close(got: Any, expected: float, what: str, rtol: float = 0.01, hint: str | Callable = "", unit: str = "") -> bool:
    """Pass when ``got`` is within relative tolerance ``rtol`` of ``expected``.

    ``got`` is converted to a plain number first (:func:`as_float`). A failure shows both with
    the digits that tell them apart (never "got 354.8M, expected 354.8M"), the tolerance, the gap,
    and ``hint`` (what to try; or a function of got / expected that returns it, to name the mistake
    the ratio shows); ``unit`` (of :func:`perflab.record.numbers.fmt`) goes with them.

    Raises:
        ExerciseFailed: wrong, missing or non-numeric answer.
        ValueError: ``rtol`` negative.
    """
    g = as_float(what, got)
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    e = as_float(f"{what} (the expected value)", expected)
    record(what, g)
    passed = math.isclose(g, e, rel_tol=rtol, abs_tol=0.0 if e else 1e-12)
    _verdict("close", what, passed, got=g, expected=e, rtol=float(rtol))
    if passed:
        print(f"✓ {what}: {_fmt(g) if not unit else fmt(g, unit, sig=4)} is right.")
        return True
    shown_g, shown_e = _apart(g, e, unit)
    pct = fmt(rtol, "%", sig=2)
    tol = "exactly" if rtol == 0 else f"within ±{pct}" if "<" not in pct else f"within a relative {rtol:g}"
    ratio, diff = _ratio(g / e) if e else "1", g - e
    off = f"yours is {_apart(abs(diff), abs(diff), unit)[0]} {'above' if diff > 0 else 'below'} it" + (
        f" ({ratio}x the answer)" if ratio not in ("1", "1.00") else "")
    msg = f"✗ {what}: got {shown_g}, expected {shown_e} ({tol}); {off}."
    hint = (hint(g / e) if e else "") if callable(hint) else hint
    raise ExerciseFailed(msg + (f" Hint: {hint}" if hint else ""))


def _apart(a: float, b: float, unit: str = "") -> tuple[str, str]:
    """``a`` and ``b`` with the fewest digits (four at least) that tell them apart."""
    if not unit and float(a).is_integer() and float(b).is_integer() and max(abs(a), abs(b)) < 1e15:
        return f"{int(a):,}", f"{int(b):,}"
    for sig in range(4, 18):   # fmt's prefixes first, then plain digits (powers of ten)
        for sa, sb in ((fmt(a, unit, sig=sig), fmt(b, unit, sig=sig)),
                       tuple(f"{x:.{sig}g}" + (f" {unit}" if unit else "") for x in (a, b))):
            if "<" not in sa + sb and (sa != sb or a == b):
                return sa, sb
    return sa, sb


def check_choice(got: Any, expected: Any, what: str, choices: Iterable[Any] | None = None, hint: str = "") -> bool:
    """Pass when ``got == expected``; ``choices`` (if given) lists the valid answers.

    ``got`` is converted to plain data first (:func:`plain`: a number, a string, True/False, or
    tuples, dicts and sets of them; a list compares equal to the tuple of its elements), then
    ``expected`` and ``choices``; only plain data are compared.

    Raises:
        ExerciseFailed: an answer that is not plain data, wrong, or not among ``choices``.
    """
    try:
        g = plain(got)
    except NotPlain as err:
        _verdict("choice", what, False, got=None, expected=None, choices=None, unplain=_kind(got))
        raise ExerciseFailed(f"✗ {what}: the answer must be plain data (a number, a string, True or "
                             f"False, or a tuple of them), got {err}.") from None
    e = plain(expected)
    options = tuple(plain(c) for c in choices) if choices is not None else None
    valid = options is None or g in options
    passed = valid and g == e
    _verdict("choice", what, passed, got=g, expected=e, choices=options)
    if not valid:
        raise ExerciseFailed(f"✗ {what}: {g!r} is not one of {list(options)}.")
    if passed:
        print(f"✓ {what}: {g!r} is right.")
        return True
    raise ExerciseFailed(f"✗ {what}: got {g!r}, expected {e!r}." + (f" Hint: {hint}" if hint else ""))


def check_true(condition: bool, passed: str, failed: str) -> bool:
    """Pass when ``condition`` is True; print ``passed`` or raise with ``failed`` (one sentence each).

    ``condition`` must be a boolean (:func:`as_bool`: ``bool``, a numpy bool or a one-element
    bool tensor); anything else fails.

    Raises:
        ExerciseFailed: ``condition`` is false, or not a boolean.
    """
    try:
        ok = as_bool(failed, condition)
    except ExerciseFailed:
        _verdict("true", passed, False, condition=False)
        raise
    _verdict("true", passed, ok, condition=ok)
    if ok:
        print(f"✓ {passed}")
        return True
    raise ExerciseFailed(f"✗ {failed}")


def check_ratio_at_least(numerator: float, denominator: float, minimum: float, what: str) -> bool:
    """Pass when ``numerator / denominator >= minimum`` (both measured in the same run).

    Both are converted to plain numbers first (:func:`as_float`).

    Raises:
        ExerciseFailed: the ratio is below ``minimum`` or an input is not a positive number.
    """
    n = as_float(what, numerator)
    d = as_float(what, denominator)
    low = as_float(f"{what} (the required ratio)", minimum)
    if d <= 0 or n <= 0:
        raise ExerciseFailed(f"✗ {what}: both measurements must be positive, got {_fmt(n)} and {_fmt(d)}.")
    ratio = n / d
    record(what, ratio)
    _verdict("ratio_at_least", what, ratio >= low, numerator=n, denominator=d, minimum=low)
    if ratio >= low:
        print(f"✓ {what}: ratio {_ratio(ratio)} ≥ {_ratio(low)}.")
        return True
    raise ExerciseFailed(f"✗ {what}: ratio {_ratio(ratio)} is below the required {_ratio(low)}.")


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
                  reference_run: Any = _NO_HEADER, where: str | None = None, sig: int = 4) -> str:
    """A plain-text table of ``(quantity, yours, reference, unit)`` with the ratio yours/reference.

    Missing values print as ``—``; values keep ``sig`` significant digits and ratios three, written
    by :func:`perflab.record.numbers.fmt` (``0.0042``, ``137.4B``; never ``0.00`` or ``4.2e-03``).
    Returns the table as a string (print it).

    Args:
        rows: ``(quantity, yours, reference, unit)`` tuples.
        reference_run: when given (a :func:`perflab.record.provenance.reference_run` dict, or None
            when there is no reference run), the table starts with one header line naming the
            reference devices once, counted (``"reference: 2x NVIDIA H200"``), and, where the
            metadata holds them, the run's commit and start date (``", run of b8037d7 started
            2026-12-05"``: a reference read from an older notebook says so), then a blank line.
        where: what ran the reference's numbers, in the header in place of its devices (lab 8:
            gloo on the host CPU of the GPU machine); ignored without ``reference_run``.
    """
    lines = []
    if reference_run is not _NO_HEADER:
        head = f"reference: {where or reference_devices(reference_run)}"
        if reference_run and reference_run.get("git"):
            head += f", run of {str(reference_run['git'])[:7]}"
            if reference_run.get("started"):
                head += f" started {str(reference_run['started'])[:10]}"
        lines += [head, ""]
    lines.append(f"{'quantity':38s} {'yours':>12s} {'reference':>12s} {'ratio':>8s}  unit")
    for name, mine, ref, unit in rows:
        m = "—" if mine is None else fmt(mine, sig=sig)
        r = "—" if ref is None else fmt(ref, sig=sig)
        q = "—" if (mine is None or not ref) else _ratio(mine / ref)
        lines.append(f"{name:38s} {m:>12s} {r:>12s} {q:>8s}  {unit}")
    return "\n".join(lines)
