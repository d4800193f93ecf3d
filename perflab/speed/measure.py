"""What chapter 6 measures a step with, each usable on a CPU: operators, loop time, copy overlap, logs.

* :func:`op_count`: the operators a step dispatches (the unit of its host cost);
* :func:`op_kinds`: the same operators by kind (multi-tensor, on a GPU tensor, on the CPU alone),
  whose host costs differ;
* :func:`kernel_names`: the GPU kernels one call runs, by name, from the profiler;
* :func:`wall_time`: synchronized wall-clock time of a loop, as a training loop runs it;
* :func:`profile_overlap`: how much of the host-to-device copy time a profiler trace shows
  running under a kernel (the interval arithmetic is :mod:`perflab.core.profiler`'s);
* :func:`graph_replay_semantics`: what a CUDA graph replays and what it does not;
* :func:`capture_logs`: ``torch._logging`` output (for example why ``torch.compile`` skipped
  CUDA graphs) returned as text instead of written to stderr.

The techniques themselves (the prefetcher, BN folding, the CUDA-graph step, the ladder's loop)
are written on chapter 6's page; the page exports the ones later pages reuse (the generated
modules :mod:`perflab.speed.overlap`, :mod:`perflab.speed.fusion` and :mod:`perflab.speed.graphs`).
Units: seconds.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from perflab.core.profiler import overlap_fraction, trace_events, trace_intervals
from perflab.core.timing import seconds_per_call
from perflab.core.validate import number

__all__ = ["op_count", "op_kinds", "kernel_names", "profile_overlap", "capture_logs",
           "graph_replay_semantics", "wall_time"]


def op_count(fn: Callable[[], object]) -> int:
    """The ATen operators one call of ``fn()`` dispatches: forward, backward (the autograd engine's
    threads inherit the counting mode) and optimizer alike, views and copies included.

    Each costs the host a dispatch (and on a GPU, most a kernel launch), so for a step whose
    kernels are short this count times the host's cost per operator is the step's time. Call
    ``fn`` once before (optimizer state, cuDNN's choices) so the count is a steady step's.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    return sum(op_kinds(fn).values())


class _KindCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts = {"foreach": 0, "device": 0, "cpu": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[_kind(func, args, kwargs or {})] += 1
        return func(*args, **(kwargs or {}))


def _kind(func, args, kwargs) -> str:
    if func.__name__.startswith("_foreach_"):
        return "foreach"
    found = []

    def visit(a):
        if isinstance(a, torch.Tensor):
            found.append(a.device.type)
        elif isinstance(a, (list, tuple)):
            for b in a:
                visit(b)
    visit(list(args) + list(kwargs.values()))
    return "device" if any(t != "cpu" for t in found) else "cpu"


def op_kinds(fn: Callable[[], object]) -> dict[str, int]:
    """The operators one call of ``fn()`` dispatches (as :func:`op_count` counts them), by kind:
    ``{"foreach": multi-tensor operators (``_foreach_*``, one per list of tensors),
    "device": other operators with a tensor argument off the CPU (on a GPU, each a launch),
    "cpu": operators on CPU tensors alone (a CPU step counter, its ``.item()``)}``.

    Their host costs differ: a multi-tensor operator parses its lists and launches a kernel per
    chunk of tensors, an operator on a one-element CPU tensor launches nothing. On a machine
    without a GPU every operator that is not multi-tensor is ``"cpu"``.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with _KindCounter() as counter:
        fn()
    return dict(counter.counts)


def kernel_names(fn: Callable[[], object], calls: int = 2) -> dict[str, float]:
    """The GPU kernels one call of ``fn()`` runs: ``{kernel name: launches per call}``.

    ``fn`` runs once unprofiled (cuDNN's and cuBLAS's choices, lazy initialisation), then
    ``calls`` times under torch.profiler; the device events that are not memory copies or sets
    are the kernels, in the order first seen. What a count of kernels cannot say, the names
    do: which of them is the convolution, a layout conversion, a bias addition.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: ``calls`` < 1.
    """
    number("calls", calls, minimum=1)
    if not torch.cuda.is_available():
        raise RuntimeError("kernel_names needs a CUDA GPU; this machine has none")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    names: dict[str, float] = {}
    for e in prof.events():
        if (e.device_type == torch.autograd.DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset", "[memory]"))):
            names[e.name] = names.get(e.name, 0.0) + 1 / calls
    return names


def profile_overlap(fn: Callable[[], object]) -> tuple[float, int, int]:
    """Profile ``fn()`` on the GPU and return ``(overlap fraction, copies, kernels)``.

    The trace is read back with :func:`perflab.core.profiler.trace_events` and
    :func:`perflab.core.profiler.trace_intervals`; the fraction is
    :func:`perflab.core.profiler.overlap_fraction`.

    Raises:
        RuntimeError: no CUDA GPU, or the trace holds no host-to-device copy.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("profile_overlap needs a CUDA GPU")

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    copies, kernels = trace_intervals(trace_events(prof))
    if not copies:
        raise RuntimeError("the trace holds no host-to-device copy")
    return overlap_fraction(copies, kernels), len(copies), len(kernels)


def capture_logs(fn: Callable[[], Any], **set_logs: Any) -> tuple[Any, str]:
    """Run ``fn()`` with ``torch._logging.set_logs(**set_logs)`` and return ``(result, log text)``.

    ``torch._logging`` writes through ``logging.StreamHandler`` objects bound to ``sys.stderr``
    when ``set_logs`` installs them; installing them while stderr is redirected to a buffer
    binds them to the buffer, so the log can be printed in a notebook cell as text (nothing goes
    to stderr); anything else ``fn`` writes to stderr is returned too. Logging is reset to the
    defaults afterwards, even when ``fn`` raises.
    Example: ``capture_logs(run, perf_hints=True, cudagraphs=True)`` shows why
    ``torch.compile(mode="reduce-overhead")`` skipped CUDA graphs.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            torch._logging.set_logs(**set_logs)
            out = fn()
    finally:
        torch._logging.set_logs()             # outside the redirect: defaults go to stderr
    return out, buf.getvalue()


def graph_replay_semantics(device: torch.device | str | None = None) -> dict[str, Any]:
    """Show what a CUDA graph replays and what it does not, on a tiny ``y = x * 2 + 1``.

    Returns a dict: ``python_calls`` (times the Python body ran: 1, at capture, however many
    replays), ``replays``, ``new_name_result`` (output after binding the name ``x`` to a new
    tensor and replaying: still the old input's result), ``copied_result`` (after ``copy_``
    into the static input: the new result).

    Raises:
        RuntimeError: no CUDA GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("graph_replay_semantics needs a CUDA GPU")
    dev = torch.device(device or "cuda")
    calls = {"n": 0}
    x = torch.full((4,), 1.0, device=dev)

    def body(inp):
        calls["n"] += 1                       # a Python side effect
        return inp * 2 + 1

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        body(x)                               # warm-up (counts as one Python call)
    torch.cuda.current_stream(dev).wait_stream(side)
    calls["n"] = 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = body(x)
    for _ in range(5):
        g.replay()
    static_x = x
    x = torch.full((4,), 10.0, device=dev)    # new tensor, old name: the graph never sees it
    g.replay()
    new_name = y[0].item()
    static_x.copy_(x)                         # the right way: copy into the static input
    g.replay()
    copied = y[0].item()
    return {"python_calls": calls["n"], "replays": 7, "new_name_result": new_name,
            "copied_result": copied}


def wall_time(fn: Callable[[], object], device: torch.device | str, reps: int = 5,
              warmup: int = 1, stat: str = "median") -> float:
    """Wall-clock seconds of one call of ``fn()``, the device synchronized around each call.

    ``stat="median"`` (default) or ``"min"`` over ``reps`` calls after ``warmup`` calls; the
    minimum is the estimate least disturbed by other processes (use it for checks that compare
    two loops on a shared machine).

    For whole training loops (or steps) whose cost is partly on the CPU: the calls run as in a
    real loop, with nothing between them. (:func:`perflab.core.timing.benchmark` on a GPU flushes the
    L2 between calls; the flush kernel gives the CPU a head start that hides part of an
    overhead-bound step's cost, which is what a loop measurement must include.)

    Raises:
        ValueError: ``reps`` < 1, ``warmup`` < 0 or an unknown ``stat``.
    """
    number("reps", reps, minimum=1)
    number("warmup", warmup, minimum=0)
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    times = sorted(seconds_per_call(fn, 1, dev) for _ in range(reps))
    return times[0] if stat == "min" else times[len(times) // 2]
