"""Training memory measured: saved tensors, peaks, phases, the profiler's timeline, state bytes.

* :func:`saved_bytes`: saved tensors through ``torch.autograd.graph.saved_tensors_hooks`` (via
  :mod:`perflab.internals.autograd`); :func:`packed_bytes`: what a pack hook sees, every save
  (what ``save_on_cpu`` copies) against the distinct storages;
* :func:`peak_bytes`: the CUDA caching allocator's counters on a GPU, the profiler's memory events
  on a CPU (where that allocator does not exist); :func:`measure_phases` the same for forward,
  backward and the optimizer step;
* :func:`memory_timeline` (the profiler's categories over time), :func:`copy_profile`
  (host-device copies), :func:`state_bytes` (parameters, gradients and optimizer state, counted
  tensor by tensor);
* did a technique keep the training? :func:`max_relative_difference` and
  :func:`gradient_tolerance` check that it left the gradients alone.

The techniques themselves (the training step, gradient accumulation, checkpointing, the optimizer
in the backward pass) are written on chapter 7's page and exported to :mod:`perflab.memory.steps`
and :mod:`perflab.memory.checkpointing`. Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
# the memory timeline export's column order (a private table of torch.profiler)
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

from perflab.core.native import NativeStderr
from perflab.core.profiler import trace_events
from perflab.core.timing import Stopwatch
from perflab.core.validate import number
from perflab.internals.autograd import saved_tensors
from perflab.memory.model import BlockStack, BlockStackConfig
from perflab.memory.steps import train_step

__all__ = ["warm_up", "saved_bytes", "packed_bytes", "Peak", "peak_bytes", "PhaseMemory", "measure_phases",
           "memory_timeline", "copy_profile", "state_bytes", "max_relative_difference",
           "gradient_tolerance"]


def warm_up(device: torch.device | str) -> None:
    """One training step of a tiny :class:`BlockStack` on ``device``, so that libraries allocate
    what they keep before a measurement starts.

    cuBLAS and cuBLASLt take their workspaces (tens of MiB on recent GPUs) from the caching
    allocator at their first matrix products and keep them for the process's life; a static
    memory measurement that starts before them counts them as the model's.
    """
    dev = torch.device(device)
    tiny = BlockStack(BlockStackConfig(d_model=64, n_heads=4, n_layers=1, seq_len=16)).to(dev)
    x = torch.randn(1, 16, 64, device=dev)
    train_step(tiny, torch.optim.Adam(tiny.parameters()), x, x)


def saved_bytes(fn: Callable[..., Any], *args, exclude: Iterable[torch.Tensor] = (), **kwargs) -> int:
    """Bytes of the distinct storages autograd saved while running ``fn(*args, **kwargs)``.

    Uses :func:`perflab.internals.autograd.saved_tensors` (``saved_tensors_hooks``) and leaves out the
    storages of tensor arguments and of ``exclude`` (pass ``model.parameters()``: the weights
    exist anyway). Works on every device. Under ``torch.utils.checkpoint`` the checkpoint's own
    hooks take over inside each checkpointed region, so that region's saves are not seen: use
    :func:`peak_bytes` for checkpointed models.

    Raises:
        TypeError: ``fn`` is not callable.
        RuntimeError: called with autograd disabled.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    rec = saved_tensors(fn, *args, **kwargs)
    seen: dict[int, int] = {}
    for t in rec.tensors:
        if not t.is_input and t.storage_ptr not in excluded:
            seen[t.storage_ptr] = max(seen.get(t.storage_ptr, 0), t.storage_nbytes)
    return sum(seen.values())


def packed_bytes(fn: Callable[..., Any], *args, **kwargs) -> dict[str, int]:
    """What a pack hook (``torch.autograd.graph.saved_tensors_hooks``) sees while autograd
    records ``fn(*args, **kwargs)``: ``{"every": bytes over every pack call, "distinct": bytes
    of the distinct storages saved, "calls": pack calls}``.

    A pack hook is called once per *saved reference*: a tensor saved by two operations (a
    softmax's output, saved by the softmax and by the product with ``v``) is packed twice, and
    the weights the Linear layers save are packed too. ``every`` is what
    ``torch.autograd.graph.save_on_cpu`` copies to the host (each call copies its tensor's
    ``numel * element_size`` bytes); ``distinct`` counts each storage once, whoever saved it
    (the count of :func:`saved_bytes`, with the inputs and parameters included).

    Raises:
        TypeError: ``fn`` is not callable.
        RuntimeError: called with autograd disabled.
    """
    rec = saved_tensors(fn, *args, **kwargs)
    seen: dict[int, int] = {}
    for t in rec.tensors:
        seen[t.storage_ptr] = max(seen.get(t.storage_ptr, 0), t.storage_nbytes)
    return {"every": sum(t.nbytes for t in rec.tensors), "distinct": sum(seen.values()),
            "calls": len(rec.tensors)}


