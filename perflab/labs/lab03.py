"""Lab 3's checks: strides, what a custom autograd Function keeps for backward, a loop without
synchronizations, and the CPU saving a fast path must show.

Strides are judged in the check's own scope; a Function's graph must keep nothing outside
``save_for_backward`` (however it would keep it); a training loop is judged on the very call
that was counted for synchronizations.

Each check takes the student's answer (converted to plain data) before it computes what it
compares with, so nothing the student's code can read holds the expected value at the time
it runs.
"""

from __future__ import annotations

import gc
import inspect
import math
import os
import tracemalloc
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from perflab.core.validate import number
from perflab.internals.autograd import SavedTensor, SavedTensors
from perflab.internals.hostsync import count_host_syncs, sync_debug_warnings
from perflab.internals.tensors import view_or_copy
from perflab.labs.exercises import (ExerciseFailed, NotPlain, as_tensor, check_choice, check_true,
                                    plain)

__all__ = ["STRIDE_EXPRESSIONS", "check_function_class", "check_strides", "graph_keeps", "hidden_keeps", "hidden_ctx_tensors",
           "required_cpu_saving", "run_counting_syncs", "silu_gradient"]


# ---------------------------------------------------------------------------------------------
# Exercise 1


#: exercise 1's expressions of ``x``, as the lab lists them (the check asks about these)
STRIDE_EXPRESSIONS = ("x.transpose(1, 2)", "x[:, 1]", "x[1:, ::2, 1:4]", "x[..., None]",
                      "x.unsqueeze(1).expand(3, 2, 4, 5)", "x[[0, 2]]", "x.permute(2, 0, 1).reshape(5, 12)",
                      "x.transpose(0, 1).reshape(12, 5)")


def check_strides(answers: Any, expressions: Any = STRIDE_EXPRESSIONS) -> None:
    """Exercise 1: for each of :data:`STRIDE_EXPRESSIONS` of ``x = torch.arange(60.0).reshape(3,
    4, 5)``, the strides of its result and whether it is a ``"view"`` of ``x`` or a ``"copy"``.

    ``answers`` maps each expression to ``(strides, "view" or "copy")``; it is converted to plain
    data first (:func:`perflab.labs.exercises.plain`), and only then does the check evaluate each
    expression on a fresh ``x`` of its own, in this function's scope. ``expressions`` is the
    notebook's list, which must still be the lab's (a list emptied by the student's code would
    otherwise ask nothing).

    Raises:
        ExerciseFailed: answers that are not plain data, a list of expressions that is not the
            lab's, a missing expression, wrong strides or kind (one sentence, naming the
            expression).
    """
    try:
        mine = plain(answers)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ answers must map each expression to (strides, \"view\" or \"copy\") "
                             f"as plain data (tuples, numbers, strings), got {err}.") from None
    try:
        exprs = plain(expressions)
    except NotPlain:
        exprs = None
    if exprs != STRIDE_EXPRESSIONS:
        raise ExerciseFailed("✗ expressions is no longer the lab's list of eight expressions: run the "
                             "cell that defines it again, and leave it as it is.")
    if not isinstance(mine, dict):
        raise ExerciseFailed(f"✗ answers must be a dict {{expression: (strides, kind)}}, got {type(answers).__name__}.")
    missing = sorted(set(exprs) - set(mine))
    check_true(not missing, "you answered every expression.", f"answers has no entry for: {missing}.")
    for expr in exprs:
        entry = mine[expr]
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise ExerciseFailed(f"✗ answers[{expr!r}] must be (strides, \"view\" or \"copy\"), got {entry!r:.80}.")
        strides, kind = entry
        x = torch.arange(60.0).reshape(3, 4, 5)

        def run(t, expr=expr):
            return eval(expr, {"x": t})

        result = run(x)
        check_choice(strides, tuple(result.stride()), f"strides of {expr}",
                     hint=f"its shape is {tuple(result.shape)}; count the elements of x's storage "
                          "one step along each dimension")
        check_choice(kind, view_or_copy(run, x), f"view or copy: {expr}", choices=["view", "copy"],
                     hint="can new metadata over x's storage describe it?")


# ---------------------------------------------------------------------------------------------
# Exercise 3


