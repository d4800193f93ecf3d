"""The one reader of torch.profiler: kernels per call, device time, launch cost, traces, intervals.

* :func:`kernels_per_call` counts the kernels (CPU: ATen compute operators) one call runs;
  :func:`device_seconds_per_call` sums their device time; :func:`kernels_of` names them, with
  their grids and blocks (which kernel ran, with which tiles); :func:`launch_api_seconds` is the
  host time one call spends in the CUDA launch API.
* :func:`kernels_by_call` names the kernels each of many calls ran, from one profiling session
  (chapter 2's wave sweep); :func:`device_activities` lists what one call ran on the device,
  copies (``cudaMemcpy``) included (chapter 2's L2 probe check).
* :func:`load_trace` reads the Chrome/Perfetto trace that ``prof.export_chrome_trace`` writes,
  :func:`trace_events` exports and reads a finished profiler's, :func:`trace_intervals` takes the
  host-to-device copies and the kernels out of one.
* Intervals ``(start, end)``, the one toolkit for "how much of this ran while that ran":
  :func:`union` (merged, sorted), :func:`covered` (the part of one interval under a merged set),
  :func:`intersection_length` (the time two sets of intervals overlap) and
  :func:`overlap_fraction` (the share of one set's time during which the other runs).

Chapter 4's evidence from a trace (busy time, gaps, top kernels, regimes) is
:mod:`perflab.profiling.trace`. Times in traces are microseconds (the trace format's unit).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from perflab.core.validate import number
from perflab.core.timing import timed_window

__all__ = ["kernels_per_call", "device_seconds_per_call", "KernelRecord", "kernels_of",
           "external_id", "device_activities", "kernels_by_call", "launch_api_seconds", "load_trace",
           "trace_events", "trace_intervals", "union", "covered", "intersection_length",
           "overlap_fraction"]


# ATen calls that allocate, view or reshape metadata without touching every element.
NOT_COMPUTE = {
    "aten::empty", "aten::empty_strided", "aten::as_strided", "aten::view", "aten::reshape",
    "aten::_reshape_alias", "aten::resize_", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::empty_like", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze",
}


def kernels_per_call(fn: Callable, *args, calls: int = 5, **kwargs) -> float:
    """Average number of kernels one call of ``fn(*args, **kwargs)`` runs, read from torch.profiler.

    On a GPU (any tensor argument on CUDA, or CUDA available and no tensor arguments) this counts
    device kernels (memcpy and memset excluded): a fused ``torch.compile`` graph shows 1, eager
    ``x*2*2`` shows 2. On a CPU there are no device kernels to count, so it counts ATen compute
    operator calls instead (allocation and view operators excluded): eager code shows one per
    operator, a fused Inductor C++ kernel shows 0.

    Call ``fn`` once before this (compilation and warm-up would otherwise be profiled).

    Raises:
        ValueError: ``calls`` < 1.
    """
    number("calls", calls, minimum=1)
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    on_gpu = any(t.is_cuda for t in tensors) if tensors else torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn(*args, **kwargs)
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.events()
    if on_gpu:
        n = sum(1 for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset", "[memory]")))
    else:
        n = sum(1 for e in events if e.name.startswith("aten::") and e.name not in NOT_COMPUTE
                and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    return n / calls


def _profiled_calls(fn: Callable, args, kwargs, calls: int, warmup: int):
    """The profiler's events (CPU and CUDA) of ``calls`` calls of ``fn``, after ``warmup``
    unprofiled calls; the GPU is synchronized before and inside the profiled region."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args, **kwargs)
        torch.cuda.synchronize()
    return prof.events()