def _chrome_trace(fn: Callable[[], Any]) -> tuple[list[dict], Any]:
    with NativeStderr(), profile(activities=[ProfilerActivity.CPU],
                                          profile_memory=True) as prof:
        out = fn()
    return trace_events(prof), out


def _cpu_memory_events(events: list[dict]) -> list[dict]:
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    return sorted(mem, key=lambda e: e["ts"])


@dataclass(frozen=True)
class Peak:
    """Memory over one call, relative to what was allocated when it started (bytes).

    Attributes:
        peak: the highest allocated memory above the starting level.
        net: allocated at the end minus at the start (negative when the call freed memory).
        source: ``"cuda caching allocator"`` or ``"profiler memory events (cpu)"``.
    """

    peak: int
    net: int
    source: str


def peak_bytes(fn: Callable[[], Any], device: torch.device | str) -> tuple[Peak, Any]:
    """Run ``fn()`` once and return (:class:`Peak`, its result).

    On CUDA: ``torch.cuda.reset_peak_memory_stats`` before, then ``max_memory_allocated`` minus
    the ``memory_allocated`` at the start (the caching allocator's own counters, in 512-byte
    rounded blocks). On a CPU there is no caching allocator: the profiler (``profile_memory=True``)
    records every allocation and free of the CPU allocator with a running total, and the peak is
    the highest running total (allocations outside PyTorch's allocator, e.g. a BLAS library's
    scratch space, are not seen).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        return Peak(torch.cuda.max_memory_allocated(dev) - start,
                    torch.cuda.memory_allocated(dev) - start, "cuda caching allocator"), out
    events, out = _chrome_trace(fn)
    mem = _cpu_memory_events(events)
    if not mem:
        return Peak(0, 0, "profiler memory events (cpu)"), out
    # the running total is the CPU allocator's since the first profiled allocation of the process:
    # the level before this call is the first event's total minus its own size
    start = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    totals = [e["args"]["Total Allocated"] - start for e in mem]
    return Peak(int(max([0] + totals)), int(totals[-1]), "profiler memory events (cpu)"), out


@dataclass(frozen=True)
class PhaseMemory:
    """One phase of a training step: its peak above, and net change from, its starting level (bytes)."""

    phase: str
    peak: int
    net: int


def measure_phases(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, device: torch.device | str) -> list[PhaseMemory]:
    """Peak and net memory of forward (with the MSE loss), backward and ``optimizer.step()``.

    Gradients are set to None first, so the backward pass allocates them. Each phase is measured
    by :func:`peak_bytes` (CUDA counters on a GPU, profiler events on a CPU).

    Returns:
        three :class:`PhaseMemory`, in order ``forward``, ``backward``, ``step``.
    """
    optimizer.zero_grad(set_to_none=True)
    fwd, loss = peak_bytes(lambda: F.mse_loss(model(x), y), device)
    bwd, _ = peak_bytes(loss.backward, device)
    del loss
    step, _ = peak_bytes(optimizer.step, device)
    return [PhaseMemory("forward", fwd.peak, fwd.net), PhaseMemory("backward", bwd.peak, bwd.net),
            PhaseMemory("step", step.peak, step.net)]


def memory_timeline(fn: Callable[[], Any], device: torch.device | str
                    ) -> tuple[list[float], dict[str, list[int]]]:
    """The profiler's memory timeline of ``fn()``: bytes of each category over time.

    Runs ``fn`` under ``torch.profiler`` with ``profile_memory``, ``record_shapes`` and
    ``with_stack`` (the memory profiler needs all three) and reads
    ``export_memory_timeline(<file>.json, device)``: the profiler classifies each tensor as a
    parameter, optimizer state, input, temporary, activation, gradient or autograd detail from how
    it is used (``torch/profiler/_memory_profiler.py``). Recent PyTorch marks the export
    deprecated in favour of memory snapshots; its warning is silenced here, nothing else.

    Returns:
        ``(times, {category: bytes at each time})``: times in milliseconds from the first event;
        category names as the profiler spells them (``"ACTIVATION"``, ``"GRADIENT"``, ...,
        ``"UNKNOWN"`` for tensors it could not classify).
    """

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with NativeStderr(), profile(activities=activities, profile_memory=True,
                                          record_shapes=True, with_stack=True) as prof:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    with tempfile.TemporaryDirectory(prefix="perflab_timeline_") as tmp:
        path = Path(tmp) / "timeline.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            prof.export_memory_timeline(str(path), device=str(dev))
        times, sizes = json.loads(path.read_text())
    names = ["UNKNOWN" if c is None else c.name for c in _CATEGORY_TO_INDEX]
    t0 = times[0] if times else 0
    series = {name: [row[k + 1] for row in sizes] for k, name in enumerate(names)}
    return [(t - t0) / 1e3 for t in times], series


def copy_profile(fn: Callable[[], Any]) -> dict[str, float]:
    """Where the host-device copies of ``fn()`` went, from a ``torch.profiler`` trace (CUDA).

    Returns ``{"copy_s", "copy_bytes", "d2h_s", "h2d_s", "host_alloc_s", "wall_s"}``: the summed
    duration and bytes of the device's memcpy events (device to host and host to device), the
    host's time in ``cudaHostAlloc``/``cudaMallocHost`` (pinned allocations), and the wall time
    of the profiled call (synchronized).

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("copy_profile needs a CUDA GPU: it reads the device's copies")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sw = Stopwatch("cuda").start()
        fn()
        wall = sw.elapsed()
    events = trace_events(prof)
    out = {"copy_s": 0.0, "copy_bytes": 0.0, "d2h_s": 0.0, "h2d_s": 0.0, "host_alloc_s": 0.0,
           "wall_s": wall}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name, cat, dur = str(e.get("name", "")), str(e.get("cat", "")).lower(), e["dur"] * 1e-6
        if cat == "gpu_memcpy" and ("DtoH" in name or "HtoD" in name):
            out["copy_s"] += dur
            out["copy_bytes"] += float(e.get("args", {}).get("bytes", 0))
            out["d2h_s" if "DtoH" in name else "h2d_s"] += dur
        elif cat == "cuda_runtime" and name in ("cudaHostAlloc", "cudaMallocHost"):
            out["host_alloc_s"] += dur
    return out