def check_function_class(cls: Any) -> None:
    """Exercise 3's structure: ``cls`` is a class deriving from ``torch.autograd.Function`` that
    defines its own ``forward`` and ``backward`` and keeps ``Function.apply`` (so that calling
    ``cls.apply`` runs them, through autograd's own node).

    Raises:
        ExerciseFailed: anything else (a plain class with ``apply = staticmethod(F.silu)``, a
            Function that overrides ``apply``, one without its own backward).
    """
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        raise ExerciseFailed(f"✗ SiLU must be a class deriving from torch.autograd.Function, got "
                             f"{cls.__name__ if isinstance(cls, type) else type(cls).__name__}.")
    mine = [k for k in type.mro(cls) if not (getattr(k, "__module__", "") or "").startswith("torch")
            and k is not object]
    if any("apply" in vars(k) for k in mine):
        raise ExerciseFailed("✗ SiLU overrides apply: keep torch.autograd.Function's apply, which runs "
                             "your forward and records your backward.")
    for name in ("forward", "backward"):
        if not any(name in vars(k) for k in mine):
            raise ExerciseFailed(f"✗ SiLU must define its own {name} (a @staticmethod).")


class _Made(TorchDispatchMode):
    """Every tensor an operation produced while active, as weak references."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[weakref.ref, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.refs.append((weakref.ref(t), str(getattr(func, "__name__", func)).split(".")[0]))
        return out


def graph_keeps(cls: Any, x: torch.Tensor, fresh: bool = True, seed: int | None = None) -> dict[str, Any]:
    """What one call ``cls.apply(input)`` keeps for its backward, however it keeps it.

    The input has ``x``'s shape, dtype and device: fresh random values (``fresh``, the default;
    ``seed`` for the generator), else ``x``'s own values. The forward runs with
    ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook records each tensor saved through
    ``ctx.save_for_backward`` and keeps a copy of it for the backward, under a dispatch mode that
    notes every tensor the forward makes, and under ``tracemalloc``. Then every tensor the forward
    made or received that is still alive, the output and the input included, is overwritten with
    NaN, and the backward runs on the copies: a backward that reads anything else than what went
    through ``save_for_backward`` (a tensor kept on ``ctx``, in a list or a dict there, in a
    global, a closure, a module or class attribute) gets NaN, and its gradient is wrong.

    Returns a dict of plain data and tensors: ``input`` (the values used), ``output`` (the
    call's output), ``gradient`` (d sum(output) / d input, or None when the backward raised:
    ``error``), ``saved_bytes`` and ``saved_count`` (distinct storage bytes and number of tensors
    saved through ``save_for_backward``), ``kept`` (the operations whose outputs, made in the
    forward, were still alive afterwards outside ``save_for_backward``: a tensor kept somewhere
    else), ``python_bytes`` (memory the forward allocated for Python objects and still held: a
    copy of a tensor's data outside tensors, as a list or a numpy array) and ``node`` (whether
    the output's ``grad_fn`` is ``cls``'s own backward node).

    Raises:
        ExerciseFailed: ``cls`` is not an ``autograd.Function`` of the student's own
            (:func:`check_function_class`).
    """
    check_function_class(cls)
    like = as_tensor("the input", x)
    if fresh:
        g = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(7), "little"))
        values = torch.randn(tuple(like.shape), generator=g, dtype=torch.float64).to(like.dtype).to(like.device)
    else:
        values = like
    # a warm-up, untraced: the first use of the dispatch mode and of the student's code imports
    # modules, which under tracemalloc would be slow and count as the forward's memory
    _graph_keeps(cls, values.reshape(-1)[:8].clone(), trace=False)
    return _graph_keeps(cls, values)


#: allocations a kernel's other threads make meanwhile (its messages, its history): not the forward's
_OTHER_THREADS = [tracemalloc.Filter(False, pattern) for pattern in (
    "*/zmq/*", "*/ipykernel/*", "*/jupyter_client/*", "*/tornado/*", "*/asyncio/*", "*/threading.py",
    "*/IPython/*", "*/selectors.py", "*/socket.py", "*/traitlets/*", "*/tracemalloc.py", "*/weakref.py")]
#: the least Python memory :func:`hidden_keeps` calls a copy of the data (a quarter of the input
#: above it): the forward's own bookkeeping is a few kB
_MIN_PYTHON_COPY = 32 * 2**10


def _graph_keeps(cls: Any, values: torch.Tensor, trace: bool = True) -> dict[str, Any]:
    nbytes = values.numel() * values.element_size()
    base = values.clone().requires_grad_(True)
    inp = base * 1                                  # not a leaf: autograd itself keeps no reference to it
    found: list[SavedTensor] = []
    copies: list[weakref.ref] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        found.append(SavedTensor(tuple(t.shape), t.dtype, t.numel() * t.element_size(), storage.nbytes(),
                                 storage.data_ptr(), storage.data_ptr() == inp.untyped_storage().data_ptr()))
        with _disable_current_modes():
            copy = t.detach().clone()
        copies.append(weakref.ref(copy))
        return copy

    made = _Made()
    tracing = tracemalloc.is_tracing()
    if trace and not tracing:
        tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces(_OTHER_THREADS) if trace else None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), made:
            y = cls.apply(inp)
        gc.collect()
        python_bytes = 0
        if trace:
            after = tracemalloc.take_snapshot().filter_traces(_OTHER_THREADS)
            python_bytes = max(0, sum(d.size_diff for d in after.compare_to(before, "filename")))
    finally:
        if trace and not tracing:
            tracemalloc.stop()
    if not isinstance(y, torch.Tensor):
        raise ExerciseFailed(f"✗ SiLU.apply must return a tensor, got {type(y).__name__}.")
    node = type(y.grad_fn) is getattr(cls, "_backward_cls", None)
    output = y.detach().clone()
    ours = {id(r()) for r in copies if r() is not None}
    alive = []
    for ref, op in made.refs:
        t = ref()
        if t is not None and t is not y and id(t) not in ours:
            alive.append((t, op))
    kept = [op for t, op in alive]
    with torch.no_grad():
        for t in [inp, base, y] + [t for t, _ in alive]:
            if t.is_floating_point():
                t.data.fill_(math.nan)
    del alive
    gradient, error = None, ""
    try:
        (g,) = torch.autograd.grad(y, base, torch.ones_like(output))
        gradient = g.detach().clone()
    except Exception as err:  # the student's backward raised (on NaN input, say): say what
        error = f"{type(err).__name__}: {err}"[:300]
    saved = SavedTensors(tuple(found), None)
    return {"input": values.detach().clone(), "output": output, "gradient": gradient, "error": error,
            "saved_bytes": saved.bytes, "saved_count": saved.count, "kept": kept,
            "python_bytes": int(python_bytes), "node": bool(node), "input_bytes": int(nbytes)}


def silu_gradient(cls: Any, x: torch.Tensor) -> torch.Tensor:
    """d sum(cls.apply(x)) / dx at ``x``'s values (a detached tensor), for the hidden tests."""
    check_function_class(cls)
    x = as_tensor("x", x).requires_grad_(True)
    (g,) = torch.autograd.grad(cls.apply(x).sum(), x)
    return as_tensor("the gradient", g)


