"""Where a profiled GPT-2 step's time goes: busy time and gaps, and kernels by kind.

:func:`profile_step` profiles one step with ``torch.profiler``; :class:`Timeline` is when the
device was busy (from the exported trace, :func:`perflab.profiling.trace.summarize_trace`) and
the idle gaps between kernels; :func:`kernel_kind` and :func:`step_breakdown` sum the kernels into
matrix products, attention and the rest (:class:`StepBreakdown`); :func:`attention_kernel` names
the fused attention that ran; :func:`weight_matmul_flops` is the FLOPs its matmuls should do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile as _profile

from perflab.core.profiler import trace_events
from perflab.core.rounds import Spread
from perflab.core.timing import synchronize
from perflab.core.validate import integer, number, one_of, positive
from perflab.profiling.trace import summarize_trace

__all__ = ["Timeline", "profile_step", "profile_pair", "timeline_spread", "kernel_spread", "kernel_kind",
           "StepBreakdown", "step_breakdown", "weight_matmul_flops",
           "attention_kernel", "KernelChanges", "kernel_changes"]


@dataclass(frozen=True)
class Timeline:
    """When a profiled step's device was busy (from its trace, :func:`perflab.profiling.trace.summarize_trace`).

    Attributes:
        window_s: first kernel's start to last kernel's end (CPU: outermost ATen operators), s.
        busy_s: time in which at least one kernel ran, s.
        kernels: kernels in the window.
        gaps_s: every idle gap between consecutive busy intervals, in order, s.
    """

    window_s: float
    busy_s: float
    kernels: int
    gaps_s: tuple

    @property
    def idle_s(self) -> float:
        """Idle time inside the window (s): ``window_s - busy_s``."""
        return self.window_s - self.busy_s

    def idle_in_gaps_below(self, threshold_s: float) -> float:
        """Seconds of idle time in gaps shorter than ``threshold_s`` (the boundaries between
        back-to-back kernels), as opposed to long waits.

        Raises:
            ValueError: ``threshold_s`` <= 0.
        """
        positive("threshold_s", threshold_s)
        return sum(g for g in self.gaps_s if g < threshold_s)

    @property
    def median_gap_s(self) -> float:
        """Median idle gap (s); 0 without gaps."""
        return float(np.median(self.gaps_s)) if self.gaps_s else 0.0


def _timeline(prof) -> Timeline | None:
    """The :class:`Timeline` of a finished ``torch.profiler`` session (None if its trace holds
    no work)."""
    try:
        t = summarize_trace(trace_events(prof))
    except ValueError:
        return None
    return Timeline(t.window_us * 1e-6, t.busy_us * 1e-6, t.items,
                    tuple(g * 1e-6 for g in t.gaps_us))


def profile_step(step, device: torch.device, n: int = 12) -> dict:
    """Profile one call of ``step()``: ``{"kernels": the n longest rows of the profiler's
    table, "device_kernels": every device-side event (GPU) or operator (CPU), by name}``,
    each ``[(name, seconds), ...]``, the longest first, and ``"timeline"``: the step's
    :class:`Timeline` (busy time and idle gaps)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _profile(activities=acts) as prof:
        step()
        synchronize(device)
    timeline = _timeline(prof)
    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = e.self_cuda_time_total
        else:
            t = e.self_cpu_time_total
        if t > 0:
            rows.append((e.key, t * 1e-6))
    rows.sort(key=lambda r: -r[1])
    if device.type != "cuda":
        return {"kernels": rows[:n], "device_kernels": rows, "timeline": timeline}
    # an ATen operator's row carries the device time of the kernels it launched, and a
    # kernel Inductor launches under a record_function of its own name shares that name:
    # only the device-side events count each kernel once
    return {"kernels": rows[:n], "device_kernels": _device_rows(prof.events()),
            "timeline": timeline}


def profile_pair(before, after, rounds: int, device: torch.device) -> dict:
    """Profile one call of ``before()`` and of ``after()`` (:func:`profile_step`) in each of
    ``rounds`` rounds, the order alternating (before, after; after, before; ...), so that the
    two steps of a round are taken a moment apart and a drift of the clock touches both alike.
    Returns ``{"before": [profile, ...], "after": [profile, ...]}``, round by round: read them
    with :func:`timeline_spread` and :func:`kernel_spread`.

    Raises:
        ValueError: ``rounds`` < 1.
    """
    integer("rounds", rounds, 1)
    steps = {"before": before, "after": after}
    got: dict[str, list] = {"before": [], "after": []}
    for k in range(rounds):
        for side in (("before", "after") if k % 2 == 0 else ("after", "before")):
            got[side].append(profile_step(steps[side], device))
    return got


