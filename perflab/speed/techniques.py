"""Single-GPU training speed: what chapter 6 measures with, each usable on a CPU.

The techniques themselves (the prefetcher, BN folding, the CUDA-graph step, the ladder's loop)
are written on chapter 6's page; the page exports the ones later pages reuse (the generated modules
``perflab.speed.overlap``, ``perflab.speed.fusion`` and ``perflab.speed.graphs``). This module holds the workload and the measuring:

* :func:`synthetic_images` and :class:`SmallCNN`: a small image-classification task with
  learnable structure, built in memory (chapter 5 builds real loaders; this chapter needs only
  a fixed stream of batches so that every optimization sees the same data).
* :func:`op_count`: the operators a step dispatches (the unit of its host cost).
* :func:`final_loss`, :func:`loss_tolerance`, :func:`same_losses`: "the same result", with a
  tolerance that can fail (from the seed-to-seed spread of training, or from rounding).
* :func:`wave_model`: wave quantization of a tiled matrix product.
* :func:`overlap_fraction`, :func:`trace_intervals`, :func:`profile_overlap`: how much of the
  host-to-device copy time a profiler trace shows running under a kernel.
* :func:`capture_logs`: ``torch._logging`` output (for example why ``torch.compile`` skipped
  CUDA graphs) returned as text instead of written to stderr.
* :func:`wall_time`: synchronized wall-clock time of a loop, as a training loop runs it.

Units: samples per second, seconds; images are ``uint8`` in ``[0, 255]``, shape ``(N, 3, H, W)``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import tempfile
import time
import statistics
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from perflab.core.timing import Stopwatch, seconds_per_call, synchronize

__all__ = [
    "MEAN", "STD", "SmallCNN", "capture_logs", "final_loss",
    "graph_replay_semantics", "loss_tolerance", "normalize", "op_count",
    "overlap_fraction", "profile_overlap", "same_losses", "synthetic_images", "trace_intervals",
    "wall_time", "wave_model",
]

#: per-channel mean and standard deviation of :func:`synthetic_images` (in [0, 1] units)
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def synthetic_images(n: int, classes: int = 10, size: int = 32, noise: float = 60.0,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A CIFAR-like labelled image set with learnable structure, built in memory.

    Each class has a smooth random template (a 4 x 4 pattern per channel, upsampled); an image
    is ``128 + 50 * template[label] + noise * N(0, 1)``, rounded and clipped to ``uint8``. A
    small CNN learns it within a few hundred steps, but the noise keeps the loss well above 0.

    Returns:
        ``(images, labels)``: ``uint8`` of shape ``(n, 3, size, size)`` and ``int64`` of shape
        ``(n,)``, both on the CPU.

    Raises:
        ValueError: ``n``, ``classes`` or ``size`` < 1 (``size`` < 4), or negative ``noise``.
    """
    if n < 1 or classes < 2:
        raise ValueError(f"n must be >= 1 and classes >= 2, got n={n}, classes={classes}")
    if size < 4:
        raise ValueError(f"size must be >= 4 pixels, got {size}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 3, 4, 4, generator=g)
    templates = F.interpolate(templates, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.randint(0, classes, (n,), generator=g)
    images = 128 + 50 * templates[labels] + noise * torch.randn(n, 3, size, size, generator=g)
    return images.round().clamp(0, 255).to(torch.uint8), labels


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``uint8`` images to normalized ``float32``: ``(x / 255 - MEAN) / STD``, on their device.

    The same function runs on the CPU (the naive loader's work) and on the GPU (after a
    ``uint8`` copy), so both paths compute the same numbers. The mean and standard deviation
    tensors are made once per device, so the function can be captured in a CUDA graph.

    Raises:
        ValueError: ``images`` is not a 4-D tensor with 3 channels.
    """
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape (N, 3, H, W), got {tuple(images.shape)}")
    mean, std = _stats(images.device)
    return (images.float() / 255 - mean) / std


_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _stats(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # made once per device: a CPU-to-GPU copy may not run while a CUDA graph is being captured
    if dev not in _STATS:
        _STATS[dev] = (torch.tensor(MEAN, device=dev).view(1, 3, 1, 1),
                       torch.tensor(STD, device=dev).view(1, 3, 1, 1))
    return _STATS[dev]


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks (the last two with stride 2), global average pool, a linear head.

    Input ``(N, 3, H, W)`` float32; output ``(N, classes)`` logits. Channels ``width``,
    ``2 * width``, ``4 * width``; 11 parameter tensors, so an optimizer step that loops over
    parameters launches a few kernels per tensor.
    """

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        if width < 1 or classes < 2:
            raise ValueError(f"width must be >= 1 and classes >= 2, got {width}, {classes}")
        chans = (3, width, 2 * width, 4 * width)
        layers: list[nn.Module] = []
        for i in range(3):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, stride=1 if i == 0 else 2,
                                 padding=1, bias=False),
                       nn.BatchNorm2d(chans[i + 1]), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(chans[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def op_count(fn: Callable[[], object]) -> int:
    """The ATen operators one call of ``fn()`` dispatches: forward, backward (the autograd engine's
    threads inherit the counting mode) and optimizer alike, views and copies included.

    Each costs the host a dispatch (and on a GPU, most a kernel launch), so for a step whose
    kernels are short this count times the host's cost per operator is the step's time. Call
    ``fn`` once before (optimizer state, cuDNN's choices) so the count is a steady step's.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with _OpCounter() as counter:
        fn()
    return counter.count


def final_loss(losses: Sequence[float]) -> float:
    """Mean of the last fifth of ``losses`` (at least one): a training run's result, less noisy
    than its last step.

    Raises:
        ValueError: no losses, or one that is not finite.
    """
    values = [float(v) for v in losses]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError("losses must be a non-empty list of finite numbers")
    k = max(1, len(values) // 5)
    return sum(values[-k:]) / k


def loss_tolerance(seed_losses: Sequence[float], k: float = 3.0) -> float:
    """How far a final loss may be from a reference and still be "the same training": ``k``
    standard deviations of the final loss over runs that differ only in their random seed.

    Training from another seed is the spread a result has by nature; a speed optimization that
    only reorders floating-point sums moves the loss far less, and one that changes the training
    (fewer batches, one batch seen over and over, another learning rate) moves it by more than the
    seeds do. The floor, 1e-4 of the mean loss, keeps a degenerate spread (identical seeds) from
    rejecting rounding.

    Raises:
        ValueError: fewer than two losses, a loss that is not finite, or ``k`` not positive.
    """
    values = [float(v) for v in seed_losses]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError("need at least two finite final losses from different seeds")
    if not k > 0:
        raise ValueError(f"k must be > 0, got {k}")
    return max(k * statistics.stdev(values), 1e-4 * abs(statistics.fmean(values)))


def same_losses(reference: Sequence[float], losses: Sequence[float], rtol: float = 1e-3) -> bool:
    """True when ``losses`` follow ``reference`` step by step: same length, and every loss within
    ``rtol`` (relative) of the reference's at that step.

    For two loops that do the same arithmetic in another order (a fused optimizer, a mask turned
    into a weight, a copy made asynchronous) the losses differ by rounding, about 1e-6 relative,
    growing slowly over the steps; a loop that trains on other data or with another loss differs
    at its first steps by percents.

    Raises:
        ValueError: ``rtol`` not positive, or a loss that is not finite.
    """
    if not rtol > 0:
        raise ValueError(f"rtol must be > 0, got {rtol}")
    ref, got = [float(v) for v in reference], [float(v) for v in losses]
    if not all(math.isfinite(v) for v in ref + got):
        raise ValueError("losses must be finite")
    return len(ref) == len(got) and all(abs(a - b) <= rtol * abs(a) for a, b in zip(ref, got))


def wave_model(sizes: Sequence[int], plateau: float, sms: int, tile: tuple[int, int] = (128, 256)
               ) -> list[float]:
    """Predicted rate of an ``n x n`` matrix product for each ``n`` in ``sizes``: ``plateau``
    times the share of the last wave that is used, ``T / (sms * ceil(T / sms))`` with
    ``T = ceil(n / tile[0]) * ceil(n / tile[1])`` output tiles (wave quantization; NVIDIA's
    matrix multiplication guide).

    Raises:
        ValueError: a size, ``sms`` or a tile side that is not positive.
    """
    if sms < 1 or min(tile) < 1 or any(n < 1 for n in sizes):
        raise ValueError("sizes, sms and tile sides must be positive")
    out = []
    for n in sizes:
        tiles = math.ceil(n / tile[0]) * math.ceil(n / tile[1])
        out.append(plateau * tiles / (sms * math.ceil(tiles / sms)))
    return out


def overlap_fraction(copies: Sequence[tuple[float, float]],
                     computes: Sequence[tuple[float, float]]) -> float:
    """Fraction of the total copy time during which at least one compute interval runs.

    Intervals are ``(start, end)`` in any one time unit. Overlapping compute intervals are
    merged first, so a copy under two concurrent kernels is not counted twice.

    Raises:
        ValueError: no copies, zero total copy time, or an interval with ``end < start``.
    """
    for s, e in list(copies) + list(computes):
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e})")
    total = sum(e - s for s, e in copies)
    if not copies or total <= 0:
        raise ValueError("copies must hold at least one interval of positive length")
    merged: list[list[float]] = []
    for s, e in sorted(computes):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    covered = 0.0
    for cs, ce in copies:
        for ks, ke in merged:
            covered += max(0.0, min(ce, ke) - max(cs, ks))
    return covered / total


def trace_intervals(trace: dict | str | os.PathLike) -> tuple[list[tuple[float, float]],
                                                               list[tuple[float, float]]]:
    """Host-to-device copy and kernel intervals (microseconds) from a Chrome trace.

    ``trace`` is the JSON written by ``torch.profiler.profile(...).export_chrome_trace(path)``
    (a dict, or the path). Copies are events of category ``gpu_memcpy`` whose name contains
    ``HtoD``; kernels are events of category ``kernel``.

    Raises:
        ValueError: the trace has no ``traceEvents`` list.
    """
    if not isinstance(trace, dict):
        with open(trace) as f:
            trace = json.load(f)
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace with a 'traceEvents' list")
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


def profile_overlap(fn: Callable[[], object]) -> tuple[float, int, int]:
    """Profile ``fn()`` on the GPU and return ``(overlap fraction, copies, kernels)``.

    The trace is written to a temporary directory (removed afterwards) and read back with
    :func:`trace_intervals`; the fraction is :func:`overlap_fraction`.

    Raises:
        RuntimeError: no CUDA GPU, or the trace holds no host-to-device copy.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("profile_overlap needs a CUDA GPU")

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        copies, kernels = trace_intervals(path)
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
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    times = sorted(seconds_per_call(fn, 1, dev) for _ in range(reps))
    return times[0] if stat == "min" else times[len(times) // 2]