def _storages_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                device: torch.device | str | None = None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state, counted tensor by tensor (distinct storages).

    Only tensors on ``device`` count (default: the parameters' device), so Adam's ``step`` counters,
    which live on the CPU when the model is on a GPU, are left out there.

    Returns:
        ``{"params", "grads", "optimizer", "total"}``.
    """
    params = list(model.parameters())
    dev = torch.device(device) if device is not None else (params[0].device if params else torch.device("cpu"))
    on = lambda ts: [t for t in ts if isinstance(t, torch.Tensor) and t.device == dev]  # noqa: E731
    out = {"params": _storages_bytes(on(params)),
           "grads": _storages_bytes(on(p.grad for p in params if p.grad is not None)),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = _storages_bytes(on(v for st in optimizer.state.values() for v in st.values()))
    out["total"] = sum(out.values())
    return out


def max_relative_difference(a: Iterable[torch.Tensor | None], b: Iterable[torch.Tensor | None]) -> float:
    """``max |a_i - b_i| / max |b_i|`` over matching tensors (e.g. two models' gradients).

    Raises:
        ValueError: different numbers of tensors, mismatched shapes, or a None on one side only.
    """
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"got {len(a)} and {len(b)} tensors")
    diff, scale = 0.0, 0.0
    for i, (u, v) in enumerate(zip(a, b)):
        if (u is None) != (v is None):
            raise ValueError(f"tensor {i} is None on one side only")
        if u is None:
            continue
        if u.shape != v.shape:
            raise ValueError(f"tensor {i}: shapes {tuple(u.shape)} and {tuple(v.shape)} differ")
        diff = max(diff, (u.detach().double() - v.detach().double()).abs().max().item())
        scale = max(scale, v.detach().double().abs().max().item())
    return diff / scale if scale else diff


def gradient_tolerance(spread: float, factor: float = 100.0) -> float:
    """The tolerance of a "same gradients" check, from a measured rounding spread.

    ``spread`` is :func:`max_relative_difference` between two computations that are equal in exact
    arithmetic and differ only in the order of their sums (the same batch with its samples
    permuted). A right reordering, such as accumulation over micro-batches, differs by a small
    multiple of it; the tolerance is ``factor`` times the spread, and at least ``factor`` times
    float32's machine epsilon (a spread that happened to be 0). The mistakes the checks exist for
    (gradients of part of the batch, or scaled by the number of micro-batches) differ by 1e-2 and
    more, orders of magnitude above (``tests/test_memory.py`` shows both rejected).

    Raises:
        ValueError: a spread that is negative or not finite, or a ``factor`` below 1.
    """
    number("spread", spread, minimum=0)
    number("factor", factor, minimum=1)
    return factor * max(spread, torch.finfo(torch.float32).eps)