def _silu_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def hidden_keeps(kept: dict, values: torch.Tensor | None = None) -> list[str]:
    """What :func:`graph_keeps` saw kept for backward outside ``save_for_backward``, one phrase
    each (empty when nothing): tensors made in the forward still alive, a gradient that changed
    when everything but the saved copies was overwritten (so the backward read something else),
    Python memory the forward held (a quarter of the input's bytes, at least 32 KiB), an output whose
    ``grad_fn`` is not the Function's own node.

    ``values``: the input the caller chose (the grader's hidden test), else ``kept["input"]``.
    The expected gradient is computed here, after the student's code ran.
    """
    out = []
    if not kept.get("node"):
        out.append("its output's grad_fn is not its own backward node")
    if kept.get("kept"):
        ops = Counter(kept["kept"])
        out.append(f"{sum(ops.values())} tensor(s) made in forward still alive outside save_for_backward "
                   f"({', '.join(f'{op} x{n}' for op, n in sorted(ops.items()))})")
    x = as_tensor("the input", values if values is not None else kept["input"], torch.float64, "cpu")
    g = kept.get("gradient")
    if g is None:
        out.append(f"its backward failed once the tensors kept outside save_for_backward were overwritten "
                   f"({kept.get('error') or 'no gradient'})")
    else:
        mine = as_tensor("the gradient", g, torch.float64, "cpu")
        want = _silu_derivative(x)
        if mine.shape != want.shape or not torch.allclose(mine, want, rtol=1e-3, atol=1e-4):
            out.append("its backward reads a tensor that did not go through save_for_backward (with "
                       "everything else overwritten, the gradient changed)")
    if kept.get("python_bytes", 0) >= max(_MIN_PYTHON_COPY, kept.get("input_bytes", 0) // 4):
        out.append(f"its forward holds {kept['python_bytes']:,} bytes of Python objects (a copy of a "
                   "tensor's data outside tensors)")
    return out


def hidden_ctx_tensors(output: Any) -> list[str]:
    """Tensors a custom ``autograd.Function`` kept as ``ctx`` attributes instead of saving them.

    ``ctx.s = torch.sigmoid(x)`` keeps ``s`` alive until backward just as
    ``ctx.save_for_backward(s)`` does, but ``saved_tensors_hooks`` (and so
    :func:`perflab.internals.autograd.saved_tensors`) never see it. ``output`` is the Function's output;
    its ``grad_fn`` is the ``ctx`` object. Returns the attribute names holding tensors (also
    inside lists, tuples and dicts), empty when there are none or ``output`` has no ``grad_fn``.
    This sees only ``ctx``'s own attributes; :func:`graph_keeps` sees every way of keeping one.
    """
    ctx = getattr(output, "grad_fn", None)
    names = []
    for name, value in (getattr(ctx, "__dict__", None) or {}).items():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.Tensor) for v in values):
            names.append(name)
    return names


