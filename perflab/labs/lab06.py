"""Lab 6's checks: the fast loop gives the same result, and is faster; its copies do not wait;
an optimizer that updates all tensors at once."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from perflab.labs.exercises import ExerciseFailed, as_float, check_ratio_at_least, not_done
from perflab.speed.tolerance import same_losses

__all__ = ["blocking_copies", "check_async_copies", "check_same_and_faster", "multi_tensor"]


def check_same_and_faster(what: str, slow_losses: Sequence[float], fast_losses: Sequence[float],
                          ratio: float, device: torch.device | str, min_ratio: float,
                          ratio_on_cpu: bool = False, rtol: float = 1e-3) -> bool:
    """A lab check: the fast loop gives the same result, and (where meaningful) is faster.

    ``what`` starts with the exercise's name, e.g. ``"Exercise 2: pinned copies"``; an answer
    that is still ``None`` raises "Exercise 2 is not done yet" (see :func:`perflab.labs.exercises.not_done`).

    * Result (every device): :func:`same_losses`: the same number of losses, each within ``rtol``
      of the given loop's at the same step. Reordered arithmetic passes (about 1e-6); a loop that
      trains on other batches, with another loss or another optimizer fails within a few steps.
    * Speed: ``ratio`` (slow time / fast time, measured in the same run with paired, interleaved
      blocks: :func:`perflab.core.paired.paired_ratio`) at least ``min_ratio``. Checked on a CUDA
      device always, on a CPU only when ``ratio_on_cpu`` (for effects that exist there, such as
      per-call overhead); otherwise the check says that the speed part needs a GPU.

    Prints one sentence and returns True on success.

    Raises:
        perflab.labs.exercises.ExerciseFailed: missing answers, a changed result or too small a
            speedup (the message says which).
    """
    if slow_losses is None or fast_losses is None or ratio is None:
        number = what.split(":")[0].replace("Exercise", "").strip() or "?"
        not_done(number, "run your version of the loop first (its result is still None)")
    fast = [as_float(f"{what}: your loop's loss", v) for v in list(fast_losses)]
    slow = [as_float(f"{what}: the given loop's loss", v) for v in list(slow_losses)]
    if not fast or len(fast) != len(slow):
        raise ExerciseFailed(f"✗ {what}: expected {len(slow)} losses, got {len(fast)}.")
    if not all(math.isfinite(v) for v in fast):
        raise ExerciseFailed(f"✗ {what}: a loss is not finite.")
    if not same_losses(slow, fast, rtol):
        step = next(i for i, (a, b) in enumerate(zip(slow, fast)) if abs(a - b) > rtol * abs(a))
        raise ExerciseFailed(f"✗ {what}: the result changed: at step {step} the loss is "
                             f"{fast[step]:.4f} against {slow[step]:.4f} (tolerance "
                             f"{rtol:g}, relative).")
    dev = torch.device(device)
    if dev.type == "cuda" or ratio_on_cpu:
        check_ratio_at_least(ratio, 1.0, min_ratio, f"{what} (speedup, same result)")
    else:
        print(f"✓ {what}: same result (every loss within {rtol:g}); the speed part "
              f"(≥ {min_ratio:g}x) needs a GPU and is not checked on a {dev.type}.")
    return True


def multi_tensor(optimizer: torch.optim.Optimizer) -> bool:
    """True when ``optimizer`` updates all its parameters with multi-tensor or fused kernels on a
    GPU: ``fused=True``, ``foreach=True``, or ``foreach`` left at its default (None), which
    PyTorch turns into foreach for CUDA parameters. Only an explicit ``foreach=False`` without
    ``fused`` is the per-tensor for-loop (on a CPU every implementation loops, so the request is
    what counts)."""
    d = optimizer.defaults
    return bool(d.get("fused")) or d.get("foreach") is not False


def _device_named(args: tuple, kwargs: dict) -> bool:
    """A ``.to(...)`` call that names a device (``x.to(torch.float32)`` does not copy anywhere)."""
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (torch.device, str)):
            return True
        if isinstance(a, torch.Tensor):          # x.to(other): other's device
            return True
    return False


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("non_blocking", False)) or any(a is True for a in args[1:])


class _CopyCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.blocking = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        src = args[0] if args else None
        if name in ("to", "cuda") and isinstance(src, torch.Tensor) and src.device.type == "cpu":
            if (name == "cuda" or _device_named(args, kwargs)) and not _non_blocking(args, kwargs):
                self.blocking += 1
        elif name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor) \
                and args[1].device.type == "cpu" and not _non_blocking(args[1:], kwargs):
            self.blocking += 1
        return func(*args, **kwargs)


def blocking_copies(fn: Callable[..., Any], *args, **kwargs) -> int:
    """How many copies of a CPU tensor ``fn(*args, **kwargs)`` makes without
    ``non_blocking=True``: ``x.to(device)``, ``x.cuda()``, ``dst.copy_(x)``.

    Such a copy makes the host wait until it is done (PyTorch copies, then synchronizes the
    stream), pinned memory or not: pinning makes a copy faster, ``non_blocking=True`` makes it
    asynchronous. The count is taken from the Python calls (a ``TorchFunctionMode``), so it works
    on any device; a ``.to`` that names no device (a dtype change) is not a copy and not counted.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with _CopyCounter() as counter:
        fn(*args, **kwargs)
    return counter.blocking


def check_async_copies(fn: Callable[..., Any], *args, **kwargs) -> bool:
    """Lab 6, exercise 2: the loop's copies to the GPU are asynchronous (none without
    ``non_blocking=True``). Prints one sentence and returns True.

    Raises:
        perflab.labs.exercises.ExerciseFailed: a copy that waits (the count says how many).
    """
    n = blocking_copies(fn, *args, **kwargs)
    if n:
        raise ExerciseFailed(f"✗ Exercise 2: your loop made {n} copies without "
                             "non_blocking=True: each waits until it is done, pinned or not, "
                             "so the host still stops at every batch.")
    print("✓ Exercise 2: every copy in your loop is asynchronous (non_blocking=True).")
    return True
