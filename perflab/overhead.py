"""Overhead: time that is neither arithmetic nor memory traffic (Python, dispatch, launches).

Rates here are operations per second; times are seconds. Every function runs on CPU and GPU.
"""

from __future__ import annotations

import time
import timeit
from typing import Callable, Sequence

import torch

from .timing import benchmark, synchronize

__all__ = ["batch_scaling", "cuda_graph_op_rate", "op_rate", "python_adds_per_second"]


def python_adds_per_second(n: int = 2_000_000) -> float:
    """Integer additions per second the Python interpreter does in a plain loop (``x = x + 1``).

    The loop's own bookkeeping is included, as it is in real code. Best of 3 runs of ``n`` adds.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    code = "x = 0\nfor _ in range(n):\n    x = x + 1"
    best = min(timeit.repeat(code, globals={"n": n}, number=1, repeat=3))
    return n / best


def op_rate(device: torch.device | str, numel: int = 1, ops: int = 5000) -> float:
    """Tiny-tensor PyTorch operator calls per second on ``device``: ``ops`` calls of ``y = x * 2``.

    With ``numel`` tiny the kernel does nothing, so the rate measures the per-call cost: the
    Python call, the dispatcher, allocation and, on CUDA, the kernel launch. On CUDA the clock
    stops after a synchronize, so queued launches are counted only once they have run.

    Raises:
        ValueError: ``numel`` or ``ops`` < 1.
    """
    if numel < 1 or ops < 1:
        raise ValueError(f"numel and ops must be >= 1, got numel={numel}, ops={ops}")
    dev = torch.device(device)
    x = torch.randn(numel, device=dev)
    for _ in range(100):  # warm-up: CUDA context, caching allocator, kernel load
        y = x * 2
    synchronize(dev)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(ops):
            y = x * 2
        synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    del y
    return ops / best


def cuda_graph_op_rate(numel: int = 1, ops: int = 1000, replays: int = 20) -> float:
    """Kernels per second when the same ``ops`` tiny ``x * 2`` operators replay from a CUDA graph.

    Capture records the kernels once; each replay launches the whole graph with one call, so
    Python, dispatch and per-kernel launch costs disappear. The rate is ``ops * replays`` over
    the wall time of ``replays`` replays (synchronized).

    Raises:
        RuntimeError: no CUDA device.
        ValueError: a non-positive argument.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_graph_op_rate needs a CUDA GPU; this machine has none")
    if min(numel, ops, replays) < 1:
        raise ValueError("numel, ops and replays must all be >= 1")
    x = torch.randn(numel, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as capture requires
        for _ in range(3):
            y = x
            for _ in range(ops):
                y = y * 2
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(ops):
            y = y * 2
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return ops * replays / best


def batch_scaling(
    make_step: Callable[[int], Callable[[], object]],
    batches: Sequence[int],
    device: torch.device | str,
) -> list[tuple[int, float]]:
    """Time one step at each batch size: the "double the batch, does time move?" test.

    ``make_step(batch)`` returns a zero-argument callable that runs one step at that batch size.
    Returns ``[(batch, seconds), ...]`` with medians from :func:`perflab.timing.benchmark`.
    If doubling the batch barely moves the time, the step is overhead-bound.

    Raises:
        ValueError: empty ``batches`` or a batch < 1.
    """
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be a non-empty list of positive sizes, got {list(batches)}")
    out = []
    for b in batches:
        step = make_step(b)
        out.append((b, benchmark(step, device, min_run_time_s=0.1)))
    return out