def _profiles(profiles: Sequence[dict]) -> list[dict]:
    profiles = list(profiles)
    if not profiles:
        raise ValueError("profiles must hold at least one profile_step result")
    for p in profiles:
        if not isinstance(p, dict) or "timeline" not in p or "device_kernels" not in p:
            raise ValueError(f"profiles must hold profile_step results, got {p!r:.80}")
    return profiles


def timeline_spread(profiles: Sequence[dict], what: str) -> Spread:
    """One :class:`Timeline` quantity over several profiled steps, a :class:`Spread` (one
    value per step, in order): ``what`` is ``"idle_s"``, ``"busy_s"``, ``"window_s"`` or
    ``"kernels"``. Two sides profiled in interleaved rounds subtract round by round
    (``timeline_spread(before, w) - timeline_spread(after, w)``: the fall, with its spread).

    Raises:
        ValueError: no profiles, something that is not a :func:`profile_step` result, a
            profile without a timeline (its trace held no work), or another ``what``.
    """
    one_of("what", what, ("idle_s", "busy_s", "window_s", "kernels"))
    values = []
    for p in _profiles(profiles):
        if p["timeline"] is None:
            raise ValueError("profiles: a profiled step has no timeline (its trace held no work)")
        values.append(float(getattr(p["timeline"], what)))
    return Spread(tuple(values))


def kernel_spread(profiles: Sequence[dict], *keys: str) -> Spread:
    """Seconds per profiled step in the device kernels whose name holds any of ``keys``
    (case-insensitive), over several :func:`profile_step` results: a :class:`Spread`, one
    value per step.

    Raises:
        ValueError: no profiles, something that is not a :func:`profile_step` result, or no
            ``keys``.
    """
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"keys must be one or more non-empty strings, got {keys!r}")
    low = [k.lower() for k in keys]
    return Spread(tuple(float(sum(t for name, t in p["device_kernels"]
                                  if any(k in name.lower() for k in low)))
                        for p in _profiles(profiles)))


def _device_rows(events) -> list[tuple[str, float]]:
    """``[(name, seconds)]`` summed over the device-side events (kernels, copies, memsets) of a
    profile's ``events()``, the longest first; host-side operators are left out."""
    totals: dict[str, float] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time_total * 1e-6
    return sorted(((k, v) for k, v in totals.items() if v > 0), key=lambda r: -r[1])


#: substrings of attention kernels (flash, cuDNN's SDPA, xFormers/CUTLASS fmha, ATen's CPU SDPA)
_ATTENTION = ("flash", "fmha", "sdpa", "attention", "scaled_dot_product")


#: substrings of matrix-product kernels (cuBLAS: gemm, nvjet (Hopper), cutlass, xmma; ATen ops
#: on a CPU; Inductor's Triton matmul templates ``triton_tem_*mm*``)
_MATMUL = ("gemm", "nvjet", "cublas", "cutlass", "xmma")


_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
               "aten::addbmm", "aten::matmul")


def kernel_kind(name: str) -> str:
    """``"attention"``, ``"matmul"`` or ``"other"`` for a profiled kernel (or CPU operator) name.

    Attention is tested first (a fused attention kernel multiplies matrices too, and its name
    may say so); Inductor's pointwise and reduction kernels (``triton_poi_``, ``triton_red_``,
    ``triton_per_``) are ``"other"`` even when their name lists the ``addmm`` whose bias they
    fused.

    Raises:
        TypeError: ``name`` is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    low = name.lower()
    if any(k in low for k in _ATTENTION):
        return "attention"
    if low.startswith(("triton_poi", "triton_red", "triton_per")):
        return "other"
    if any(k in low for k in _MATMUL) or low.split("(")[0].strip() in _MATMUL_OPS:
        return "matmul"
    if low.startswith("triton_tem") and "mm" in low:
        return "matmul"
    return "other"


@dataclass(frozen=True)
class StepBreakdown:
    """A profiled step's device time split into matrix products, attention and the rest.

    Attributes:
        matmul_s, attention_s, other_s: seconds of kernels of each kind (:func:`kernel_kind`).
    """

    matmul_s: float
    attention_s: float
    other_s: float

    @property
    def total_s(self) -> float:
        """All kernel time (s): the device's busy time if kernels do not overlap."""
        return self.matmul_s + self.attention_s + self.other_s

    def share(self, kind: str) -> float:
        """Fraction of :attr:`total_s` spent in ``kind`` (``"matmul"``, ``"attention"``,
        ``"other"``).

        Raises:
            ValueError: an unknown kind, or no kernel time at all.
        """
        one_of("kind", kind, ("matmul", "attention", "other"))
        if self.total_s <= 0:
            raise ValueError("the breakdown holds no kernel time")
        return getattr(self, f"{kind}_s") / self.total_s

    def rate(self, matmul_flops: float) -> float:
        """Achieved matrix-product rate (FLOP/s) if the step's matmuls do ``matmul_flops``.

        Raises:
            ValueError: ``matmul_flops`` negative, or no matmul time.
        """
        number("matmul_flops", matmul_flops, minimum=0)
        if self.matmul_s <= 0:
            raise ValueError("the breakdown holds no matmul time")
        return matmul_flops / self.matmul_s


