"""Lab 6's checks: the fast loop gives the same result, and is faster; its copies do not wait;
an optimizer that updates all tensors at once."""

from __future__ import annotations

import copy
import math
import os
import traceback
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from perflab.labs.standin import stand_in_device
from perflab.internals.hostsync import TORCH_DIR, is_library
from perflab.labs.exercises import ExerciseFailed, as_float, check_ratio_at_least, not_done
from perflab.speed.tolerance import same_losses

__all__ = ["blocking_copies", "check_async_copies", "check_losses_on_device", "check_same_and_faster",
           "multi_tensor", "say_speedup"]


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


_PERFLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _ToHost(Exception):
    """Raised inside the probe at the first value that leaves the stand-in device."""


class _HostReads(TorchDispatchMode):
    """Stops at the first operator that brings a value of the stand-in device to the host: one
    whose output (or in-place target) is a CPU tensor while an input is on the stand-in
    (``losses[i] = loss`` into a host tensor, ``.cpu()``, ``torch.tensor`` of device values),
    or that reads one value for Python (``_local_scalar_dense``). It records the operator and
    the line of the student's code that called it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.found: tuple[str, str] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if any(a.device == self.device for a in inputs):
            schema = getattr(func, "_schema", None)
            written = [a for a, arg in zip(args, getattr(schema, "arguments", []))
                       if isinstance(a, torch.Tensor) and arg.alias_info is not None
                       and arg.alias_info.is_write]
            target = kwargs.get("device")
            if (func is torch.ops.aten._local_scalar_dense.default
                    or any(w.device.type == "cpu" for w in written)
                    or target is not None and torch.device(target).type == "cpu"):
                self.found = (str(func.overloadpacket.__name__), _student_line())
                raise _ToHost()
        return func(*args, **kwargs)


def _student_line(frames: list | None = None) -> str:
    """The innermost line outside torch and perflab (the student's) of ``frames`` (default: the
    call stack)."""
    for frame in reversed(frames if frames is not None else traceback.extract_stack()):
        if not is_library(frame.filename, (TORCH_DIR, _PERFLAB_DIR)):
            return (frame.line or "").strip()
    return ""


#: what the meta device says when code needs a tensor's values on the host: a Python number
#: (``item``), a copy out, or an output whose size depends on the data (``nonzero``)
_NEEDS_VALUES = ("cannot be called on meta tensors", "Cannot copy out of meta tensor",
                 "data-independent implementation does not exist")


def check_losses_on_device(fn: Callable[..., Any], model: torch.nn.Module, xs: torch.Tensor,
                           ys: torch.Tensor, ok: torch.Tensor, lr: float = 0.01) -> bool:
    """Lab 6, exercise 1: the loop keeps its losses on the device, and returns them as one
    tensor there.

    On a GPU a loss written into a host tensor (``torch.empty(len(xs))`` with no device, filled
    step by step) is a copy off the GPU each step, and each copy waits for the GPU; on a CPU
    the host *is* the device, and neither the sync counter nor a timing can see it. The check
    runs ``fn(model', SGD(model'), xs', ys', ok')`` once with everything on the ``meta``
    device (shapes, no data), which stands in for a GPU on any machine: code that creates its
    tensors "on the device" (``device=xs.device``, ``torch.stack``, or the notebook's ``dev``,
    which names the stand-in for the duration: :func:`perflab.labs.standin.stand_in_device`)
    follows it; a tensor created without a device lands on the host, and the first value copied
    into it is caught (:class:`_HostReads`), as is any other value of the device brought to
    the host. ``model`` is deep-copied (the caller's is untouched). Prints one sentence and
    returns True.

    Raises:
        ExerciseFailed: a device value reached the host (the message names the operator and
            your line), or the result is not one tensor on the device.
    """
    meta = torch.device("meta")
    probe = copy.deepcopy(model).to(meta)
    opt = torch.optim.SGD(probe.parameters(), lr=lr)
    reads = _HostReads(meta)
    # the notebook's device names (dev) follow the stand-in on a GPU as on a CPU: a loss
    # copied into a cuda tensor from meta would read as a host read
    with stand_in_device(fn, meta, replaced=xs.device):
        try:
            with reads:
                out = fn(probe, opt, xs.to(meta), ys.to(meta), ok.to(meta))
        except (NotImplementedError, RuntimeError) as err:
            first = (str(err).splitlines() or [""])[0]
            if any(k in first for k in _NEEDS_VALUES):
                line = _student_line(traceback.extract_tb(err.__traceback__))
                raise ExerciseFailed(
                    "✗ Exercise 1: your loop needs values of the device on the host"
                    + (f" (at `{line}`)" if line else "") + f": {first[:80]}. On a GPU that "
                    "waits for the GPU. Keep the losses on the device.") from None
            # the loop ran on real tensors before this check: what fails here is an operator
            # the meta device lacks, not the student's code; said, not hidden
            print(f"(the check could not run train_quiet on the meta device: {first[:120]}; "
                  "where its losses live is not checked)")
            return True
        except _ToHost:
            op, line = reads.found
            raise ExerciseFailed(
                f"✗ Exercise 1: a value of the device reaches the host (aten.{op}"
                + (f", at `{line}`" if line else "") + "): on a GPU that copy waits for the GPU, "
                "a sync each time. Keep the losses on the device: create their tensor with "
                "device=xs.device, or torch.stack them after the loop.") from None
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(f"✗ Exercise 1: train_quiet must return one tensor of the losses "
                             f"(torch.stack them), got {type(out).__name__}.")
    if out.device != meta:
        raise ExerciseFailed("✗ Exercise 1: train_quiet returns its losses on the host: on a GPU "
                             "that copy waits for the GPU. Return them as one tensor on the device "
                             "(the caller reads them once, after the loop).")
    print("✓ Exercise 1: run on the meta device (a stand-in for a GPU), your loop keeps every "
          "loss on the device and returns them there.")
    return True


def say_speedup(ratio: float, pair_ratios: Sequence[float], device: torch.device | str,
                checked_on_cpu: bool = False) -> str:
    """One sentence for a measured speedup, never the bare ratio: the median of the paired
    blocks (:func:`perflab.core.paired.paired_ratio`), the range of the pairs, and what they
    decide: faster (or slower) in every pair, or within this machine's noise when the pairs
    fall on both sides of 1. On a CPU, where a check leaves the speed part to a GPU
    (``checked_on_cpu`` False), it says that the ratio is not checked and why: the effect does
    not exist there. Prints the sentence and returns it.

    Raises:
        ValueError: no pair ratios, or one that is not a positive number.
    """
    pairs = [float(r) for r in pair_ratios]
    if not pairs or any(not math.isfinite(r) or r <= 0 for r in pairs):
        raise ValueError(f"pair_ratios must be positive numbers, got {pair_ratios!r}")
    lo, hi = min(pairs), max(pairs)
    if lo > 1:
        decided = "faster in every pair"
    elif hi < 1:
        decided = "slower in every pair"
    else:
        decided = "within this machine's noise: the pairs fall on both sides of 1"
    text = (f"speedup {as_float('speedup', ratio):.2f}x, the median of {len(pairs)} pairs "
            f"({lo:.2f}x to {hi:.2f}x): {decided}")
    if torch.device(device).type != "cuda" and not checked_on_cpu:
        text += ("; not checked on a CPU, where the effect this exercise removes does not exist "
                 "(the host is the device)")
    print(text + ".")
    return text + "."
