"""Evidence from torch.profiler: where a step's time goes, and which bottleneck that names.

* :func:`trace_items`, :func:`summarize_trace` read the Chrome/Perfetto trace that
  ``prof.export_chrome_trace`` writes (:func:`perflab.core.profiler.load_trace`): busy time, idle gaps between kernels, top kernels with
  their achieved FLOP/s and bandwidth (costs from :func:`perflab.machine.costs.op_cost` on the recorded
  shapes).
* :func:`operator_rows` takes the host's rows of ``prof.key_averages()`` as numbers, for a table
  that shows the columns that matter.
* :func:`regime` names the bottleneck from that evidence. (An efficiency per clock is a rate over
  the clock model's peak at the clock the work ran at, :meth:`perflab.machine.ceilings.Ceilings.peak`,
  never a datasheet scaled by the clock's share of the maximum.)

What a computation *should* cost (FLOPs, bytes) is :mod:`perflab.machine.costs`; ``count_cost`` is
re-exported here because chapter 4 and lab 4 teach it beside the profiler.

Counting a call's kernels, its device time and its launch cost, naming the kernels each of many
calls ran and listing what one call ran on the device is :mod:`perflab.core.profiler` (the one
profiler reader, which chapters 1 and 2 use before this chapter explains it).

Times in traces are microseconds (the trace format's unit); rates are FLOP/s and bytes/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from perflab.core.profiler import NOT_COMPUTE, external_id, load_trace
from perflab.core.validate import integer, number, one_of, positive_int
from perflab.machine.costs import Cost, count_cost, op_cost
from perflab.profiling.busy import busy_and_gaps
from perflab.record.plotting import finish

__all__ = ["count_cost", "TraceItem", "trace_items", "step_windows", "KernelStats", "TraceSummary",
           "summarize_trace", "short_name", "kernel_family", "REGIMES", "regime", "kernel_summary", "OPERATOR_COLUMNS",
           "operator_rows", "host_and_device_seconds", "plot_timeline"]


@dataclass(frozen=True)
class TraceItem:
    """One unit of work in a trace: a GPU kernel, or (CPU-only traces) an outermost ATen operator.

    Attributes:
        name: kernel or operator name.
        ts_us: start, microseconds (the trace's clock).
        dur_us: duration, microseconds.
        op: the ATen operator that launched it (the item's own name for CPU operators).
        cost: FLOPs and bytes from :func:`perflab.machine.costs.op_cost` (None when unknown).
        blocks_per_sm: thread blocks per SM of a kernel's grid (``args["blocks per SM"]``), or None.
    """

    name: str
    ts_us: float
    dur_us: float
    op: str | None = None
    cost: Cost | None = None
    blocks_per_sm: float | None = None

    @property
    def end_us(self) -> float:
        """End time, microseconds."""
        return self.ts_us + self.dur_us


def trace_items(events: list[dict]) -> list[TraceItem]:
    """The work in a trace, sorted by start time.

    With GPU kernels present (``cat == "kernel"``) these are the kernels, each linked through its
    ``External id`` to the ATen operator that launched it (for its shapes and :func:`perflab.machine.costs.op_cost`).
    An operator that launches several kernels has its cost put on the first one (the others
    carry zero). In a CPU-only trace there are no kernels, so the items are the *outermost* ATen operators
    (those not called by another ATen operator; allocation and view operators excluded): the
    time a CPU spends inside ATen, as opposed to Python, autograd bookkeeping or the profiler.

    Raises:
        ValueError: ``events`` is not a list of dicts.
    """
    if not isinstance(events, list) or any(not isinstance(e, dict) for e in events):
        raise ValueError("events must be a list of trace-event dicts (see load_trace)")
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    ops = [e for e in complete if e.get("cat") == "cpu_op"]
    kernels = [e for e in complete if e.get("cat") == "kernel"]
    items = []
    if kernels:
        by_id = {}
        for e in ops:
            ext = external_id(e.get("args", {}))
            if ext is not None:
                by_id[ext] = e
        costed = set()
        for k in sorted(kernels, key=lambda e: float(e["ts"])):
            args = k.get("args", {})
            ext = external_id(args)
            op = by_id.get(ext)
            cost = None
            if op is not None:
                oa = op.get("args", {})
                cost = op_cost(op["name"], oa.get("Input Dims"), oa.get("Input type"))
                if cost is not None and ext in costed:  # an operator's second kernel: counted once
                    cost = Cost(0.0, 0.0)
                costed.add(ext)
            bps = args.get("blocks per SM")
            items.append(TraceItem(k["name"], float(k["ts"]), float(k["dur"]), op["name"] if op else None,
                                   cost, float(bps) if bps is not None else None))
    else:
        # outermost ATen operators per thread: not nested inside another aten:: operator
        by_thread: dict = {}
        for e in ops:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for evs in by_thread.values():
            evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
            open_end = -float("inf")
            for e in evs:
                start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
                if not e["name"].startswith("aten::"):
                    continue
                if start < open_end:  # inside the current outermost aten op
                    continue
                open_end = end
                if e["name"] in NOT_COMPUTE:
                    continue
                a = e.get("args", {})
                items.append(TraceItem(e["name"], start, float(e["dur"]), e["name"],
                                       op_cost(e["name"], a.get("Input Dims"), a.get("Input type"))))
    items.sort(key=lambda i: i.ts_us)
    return items


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """``(start_us, end_us)`` of each ``ProfilerStep#N`` range (one per ``prof.step()`` that was
    recorded under a schedule), sorted; empty when the trace has none."""
    out = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
           if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
           and e.get("cat") in ("user_annotation", "cpu_op", "python_function")]
    return sorted(out)


@dataclass(frozen=True)
class KernelStats:
    """Calls and time of one kernel (or CPU operator) name in a trace, with achieved rates.

    Attributes:
        name: kernel name.
        op: the ATen operator that launched it (the first seen).
        calls: number of launches.
        total_us: summed duration, microseconds.
        flops: summed FLOPs of the calls (None if unknown for any call).
        bytes: summed minimum bytes of the calls (None if unknown for any call).
    """

    name: str
    op: str | None
    calls: int
    total_us: float
    flops: float | None
    bytes: float | None

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s over the kernel's own time (None when FLOPs are unknown)."""
        return None if self.flops is None or self.total_us <= 0 else self.flops / (self.total_us * 1e-6)

    @property
    def bytes_per_s(self) -> float | None:
        """Achieved bytes/s over the kernel's own time (None when bytes are unknown)."""
        return None if self.bytes is None or self.total_us <= 0 else self.bytes / (self.total_us * 1e-6)


@dataclass(frozen=True)
class TraceSummary:
    """Where a trace's time went.

    Attributes:
        window_us: the span analysed (profiled steps, or first to last item), microseconds.
        busy_us: time at least one item (kernel, or ATen operator on CPU) ran, microseconds.
        items: number of kernels (or operators) in the window.
        steps: number of ``ProfilerStep`` ranges found (0 if none).
        gaps_us: idle gaps between consecutive busy intervals, microseconds.
        top: :class:`KernelStats` by total time, largest first.
        on_gpu: True when the items are GPU kernels.
        work_us: summed duration of the items in the window (overlaps counted twice), microseconds.
        flops: summed FLOPs of the items whose cost is known (a lower bound when some are not).
        bytes: summed minimum bytes of the items whose cost is known (likewise a lower bound).
        unknown_us: summed duration of the items whose cost is unknown, microseconds.
        sm_weighted_us: on a GPU, the summed duration of each kernel times the share of the SMs
            its grid could occupy (``min(1, blocks per SM)``), microseconds; None on a CPU or
            when the trace lacks grid sizes.
    """

    window_us: float
    busy_us: float
    items: int
    steps: int
    gaps_us: tuple[float, ...]
    top: tuple[KernelStats, ...]
    on_gpu: bool
    work_us: float = 0.0
    sm_weighted_us: float | None = None
    flops: float = 0.0
    bytes: float = 0.0
    unknown_us: float = 0.0

    @property
    def busy_fraction(self) -> float:
        """Fraction of the window in which some kernel (CPU: some ATen operator) ran."""
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    @property
    def idle_fraction(self) -> float:
        """``1 - busy_fraction``: the share of the window the device (CPU: ATen) sat idle."""
        return 1.0 - self.busy_fraction


def summarize_trace(source, top: int = 5) -> TraceSummary:
    """Busy time, idle gaps and the top kernels of a ``torch.profiler`` Chrome trace.

    The window is the union of the ``ProfilerStep#N`` ranges, extended to the end of the last
    kernel they launched (a GPU finishes after the CPU has moved on); without step ranges, first
    item start to last item end. Busy time is the union of item intervals in the window (clipped
    to it, so a kernel of an earlier step still running counts for the part inside), so two
    overlapping kernels count once (chapter 4's :func:`perflab.profiling.busy.busy_and_gaps`).
    Top kernels are grouped by name and ranked by summed time;
    their FLOPs and bytes come from the launching operator's recorded shapes (:func:`perflab.machine.costs.op_cost`).

    Args:
        source: a trace path, dict or event list (see :func:`load_trace`).
        top: how many kernel names to keep (>= 1).

    Raises:
        ValueError: ``top`` < 1, or the trace contains no work to analyse.
    """
    positive_int("top", top)
    events = source if isinstance(source, list) else load_trace(source)
    items = trace_items(events)
    steps = step_windows(events)
    if steps:
        start, end = steps[0][0], steps[-1][1]
        inside = [i for i in items if start <= i.ts_us < end]
        if inside:
            end = max(end, max(i.end_us for i in inside))
        # busy time counts any work overlapping the window (a kernel of the step before may
        # still be running when a step starts), clipped to it
        overlapping = [i for i in items if i.end_us > start and i.ts_us < end]
        items = inside
    elif items:
        start, end = items[0].ts_us, max(i.end_us for i in items)
        overlapping = items
    if not items:
        raise ValueError("the trace has no kernels or ATen operators to analyse "
                         "(profile with record_shapes=True and at least one active step)")
    # chapter 4's dozen lines, exported from its page (perflab.profiling.busy)
    busy, gaps = busy_and_gaps([(i.ts_us, i.end_us) for i in overlapping], start, end)
    groups: dict = {}
    for i in items:
        groups.setdefault(i.name, []).append(i)
    stats = []
    for name, group in groups.items():
        costs = [g.cost for g in group]
        known = all(c is not None for c in costs)
        stats.append(KernelStats(
            name, group[0].op, len(group), sum(g.dur_us for g in group),
            sum(c.flops for c in costs) if known else None,
            sum(c.bytes for c in costs) if known else None))
    stats.sort(key=lambda s: -s.total_us)
    on_gpu = any(e.get("cat") == "kernel" for e in events if isinstance(e, dict))
    work = sum(i.dur_us for i in items)
    sm_weighted = None
    if on_gpu and all(i.blocks_per_sm is not None for i in items):
        sm_weighted = sum(i.dur_us * min(1.0, i.blocks_per_sm) for i in items)
    known = [i for i in items if i.cost is not None]
    return TraceSummary(end - start, busy, len(items), len(steps), tuple(gaps), tuple(stats[:top]), on_gpu,
                        work, sm_weighted, sum(i.cost.flops for i in known), sum(i.cost.bytes for i in known),
                        sum(i.dur_us for i in items if i.cost is None))


def short_name(name: str, width: int = 60) -> str:
    """A kernel name cut to ``width`` characters for tables (template arguments dropped first).

    Raises:
        ValueError: ``width`` < 8.
    """
    integer("width", width, 8)
    cut = name.split("<", 1)[0].replace("void ", "") if "<" in name else name
    cut = cut if len(cut) <= width else cut[: width - 1] + "…"
    return cut


# which library wrote a kernel, from its name: cuDNN's convolutions (its own namespace, or
# xmma's fprop/dgrad/wgrad), cuBLAS's products, ATen's own kernels, Triton's (Inductor's)
# the marks that name their writer outright first: a Triton kernel that fuses a conversion
# ("triton_poi_fused__to_copy_convert_...") or an addmm is Inductor's, not cuDNN's or cuBLAS's
_LIBRARIES = (("Triton", ("triton_",)),
              ("ATen", ("at::native::",)),
              ("cuDNN", ("cudnn", "fprop", "dgrad", "wgrad", "conv")),
              ("cuBLAS", ("nvjet", "gemm", "cublas", "cutlass", "xmma", "splitk")),
              ("FlashAttention", ("flash", "fmha")))


def kernel_family(name: str, width: int = 28) -> str:
    """A kernel's name as prose can carry it: its family and the library that wrote it, as
    ``"nvjet_sm90_tst… (cuBLAS)"``, ``"nchwToNhwcKernel (cuDNN)"``,
    ``"unrolled_elementwise_kernel (ATen)"``; a name no library claims is cut alone.

    A full cuBLAS name (``nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT``) is one unbreakable
    word of 40-odd characters: in a sentence it made pages wider than a phone (reader review
    R5). The family keeps what a reader compares (the architecture and the data types:
    ``tst`` against ``hsh``), and a table or a printed output shows the whole name.

    Args:
        name: the kernel's name as the profiler reports it.
        width: the most characters of the family before "…" (>= 8); a name is cut at an
            underscore within it where it has one.

    Raises:
        ValueError: a name that is not a non-empty string, or ``width`` < 8.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a kernel's name, got {name!r}")
    integer("width", width, 8)
    lowered = name.lower()
    library = next((lib for lib, marks in _LIBRARIES if any(m in lowered for m in marks)),
                   None)
    core = name.strip().removeprefix("void ")
    core = re.split(r"[<(]", core, maxsplit=1)[0].strip()
    if "::" in core and not core.startswith("cutlass::"):
        core = core.rsplit("::", 1)[1]            # at::native::x_kernel -> x_kernel
    core = core or name.strip()
    fields = core.split("_")
    if re.match(r"(nvjet|sm\d+)_", core) and len(fields) > 3:   # a tile's name: its family
        core = "_".join(fields[:3]) + "…"                       # nvjet_sm90_tst, sm90_xmma_gemm
    if len(core) > width:
        cut = core.rfind("_", 0, width)
        core = core[: cut if cut >= width // 2 else width - 1] + "…"
    return f"{core} ({library})" if library else core


REGIMES = ("compute-bound", "bandwidth-bound", "latency-bound", "overhead-bound")


def regime(flops_fraction: float, bandwidth_fraction: float, busy_fraction: float | None = None,
           threshold: float = 0.25) -> str:
    """Name the bottleneck from the evidence: the fraction of each ceiling a step reached.

    * ``"overhead-bound"`` when ``busy_fraction`` (kernel time over wall time, GPU) is below one
      half whatever the rates: the device mostly waits for the host to issue work.
    * ``"compute-bound"`` when achieved FLOP/s is the larger fraction of its ceiling and at least
      ``threshold``; ``"bandwidth-bound"`` likewise for achieved bytes/s.
    * Near neither roof (both below ``threshold``): ``"latency-bound"`` when the device was busy
      (``busy_fraction`` >= 0.5): kernels ran most of the time yet used little of either
      unit, so they were too small to fill the GPU or waited on memory latency (what Nsight
      Compute reports as low throughput on both axes); ``"overhead-bound"`` when
      ``busy_fraction`` is None (a CPU, where no separate device can sit idle, so the two
      cannot be told apart).

    The roofline's reading (Williams et al., 2009): a step near neither roof is limited by
    something else.

    Args:
        flops_fraction: achieved FLOP/s / compute ceiling measured on the same machine.
        bandwidth_fraction: achieved bytes/s / copy bandwidth measured on the same machine.
        busy_fraction: optional device-busy fraction from a trace (0..1).
        threshold: the fraction of a ceiling that counts as "near the roof" (0 < threshold <= 1).

    Returns:
        One of :data:`REGIMES`.

    Raises:
        ValueError: a negative fraction, a busy fraction outside [0, 1] or a bad threshold.
    """
    number("threshold", threshold, above=0, maximum=1)
    number("flops_fraction", flops_fraction, minimum=0)
    number("bandwidth_fraction", bandwidth_fraction, minimum=0)
    if busy_fraction is not None:
        number("busy_fraction", busy_fraction, minimum=0, maximum=1)
    if busy_fraction is not None and busy_fraction < 0.5:
        return "overhead-bound"
    if max(flops_fraction, bandwidth_fraction) < threshold:
        return "overhead-bound" if busy_fraction is None else "latency-bound"
    return "compute-bound" if flops_fraction >= bandwidth_fraction else "bandwidth-bound"


def kernel_summary(source) -> list[dict]:
    """Per-kernel totals of a ``torch.profiler`` trace in the layout of Nsight Systems'
    ``nsys stats --report cuda_gpu_kern_sum``: one row per kernel name, sorted by total time,
    with ``time_pct`` (share of all kernel time), ``total_us``, ``instances``, ``avg_us``,
    ``med_us``, ``min_us``, ``max_us`` and ``name``. Both tools read the kernels' start and end
    from CUPTI, so the numbers agree where both can run. A CPU-only trace (no kernels) gives
    the outermost ATen operators instead (:func:`trace_items`).

    Raises:
        ValueError: the trace holds no kernel or operator.
    """
    events = source if isinstance(source, list) else load_trace(source)
    items = trace_items(events)
    if not items:
        raise ValueError("the trace has no kernels or ATen operators to summarize")
    groups: dict = {}
    for i in items:
        groups.setdefault(i.name, []).append(i.dur_us)
    total = sum(sum(v) for v in groups.values())
    rows = []
    for name, durs in groups.items():
        durs = sorted(durs)
        mid = len(durs) // 2
        med = durs[mid] if len(durs) % 2 else (durs[mid - 1] + durs[mid]) / 2
        rows.append({"time_pct": 100 * sum(durs) / total if total else 0.0,
                     "total_us": sum(durs), "instances": len(durs),
                     "avg_us": sum(durs) / len(durs), "med_us": med,
                     "min_us": durs[0], "max_us": durs[-1], "name": name})
    return sorted(rows, key=lambda r: -r["total_us"])


#: The columns of :func:`operator_rows`: key -> the ``FunctionEventAvg`` attribute and its scale
#: (microseconds to seconds; bytes stay bytes).
OPERATOR_COLUMNS = {
    "self_cpu_s": ("self_cpu_time_total", 1e-6), "cpu_total_s": ("cpu_time_total", 1e-6),
    "self_device_s": ("self_device_time_total", 1e-6), "device_total_s": ("device_time_total", 1e-6),
    "self_cpu_memory_B": ("self_cpu_memory_usage", 1), "cpu_memory_B": ("cpu_memory_usage", 1),
    "self_device_memory_B": ("self_device_memory_usage", 1), "device_memory_B": ("device_memory_usage", 1),
}


def operator_rows(events, sort_by: str = "cpu_total_s", limit: int = 10) -> list[dict]:
    """The rows of ``prof.key_averages()`` that ran on the host (ATen operators,
    ``record_function`` ranges, CUDA runtime calls), as numbers for
    :func:`perflab.record.tables.show`: what ``key_averages().table()`` prints, without the rows
    of kernels and GPU-side ranges, whose host columns are empty (a kernel's time is the device
    time of the operator that launched it) and which fill the printed table with ``0.00%``.

    Each row is a dict: ``name``, ``calls`` and the keys of :data:`OPERATOR_COLUMNS` (times in
    seconds: self and total, on the host and of the kernels launched inside; memory in bytes
    allocated, negative for frees: self and including callees). Rows are sorted by the
    magnitude of ``sort_by``, largest first, rows where it is zero dropped, at most ``limit``.

    Raises:
        ValueError: ``sort_by`` not a key of :data:`OPERATOR_COLUMNS`, or ``limit`` < 1.
    """
    one_of("sort_by", sort_by, OPERATOR_COLUMNS)
    positive_int("limit", limit)
    rows = []
    for e in events:
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU:
            continue
        row = {"name": e.key, "calls": e.count}
        for key, (attr, scale) in OPERATOR_COLUMNS.items():
            row[key] = getattr(e, attr, 0) * scale
        if row[sort_by]:
            rows.append(row)
    rows.sort(key=lambda r: -abs(r[sort_by]))
    return rows[:limit]


#: Names (prefixes) of the rows that ``torch.profiler`` adds for itself: CUPTI's activity
#: buffer requests (milliseconds, on the first traced step) and a schedule's step ranges.
PROFILER_ROWS = ("Activity Buffer Request", "ProfilerStep")


def host_and_device_seconds(events) -> tuple[float, float]:
    """The host time and the device time of everything ``prof.key_averages()`` recorded, in
    seconds: ``(host_s, device_s)``, each time counted once.

    ``host_s`` sums the self CPU time of the operators' rows (a kernel's row has none): not the
    profiler's own (:data:`PROFILER_ROWS`: CUPTI's buffer requests, and the ``ProfilerStep#N``
    range of a schedule, whose self time is the wait in ``synchronize`` and the profiler's
    bookkeeping between the operators, no operator's), and not the ``record_function`` ranges
    (``is_user_annotation``), whose self time is no operator's either: a range around
    ``loss.backward()`` on a GPU holds the main thread blocked while the autograd engine's
    thread runs the backward operators, which have rows of their own, so counting both would
    count that wait as CPU work (more CPU time than the step's wall). ``device_s`` sums
    the rows that ran on the device (kernels, copies and fills), leaving out the host rows,
    whose self device time is the time of the kernels they launched (those kernels have rows
    of their own: summing both counts the GPU's time twice), and the device-side ranges that
    ``record_function`` adds around them (``is_user_annotation``). The same rule gives the
    total that ``key_averages().table()`` prints under its device columns.

    Raises:
        ValueError: ``events`` is not iterable.
    """
    try:
        rows = list(events)
    except TypeError:
        raise ValueError(f"events must be prof.key_averages(), got {type(events).__name__}") from None
    host = sum(getattr(e, "self_cpu_time_total", 0) for e in rows
               if not str(getattr(e, "key", "")).startswith(PROFILER_ROWS)
               and not getattr(e, "is_user_annotation", False))
    device = sum(e.self_device_time_total for e in rows
                 if getattr(e, "device_type", None) not in (None, torch.autograd.DeviceType.CPU)
                 and not getattr(e, "is_user_annotation", False))
    return host * 1e-6, device * 1e-6


def plot_timeline(traces: dict, width_us: float | None = None):
    """A timeline of each ``torch.profiler`` trace, one panel per trace, as Perfetto draws it:
    a row of the host's outermost ATen operators and a row of the GPU's kernels (a CPU trace has
    the first row only), over the recorded steps (``ProfilerStep#N``), time from the first
    step's start in microseconds.

    Args:
        traces: ``{title: trace path, dict or event list}``.
        width_us: time shown per panel (default: each trace's whole window).

    Returns the matplotlib Figure (one display: call ``plt.show()``).

    Raises:
        ValueError: an empty ``traces`` or a trace without operators.
    """
    if not traces:
        raise ValueError("traces must name at least one trace")
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 1.6 * len(traces) + 0.6),
                             squeeze=False)
    for ax, (title, source) in zip(axes[:, 0], traces.items()):
        events = source if isinstance(source, list) else load_trace(source)
        steps = step_windows(events)
        ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
               and str(e.get("name", "")).startswith("aten::")]
        kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
        if not ops and not kernels:
            raise ValueError(f"trace {title!r} has no operators or kernels to draw")
        t0 = steps[0][0] if steps else min(float(e["ts"]) for e in ops + kernels)
        end = steps[-1][1] if steps else max(float(e["ts"]) + float(e["dur"])
                                             for e in ops + kernels)
        if kernels:
            end = max(end, max(float(e["ts"]) + float(e["dur"]) for e in kernels
                               if float(e["ts"]) < end))
        span = width_us or (end - t0)
        # the outermost operators only: a nested call would hide under its caller
        outer, open_end = [], -float("inf")
        for e in sorted(ops, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            if float(e["ts"]) >= open_end:
                outer.append(e)
                open_end = float(e["ts"]) + float(e["dur"])
        rows = [("host: ATen operators", outer, "C0")]
        if kernels:
            rows.append(("GPU: kernels", kernels, "C3"))
        for y, (_, evs, color) in enumerate(reversed(rows)):
            bars = [(float(e["ts"]) - t0, float(e["dur"])) for e in evs
                    if 0 <= float(e["ts"]) - t0 < span]
            ax.broken_barh(bars, (y + 0.1, 0.8), facecolors=color)
        ax.set_yticks([y + 0.5 for y in range(len(rows))],
                      [label for label, _, _ in reversed(rows)], fontsize=8)
        ax.set_xlim(0, span)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time from the first recorded step (µs)")
    return finish(fig)