def device_seconds_per_call(fn: Callable, *args, calls: int = 20, warmup: int = 3, **kwargs) -> float:
    """Device (kernel) time of one call of ``fn(*args, **kwargs)`` on a GPU, in seconds, from CUPTI.

    ``fn`` runs ``warmup`` times, then ``calls`` times under torch.profiler; the result is the sum
    of the durations of the device kernels it launched (memcpy and memset excluded) divided by
    ``calls``. Unlike a CUDA-event or host-clock timer this excludes launch gaps between kernels
    and any host overhead, and nothing is flushed between calls, so data left in the L2 by one
    call is there for the next: the tool for measuring cache-resident bandwidth.

    Raises:
        RuntimeError: no CUDA device, or the profiler recorded no kernel.
        ValueError: ``calls`` < 1 or ``warmup`` < 0.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("device_seconds_per_call needs a CUDA GPU; this machine has none")
    number("calls", calls, minimum=1)
    number("warmup", warmup, minimum=0)
    events = _profiled_calls(fn, args, kwargs, calls, warmup)
    kernels = [e for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset", "[memory]"))]
    if not kernels:
        raise RuntimeError("the profiler recorded no CUDA kernel for fn")
    total_us = sum(e.time_range.end - e.time_range.start for e in kernels)
    return total_us * 1e-6 / calls


@dataclass(frozen=True)
class KernelRecord:
    """One kernel a call ran, as the profiler's trace records it.

    Attributes:
        name: the kernel's name (a cuBLAS name such as ``nvjet_sm90_tst_256x128_...`` carries
            its tile; a Triton kernel names the operators it fused).
        grid, block: launch dimensions ``(x, y, z)``, None when the trace lacks them.
        blocks_per_sm: the trace's "blocks per SM" (grid blocks / SMs), None when absent.
        duration_us: mean device time per launch, microseconds.
        launches: how many times it ran per call.
    """

    name: str
    grid: tuple[int, ...] | None
    block: tuple[int, ...] | None
    blocks_per_sm: float | None
    duration_us: float
    launches: float


def kernels_of(fn: Callable, *args, calls: int = 3, **kwargs) -> list[KernelRecord]:
    """The GPU kernels one call of ``fn(*args, **kwargs)`` runs, in launch order (first call),
    with their grids, blocks and mean durations: which kernel ran, before a model of it is
    fitted. Call ``fn`` once before (compilation and warm-up stay out).

    Raises:
        RuntimeError: no CUDA device, or the profiler recorded no kernel.
        ValueError: ``calls`` < 1.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("kernels_of needs a CUDA GPU; this machine has none")
    number("calls", calls, minimum=1)
    events = _trace_of(lambda: [fn(*args, **kwargs) for _ in range(calls)])
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        raise RuntimeError("the profiler recorded no CUDA kernel for fn")
    return _records(kernels, calls)


# ---------------------------------------------------------------------------------------------
# Which kernels calls ran: many calls' from one session (and kernels_of's, above); what one call
# ran on the device
# ---------------------------------------------------------------------------------------------

def external_id(args: dict):
    """The ``External id`` of a trace event's ``args`` (either spelling), which links a kernel to
    the ATen operator that issued it; None when absent."""
    return args.get("External id", args.get("external id"))


def _records(kernels: list[dict], calls: int = 1) -> list[KernelRecord]:
    """Kernel events grouped by name in launch order (mean duration, launches per call)."""
    order, groups = [], {}
    for e in sorted(kernels, key=lambda e: float(e["ts"])):
        if e["name"] not in groups:
            order.append(e["name"])
        groups.setdefault(e["name"], []).append(e)
    dims = lambda v: tuple(int(x) for x in v) if isinstance(v, list) else None  # noqa: E731
    out = []
    for name in order:
        g = groups[name]
        a = g[0].get("args", {})
        bps = a.get("blocks per SM")
        out.append(KernelRecord(name, dims(a.get("grid")), dims(a.get("block")),
                                float(bps) if bps is not None else None,
                                sum(float(e["dur"]) for e in g) / len(g), len(g) / calls))
    return out