# ---------------------------------------------------------------------------------------------
# Exercise 4

#: words in a loop's source that switch off what counts its synchronizations
_UNWATCHED = ("DisableTorchFunction", "_disable_current_modes", "set_sync_debug_mode", "_pop_mode",
              "_set_torch_function_mode", "torch._C._disabled")


def run_counting_syncs(fn: Callable, *args: Any, device: torch.device | str) -> tuple[Any, dict[str, int]]:
    """``fn(*args)`` with its synchronizations counted on the very call whose result is used.

    On a GPU, ``torch.cuda.set_sync_debug_mode("warn")``
    (:func:`perflab.internals.hostsync.sync_debug_warnings`) counts every synchronizing CUDA
    call, by the line that made it; on a CPU, :func:`perflab.internals.hostsync.count_host_syncs`
    counts the calls that would synchronize on a GPU, by name. Returns ``(fn's result,
    {where or what: count})``, empty when it never synchronizes.

    Raises:
        ExerciseFailed: ``fn``'s source switches off what counts (a torch function mode or the
            sync debug mode), or leaves the sync debug mode off.
    """
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    bad = [w for w in _UNWATCHED if w in source]
    if bad:
        raise ExerciseFailed(f"✗ {getattr(fn, '__name__', 'your loop')} switches off what counts its "
                             f"synchronizations ({bad[0]}): the check must see every call.")
    if torch.device(device).type == "cuda":
        out, warns = sync_debug_warnings(fn, *args)
        counts = Counter(f"line {w.lineno}: {w.line}" for w in warns)
    else:
        out, counts = count_host_syncs(fn, *args)
    return out, dict(counts)


def required_cpu_saving(fast_issue_s: float, fast_total_s: float, target: float = 1.5,
                        min_lead: float = 1.2) -> float | None:
    """The CPU-time ratio (slow loop / fast loop) to require of a loop that stopped synchronizing.

    A loop that never synchronizes returns after the host has issued its work (``fast_issue_s``)
    while the device finishes later (``fast_total_s``); a loop that synchronizes every step holds
    the CPU until the device is done, about ``fast_total_s`` or more. So the most the CPU can win
    is the *lead* ``fast_total_s / fast_issue_s``. When the device's work per step is short next
    to the host's issue time (a fast GPU behind a slow host, small kernels), the lead is near 1
    and there is nothing to win: this returns None (no requirement). Otherwise it returns half
    of the possible gain, at most ``target``: ``min(target, 1 + (lead - 1) / 2)``, so that noise
    cannot fail a right answer on any host/GPU balance. (A loop that still synchronizes has a
    lead near 1 too; the synchronization count, checked first, rejects it.)

    Raises:
        ValueError: a time is not positive, or ``target`` / ``min_lead`` is not above 1.
    """
    number("fast_issue_s", fast_issue_s, above=0)
    number("fast_total_s", fast_total_s, above=0)
    number("target", target, above=1)
    number("min_lead", min_lead, above=1)
    lead = fast_total_s / fast_issue_s
    if lead < min_lead:
        return None
    return min(target, 1 + (lead - 1) / 2)