def step_breakdown(kernels: Sequence[tuple[str, float]]) -> StepBreakdown:
    """Sum a profiled step's kernels by kind (:func:`kernel_kind`).

    Args:
        kernels: ``[(name, seconds), ...]``, each kernel once, e.g. ``train(...,
            profile=True).extra["device_kernels"]`` (not ``extra["kernels"]``, which is cut to
            12 rows and, on a GPU, lists operators beside their kernels).

    Raises:
        ValueError: a negative time.
    """
    sums = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for name, seconds in kernels:
        if seconds < 0:
            raise ValueError(f"kernel {name!r} has a negative time {seconds}")
        sums[kernel_kind(name)] += float(seconds)
    return StepBreakdown(sums["matmul"], sums["attention"], sums["other"])


@dataclass(frozen=True)
class KernelChanges:
    """How two profiled steps' kernel times differ (``after`` less ``before``), by kind and by
    name.

    Attributes:
        by_kind: ``{"matmul": s, "attention": s, "other": s}``, the net change of each kind
            (:func:`kernel_kind`); they add up to :attr:`total_s`.
        grew: ``[(name, s), ...]``, the names whose time grew most, the largest first (each > 0).
        shrank: ``[(name, s), ...]``, the names whose time fell most, the largest fall first
            (each < 0). A name that exists in one step only counts as 0 s in the other: a
            kernel that changed its name (cuBLAS names carry the data type) shows up twice,
            once in each list.
    """

    by_kind: dict
    grew: tuple
    shrank: tuple

    @property
    def total_s(self) -> float:
        """Net change of all kernel time (s)."""
        return sum(self.by_kind.values())


def kernel_changes(before: Sequence[tuple[str, float]], after: Sequence[tuple[str, float]],
                   n: int = 3) -> KernelChanges:
    """Where two profiled steps' kernel times differ: the net change by kind and the ``n``
    names that grew most beside the ``n`` that fell most (a list of growths alone hides the
    falls that offset them: the 6 Dec review found three growths of +79 ms in a total of +26).

    Args:
        before, after: ``[(name, seconds), ...]``, each kernel once, as
            ``extra["device_kernels"]`` holds them.
        n: how many names to keep on each side (>= 1).

    Raises:
        ValueError: ``n`` < 1, or a negative time.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    sums = []
    for label, rows in (("before", before), ("after", after)):
        d: dict[str, float] = {}
        for name, seconds in rows:
            if seconds < 0:
                raise ValueError(f"{label}: kernel {name!r} has a negative time {seconds}")
            d[name] = d.get(name, 0.0) + float(seconds)
        sums.append(d)
    b, a = sums
    delta = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}
    kinds = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for k, d in delta.items():
        kinds[kernel_kind(k)] += d
    order = sorted(delta.items(), key=lambda kv: (-kv[1], kv[0]))
    grew = tuple((k, d) for k, d in order if d > 0)[:n]
    shrank = tuple((k, d) for k, d in reversed(order) if d < 0)[:n]
    return KernelChanges(kinds, grew, shrank)


def weight_matmul_flops(params: int, tokens: int) -> float:
    """FLOPs of a training step's weight matrix products: ``6 x params x tokens`` (2 per weight
    and token forward, 4 backward; Kaplan et al., 2020). ``params`` as
    :meth:`perflab.gpt2.model.GPT.num_params` counts them (the tied head included, the position
    embedding left out); attention's ``QK^T`` and ``AV`` are not included.

    Raises:
        ValueError: a non-positive argument.
    """
    number("params", params, minimum=1)
    number("tokens", tokens, minimum=1)
    return 6.0 * params * tokens


def attention_kernel(kernels: Sequence[tuple[str, float]]) -> str:
    """Which fused attention ran, from a profiled step's kernel names: ``"cuDNN"``,
    ``"flash"``, ``"memory-efficient"``, ``"math"`` (no fused kernel) or ``"unknown"``."""
    names = " ".join(k.lower() for k, _ in kernels)
    if "cudnn" in names and ("attention" in names or "sdpa" in names or "fmha" in names):
        return "cuDNN"
    if "flash" in names:
        return "flash"
    if "efficient" in names or "fmha" in names:
        return "memory-efficient"
    if "softmax" in names:
        return "math"
    return "unknown"