def _trace_of(run: Callable[[], None]) -> list[dict]:
    """The Chrome-trace events of ``run()`` under torch.profiler (CPU and CUDA activities)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return trace_events(prof)


_ACTIVITY = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def device_activities(fn: Callable, *args, **kwargs) -> list[tuple[str, str, float]]:
    """What one call of ``fn(*args, **kwargs)`` ran on the GPU, in order: ``(kind, name,
    microseconds)`` with ``kind`` ``"kernel"``, ``"memcpy"`` or ``"memset"``.

    A same-dtype copy between two contiguous tensors (``dst.copy_(src)``) is no kernel of
    PyTorch's: it is a ``cudaMemcpyAsync``, which the profiler records as a memcpy activity
    ("Memcpy DtoD"), carried out the driver's way. Call ``fn`` once before (warm-up).

    Returns an empty list when the profiler recorded nothing on the device.

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("device_activities needs a CUDA GPU; this machine has none")
    events = _trace_of(lambda: fn(*args, **kwargs))
    found = sorted((e for e in events if e.get("cat") in _ACTIVITY and "dur" in e),
                   key=lambda e: float(e["ts"]))
    return [(_ACTIVITY[e["cat"]], e["name"], float(e["dur"])) for e in found]


_LAUNCHES = ("cuda_runtime", "cuda_driver", "runtime", "driver")


def kernels_by_call(calls, repeats: int = 1) -> list[list[list[KernelRecord]]]:
    """The kernels each of many calls ran, from one profiler session: ``[repeat][call]`` ->
    the call's :class:`KernelRecord` list (grid, block, device duration).

    Every call runs ``repeats`` times (all calls, then all again), each inside a
    ``record_function`` range; a kernel belongs to the range in which the host launched it
    (linked by the trace's ``correlation`` to its launch, or else by ``External id`` to the
    ATen operator that issued it). The profiled passes are a timed window
    (:func:`perflab.core.timing.timed_window`), so a :class:`perflab.core.telemetry.Telemetry`
    open around the call reads its clocks over them. One session for hundreds of calls costs a fraction of the
    time :func:`kernels_of` would per call. Run each call once before
    (compilation, library heuristics and warm-up stay out).

    Args:
        calls: callables of no argument (a sequence).
        repeats: passes over ``calls`` (>= 1).

    Raises:
        RuntimeError: no CUDA device.
        ValueError: no calls, or ``repeats`` < 1.
    """
    calls = list(calls)
    if not calls:
        raise ValueError("calls must hold at least one callable")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("kernels_by_call needs a CUDA GPU; this machine has none")

    def run():
        for r in range(repeats):
            for i, fn in enumerate(calls):
                with torch.profiler.record_function(f"perflab_call_{r}_{i}"):
                    fn()

    with timed_window(torch.device("cuda")):   # the profiled passes: a timed window
        events = _trace_of(run)
    ranges = []
    for e in events:
        name = str(e.get("name", ""))
        if name.startswith("perflab_call_") and e.get("cat") == "user_annotation" and "dur" in e:
            r, i = (int(x) for x in name[len("perflab_call_"):].split("_"))
            ranges.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), r, i))
    ranges.sort()
    launch_ts = {e["args"]["correlation"]: float(e["ts"]) for e in events
                 if e.get("cat") in _LAUNCHES and "correlation" in e.get("args", {})}
    op_ts = {}
    for e in events:
        ext = external_id(e.get("args", {}))
        if e.get("cat") == "cpu_op" and ext is not None:
            op_ts[ext] = float(e["ts"])
    owned: dict[tuple[int, int], list[dict]] = {}
    for k in (e for e in events if e.get("cat") == "kernel" and "dur" in e):
        a = k.get("args", {})
        ts = launch_ts.get(a.get("correlation"), op_ts.get(external_id(a)))
        if ts is None:
            continue
        for lo, hi, r, i in ranges:
            if lo <= ts <= hi:
                owned.setdefault((r, i), []).append(k)
                break
    return [[_records(owned.get((r, i), [])) for i in range(len(calls))] for r in range(repeats)]


