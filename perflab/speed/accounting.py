"""What one training step costs each side of the machine: the GPU's busy time and the host's waits.

Chapter 6 predicts a step from its parts. The host's parts are times of host work (issue times,
CPU operators, blocking copies), measured with :mod:`perflab.core.timing` and
:func:`perflab.internals.overhead.issue_time`; the device's part and the waits are read here:

* :func:`device_busy`: from torch.profiler (CUPTI), the time the GPU spends per call in kernels,
  in copies, and in either (the union of the two, so a copy that runs under a kernel on another
  stream counts once), with the number of kernels;
* :func:`syncs_per_call`: how many times a call makes the host wait for the GPU, from PyTorch's
  sync debug mode on a GPU (the ground truth) or from the Python-level calls on a CPU
  (:func:`perflab.internals.hostsync.count_host_syncs`, a lower bound);
* :func:`drain_cost`: what one of those waits adds to a step whose GPU has kept up with the host
  (a tiny kernel issued and waited for, less the host's cost to issue it): the round trip of a
  synchronization, which a step pays once per sync on top of the larger of its host and GPU time;
* :func:`sync_point_cost`: what one sync point as a loop writes it adds to a step (a short kernel
  whose one-element result is read on the host, ``bool(torch.isnan(loss).any())``): its issue, the
  wait and the device-to-host read, the mechanism of ``.item()`` and ``if tensor:``.

Units: seconds; counts per call.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from perflab.core.profiler import union
from perflab.core.timing import seconds_per_call, synchronize
from perflab.core.validate import positive_int
from perflab.internals import hostsync
from perflab.internals.overhead import cuda_graph_op_rate, issue_time
from perflab.record.numbers import fmt

__all__ = ["device_busy", "drain_cost", "graph_gap", "residual", "sync_point_cost",
           "syncs_per_call"]


def device_busy(fn: Callable[[], Any], calls: int = 3, warmup: int = 1) -> dict[str, float]:
    """The GPU's work per call of ``fn()``, read from torch.profiler's device activity.

    ``fn`` runs ``warmup`` times, then ``calls`` times under the profiler (the GPU synchronized
    before and after). Kernels are the device events that are not memory copies or sets; copies
    are the ``Memcpy`` events (host to device, device to host, device to device).

    Returns:
        per call: ``{"kernels_s": summed kernel durations, "copies_s": summed copy durations,
        "busy_s": the union of both (a copy under a kernel counts once), "span_s": from the
        first device event's start to the last one's end (the GPU's time with its idle gaps,
        for calls that run back to back on the device), "kernels": kernels, "copies": copies}``.

    Raises:
        RuntimeError: no CUDA GPU, or the profiler saw no device activity.
        ValueError: ``calls`` < 1 or ``warmup`` < 0.
    """
    positive_int("calls", calls)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("device_busy needs a CUDA GPU; this machine has none")
    for _ in range(warmup):
        fn()
    synchronize("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        synchronize("cuda")
    kernels, copies = [], []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (e.time_range.start * 1e-6, e.time_range.end * 1e-6)
        if e.name.startswith("Memcpy"):
            copies.append(span)
        elif not e.name.startswith(("Memset", "[memory]")):
            kernels.append(span)
    if not kernels and not copies:
        raise RuntimeError("the profiler recorded no device activity for fn")
    spans = kernels + copies
    return {"kernels_s": sum(b - a for a, b in kernels) / calls,
            "copies_s": sum(b - a for a, b in copies) / calls,
            "busy_s": sum(b - a for a, b in union(spans)) / calls,
            "span_s": (max(b for _, b in spans) - min(a for a, _ in spans)) / calls,
            "kernels": len(kernels) / calls, "copies": len(copies) / calls}


def graph_gap(ops: int = 1000, calls: int = 200) -> float:
    """Seconds the GPU idles between two kernels replayed from a CUDA graph.

    :func:`perflab.internals.overhead.cuda_graph_op_rate` replays ``ops`` one-element ``x * 2``
    kernels; one over its rate is a tiny kernel's *whole* period, its own run plus the gap after
    it. The run is the profiler's duration of the same kernel (:func:`device_busy` over ``calls``
    calls); the gap is the period less that run (at least 0). A graph's step is then its
    kernels' profiled time plus this gap once per kernel, without counting each kernel twice.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: ``ops`` or ``calls`` < 1.
    """
    positive_int("ops", ops)
    positive_int("calls", calls)
    if not torch.cuda.is_available():
        raise RuntimeError("graph_gap needs a CUDA GPU; this machine has none")
    x = torch.randn(1, device="cuda")
    run = device_busy(lambda: x * 2, calls=calls)["kernels_s"]
    return max(1 / cuda_graph_op_rate(ops=ops) - run, 0.0)


def syncs_per_call(fn: Callable[[], Any], device: torch.device | str, calls: int = 2) -> float:
    """How many times one call of ``fn()`` makes the host wait for the device.

    On a CUDA device: the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` over ``calls``
    calls (:func:`perflab.internals.hostsync.sync_debug_warnings`), which include the waits
    inside PyTorch (a blocking copy from pageable memory, ``loss.backward()``'s own). Elsewhere:
    the Python-level calls that would synchronize on a GPU
    (:func:`perflab.internals.hostsync.count_host_syncs`), a lower bound.

    Raises:
        ValueError: ``calls`` < 1.
    """
    positive_int("calls", calls)

    def run() -> None:
        for _ in range(calls):
            fn()

    if torch.device(device).type == "cuda":
        _, found = hostsync.sync_debug_warnings(run)
        return len(found) / calls
    _, counts = hostsync.count_host_syncs(run)
    return sum(counts.values()) / calls


def drain_cost(device: torch.device | str, calls: int = 20) -> float:
    """Seconds one synchronization adds to a step whose GPU has kept up with its host.

    On a CUDA device: ``calls`` times, one tiny kernel is issued and waited for
    (``torch.cuda.synchronize``); from the time per call, the host's cost to issue the same kernel
    without waiting (:func:`perflab.internals.overhead.issue_time`) is taken away. What is left is
    the round trip of a drain: the kernel's launch latency and run, the completion reaching the
    host, the host resuming. A host-bound step that synchronizes ``n`` times a step pays about
    ``n`` of these on top of the larger of its host and GPU times (the GPU's backlog at a sync is
    then about one kernel). Measure it in the same rounds as the steps it predicts: it moves with
    the host's load. Elsewhere 0.0: a CPU runs its kernels on the calling thread, so there is
    nothing to wait for.

    Raises:
        ValueError: ``calls`` < 1.
    """
    positive_int("calls", calls)
    dev = torch.device(device)
    if dev.type != "cuda":
        return 0.0
    z = torch.zeros(1, device=dev)

    def tick() -> None:
        z.add_(1)

    def tick_and_wait() -> None:
        z.add_(1)
        synchronize(dev)

    tick_and_wait()
    waited = seconds_per_call(tick_and_wait, calls, dev)
    issued = issue_time(tick, dev, calls=calls, bursts=1)
    return max(waited - issued, 0.0)


def sync_point_cost(device: torch.device | str, calls: int = 20) -> float:
    """Seconds one sync point adds to a step whose GPU has kept up with its host.

    A sync point as a training loop writes it: a short check on a small tensor whose one-element
    result the host then reads (``bool(torch.isnan(loss).any())``: the kernels are issued, the
    host waits for them, the value is copied device to host, ``_local_scalar_dense`` as in
    ``.item()`` and ``if tensor:``). Timed ``calls`` times as a whole, synchronized, so it is the issue, the wait
    and the read together: what a step that adds this line pays, as long as the GPU has no
    queue of earlier work left when the host reaches it (a host-bound step). On a CPU the same
    line costs its operators' dispatch and nothing waits; that is what it returns there.

    Raises:
        ValueError: ``calls`` < 1.
    """
    positive_int("calls", calls)
    dev = torch.device(device)
    z = torch.zeros((), device=dev)

    def check() -> bool:
        return bool(torch.isnan(z).any())

    check()
    return seconds_per_call(check, calls, dev)


def residual(name: str, verdict: str, extra_s: float, host_s: float, gpu_s: float,
             syncs: float | None, drain_s: float, common_s: float = 0.0) -> str:
    """One clause saying what a step-time model left over for one rung.

    ``extra_s`` is measured minus predicted seconds a step; ``host_s`` and ``gpu_s`` the model's
    two sides; ``syncs`` the rung's counted syncs a step (None where not counted) and ``drain_s``
    one drain (:func:`drain_cost`). ``common_s`` is the part of ``extra_s`` that rungs without
    syncs also show (their measured-over-predicted ratio applied to this rung's prediction): a
    bias of the model on this host, which no sync explains. Where the rung synchronizes, only
    the excess over it (``extra_s - common_s``) is given in drains per sync: many drains per
    sync is a sync that found a queue of GPU work behind it, which a constant drain does not
    model; an excess at or below zero says the syncs cost no more than the rest of the step's
    model misses.
    """
    said = (f"{name}, {verdict}: {fmt(abs(extra_s), 's')} a step "
            f"{'more' if extra_s > 0 else 'less'} than predicted, its "
            f"{'host' if host_s >= gpu_s else 'GPU'} time the larger")
    if syncs and drain_s > 0:
        excess = extra_s - common_s
        if common_s:
            said += (f", {fmt(abs(excess), 's')} {'more' if excess > 0 else 'less'} than the "
                     "sync-free rungs' common residual")
        if excess > 0:
            said += f", {excess / syncs / drain_s:.1f} drains per sync of its {syncs:.0f}"
        else:
            said += f", nothing left for its {syncs:.0f} syncs"
    return said