def launch_api_seconds(fn: Callable, *args, calls: int = 200, **kwargs) -> tuple[float, float]:
    """Host seconds one call of ``fn`` spends inside the CUDA launch API (``cudaLaunchKernel``,
    ``cudaLaunchKernelExC``, ``cuLaunchKernel``), and how many launches it makes, from the
    profiler's CPU timeline: ``(seconds per call, launches per call)``. The profiler's own cost
    lands outside these events, so this is the launch path itself. (0.0, 0.0) on a call that
    launches nothing.

    Raises:
        RuntimeError: no CUDA device.
        ValueError: ``calls`` < 1.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("launch_api_seconds needs a CUDA GPU; this machine has none")
    number("calls", calls, minimum=1)
    events = _profiled_calls(fn, args, kwargs, calls, warmup=1)
    launches = [e for e in events
                if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel"))]
    total_us = sum(e.time_range.end - e.time_range.start for e in launches)
    return total_us * 1e-6 / calls, len(launches) / calls


def load_trace(source) -> list[dict]:
    """The event list of a Chrome trace exported by ``torch.profiler`` (``export_chrome_trace``).

    Args:
        source: a path to a ``.json`` or ``.json.gz`` file, or the already-parsed dict.

    Returns:
        list of event dicts (``traceEvents``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the JSON has no ``traceEvents`` list.
    """
    if isinstance(source, dict):
        data = source
    else:
        path = os.fspath(source)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError("source is not a Chrome trace: no 'traceEvents' list")
    return events


def trace_events(prof) -> list[dict]:
    """The Chrome-trace events of a finished ``torch.profiler.profile`` session: exported to a
    temporary file (removed afterwards) and read back with :func:`load_trace`.

    Raises:
        ValueError: the exported trace has no ``traceEvents`` list.
    """
    with tempfile.TemporaryDirectory(prefix="perflab_trace_") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return load_trace(path)


def trace_intervals(trace) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Host-to-device copy and kernel intervals (microseconds) from a Chrome trace.

    ``trace`` is what :func:`load_trace` reads (a path, the parsed dict, or its event list).
    Copies are events of category ``gpu_memcpy`` whose name contains ``HtoD``; kernels are events
    of category ``kernel``.

    Raises:
        ValueError: the trace has no ``traceEvents`` list.
    """
    events = trace if isinstance(trace, list) else load_trace(trace)
    copies, kernels = [], []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        span = (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
        cat = str(ev.get("cat", "")).lower()
        if cat == "gpu_memcpy" and "htod" in str(ev.get("name", "")).lower():
            copies.append(span)
        elif cat == "kernel":
            kernels.append(span)
    return copies, kernels


def _checked(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out = [(float(s), float(e)) for s, e in intervals]
    for s, e in out:
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e})")
    return out


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals (touching ones
    merged; an empty interval ``(t, t)`` is kept where nothing covers it). Any one time unit.

    Raises:
        ValueError: an interval with ``end < start``.
    """
    merged: list[list[float]] = []
    for s, e in sorted(_checked(intervals)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def covered(interval: tuple[float, float], merged: Sequence[tuple[float, float]]) -> float:
    """Length of ``interval`` that lies under ``merged`` (disjoint intervals, as :func:`union`
    returns them)."""
    s, e = interval
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in merged)


def intersection_length(xs: Iterable[tuple[float, float]],
                        ys: Iterable[tuple[float, float]]) -> float:
    """The time during which both an interval of ``xs`` and one of ``ys`` run: the length of
    ``union(xs) & union(ys)``, each set merged first so no moment counts twice.

    Raises:
        ValueError: an interval with ``end < start``.
    """
    ys_merged = union(ys)
    return sum(covered(x, ys_merged) for x in union(xs))


def overlap_fraction(parts: Sequence[tuple[float, float]],
                     by: Sequence[tuple[float, float]]) -> float:
    """Fraction of the total time of ``parts`` (e.g. copies) during which at least one interval
    of ``by`` (e.g. kernels) runs.

    ``by`` is merged first, so a part under two concurrent intervals is not counted twice; the
    parts are summed as they are (two copies at once count twice, in the total and in the
    covered time alike).

    Raises:
        ValueError: no parts, zero total time of the parts, or an interval with ``end < start``.
    """
    parts = _checked(parts)
    merged = union(by)
    total = sum(e - s for s, e in parts)
    if not parts or total <= 0:
        raise ValueError("parts must hold at least one interval of positive length")
    return sum(covered(p, merged) for p in parts) / total
