"""Host-device synchronization: finding the calls that make the CPU wait for the GPU.

CUDA work is asynchronous: a PyTorch call on a GPU tensor queues a kernel and returns. A call
whose result the *host* needs (a Python number, a printed value, a tensor whose size depends
on the data) must wait until the queue has drained. Each such wait stops the CPU from running
ahead, so the GPU idles while the CPU issues the next operations. The PyTorch performance tuning
guide lists the usual culprits: ``print`` of a CUDA tensor, ``.item()``, copies to the host
(``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.numpy()``), ``nonzero()`` and Python control flow on
tensor values (PyTorch documentation, "Performance Tuning Guide", section "Avoid unnecessary
CPU-GPU synchronization", https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).

Two ways to find them:

* :func:`sync_debug_warnings` (GPU only) asks PyTorch itself: under
  ``torch.cuda.set_sync_debug_mode("warn")`` every synchronizing CUDA call emits a warning, and we
  record them.
* :func:`count_host_syncs` (any device) watches the *Python-level* calls with a
  ``torch.overrides.TorchFunctionMode`` and counts those that synchronize when their tensors are
  on a GPU, following the rules in :data:`SYNCING_CALLS`. It needs no GPU, so a CPU-only machine
  can still find the calls; it is a lower bound (calls made inside C++ are not seen), and on a GPU
  the sync debug mode is the ground truth.
"""

from __future__ import annotations

import linecache
import os
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["SYNCING_CALLS", "SYNC_WARNING_TEXT", "TORCH_DIR", "SyncWarning", "count_host_syncs",
           "is_library", "sync_debug_warnings", "sync_warnings_from", "warnings_by_line"]

# The text of the warning c10 emits for each synchronizing CUDA call in "warn" mode
# (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync). Setting the mode itself warns once that
# it "is a prototype feature and does not yet detect all synchronizing operations": that
# warning is about the mode, not a synchronization, and must not be counted.
SYNC_WARNING_TEXT = "called a synchronizing CUDA operation"

#: The folder of the installed torch package: frames in it are the library's, not the caller's.
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_THIS_FILE = os.path.abspath(__file__)
_WARNINGS_FILE = os.path.abspath(warnings.__file__)

# Calls that return a host value computed on the device, or an output whose size depends on the
# device's data; each must wait for the device. Names are those TorchFunctionMode receives.
SYNCING_CALLS: dict[str, str] = {
    "item": "returns a Python number",
    "tolist": "returns Python numbers",
    "numpy": "returns a host array",
    "cpu": "copies to host memory",
    "__bool__": "Python truth value of a tensor (if, while, and, or, not)",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__index__": "tensor used as a Python index",
    "__complex__": "complex(tensor)",
    "__repr__": "print(tensor) formats its values on the host",
    "__str__": "str(tensor) formats its values on the host",
    "__format__": "an f-string of a tensor formats its value on the host",
    "__contains__": "`value in tensor` returns a Python bool",
    "__array__": "conversion to a NumPy array",
    "nonzero": "output size depends on the data",
    "argwhere": "output size depends on the data",
    "masked_select": "output size depends on the data",
    "unique": "output size depends on the data",
    "unique_consecutive": "output size depends on the data",
    "equal": "returns a Python bool",
    "allclose": "returns a Python bool",
    "__getitem__": "indexing with a boolean mask (its output size depends on the data)",
    "where": "the one-argument form torch.where(cond) is nonzero(cond, as_tuple=True)",
    "to": "a copy to the CPU device, or a blocking copy of a CPU tensor to the GPU",
    "cuda": "a blocking copy of a CPU tensor to the GPU",
}


def _is_bool_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8)


def _targets_cpu(args: tuple, kwargs: dict) -> bool:
    candidates = list(args[1:]) + [kwargs.get("device")]
    for c in candidates:
        if isinstance(c, torch.device) and c.type == "cpu":
            return True
        if isinstance(c, str) and c.split(":")[0] == "cpu":
            return True
    return False


def _targets_gpu(args: tuple, kwargs: dict) -> bool:
    candidates = list(args[1:]) + [kwargs.get("device")]
    for c in candidates:
        if isinstance(c, torch.device) and c.type == "cuda":
            return True
        if isinstance(c, str) and c.split(":")[0] == "cuda":
            return True
    return False


def _blocking_upload(args: tuple, kwargs: dict) -> bool:
    """A CPU tensor copied to the GPU without ``non_blocking=True``: PyTorch copies it and waits
    for the copy (``cudaMemcpyAsync`` then a stream synchronization), pinned or not."""
    src = args[0] if args else None
    non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args[1:])
    return (isinstance(src, torch.Tensor) and src.device.type == "cpu" and not non_blocking
            and _targets_gpu(args, kwargs))


def _syncs(name: str, args: tuple, kwargs: dict) -> bool:
    if name not in SYNCING_CALLS:
        return False
    if name == "__getitem__":
        index = args[1] if len(args) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        return any(_is_bool_tensor(p) for p in parts)
    if name == "where":
        return len(args) + len(kwargs) == 1
    if name == "to":
        return _targets_cpu(args, kwargs) or _blocking_upload(args, kwargs)
    if name == "cuda":
        src = args[0] if args else None
        return (isinstance(src, torch.Tensor) and src.device.type == "cpu"
                and not kwargs.get("non_blocking", False))
    return True


class _SyncCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if _syncs(name, args, kwargs):
            self.counts[name] += 1
        return func(*args, **kwargs)


def count_host_syncs(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, Counter]:
    """Run ``fn(*args, **kwargs)`` and count the calls in it that synchronize when tensors are on a GPU.

    Every torch function and tensor method called from Python passes through a
    ``TorchFunctionMode``; the calls listed in :data:`SYNCING_CALLS` are counted (``__getitem__``
    only with a boolean-mask index, ``to`` towards the CPU or from a CPU tensor to a CUDA device
    without ``non_blocking=True``, ``where`` only in its one-argument form). Calls made from inside another call (for example by ``print`` formatting a
    tensor) are not seen separately: one ``print`` counts once. The count does not depend on the
    device, so it works on a CPU-only machine.

    Returns:
        ``(result of fn, Counter {call name: count})``.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with _SyncCounter() as counter:
        out = fn(*args, **kwargs)
    return out, counter.counts


@dataclass(frozen=True)
class SyncWarning:
    """One synchronizing CUDA call reported by sync debug mode.

    Attributes:
        filename: the Python file (or notebook cell) whose line made the call.
        lineno: the line number in it.
        line: that line's source text, when Python can find it ("" otherwise).
        message: the warning's text.
    """

    filename: str
    lineno: int
    line: str
    message: str


def is_library(filename: str, library_dirs: Sequence[str]) -> bool:
    """Whether a stack frame's ``filename`` belongs to a library rather than to the caller's code.

    True for frozen or empty file names, for this module and :mod:`warnings` themselves, and
    for any file at or under one of ``library_dirs`` (absolute folders, e.g.
    :data:`TORCH_DIR`); False otherwise (a notebook cell, a student's module).
    """
    if not filename or filename.startswith("<frozen"):
        return True
    path = os.path.abspath(filename)
    if path in (_THIS_FILE, _WARNINGS_FILE):
        return True
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in library_dirs)


def sync_warnings_from(records: Iterable[Any],
                       library_dirs: Sequence[str] = (TORCH_DIR,)) -> list[SyncWarning]:
    """Turn recorded warnings into :class:`SyncWarning` s that point at the caller's line.

    A pure function (no GPU, no global state), so it can be tested with fabricated warnings.

    Args:
        records: ``warnings.WarningMessage`` objects, or ``(WarningMessage, stack)`` pairs where
            ``stack`` is the Python stack when the warning was issued, outermost first, as
            ``traceback.FrameSummary`` objects or ``(filename, lineno)`` pairs.
        library_dirs: directories whose files are library code, not the user's (PyTorch's
            package directory by default).

    Only warnings whose text contains :data:`SYNC_WARNING_TEXT` are kept: the one-time
    "prototype feature" warning that ``set_sync_debug_mode`` itself emits is dropped. Each kept
    warning is located at the warning's own ``filename``/``lineno`` when that is user code
    (a C++ operator warns from the Python line that called it). When it points into a library
    (an operator called by PyTorch's own Python code), the innermost frame of ``stack`` outside
    the libraries, this module and :mod:`warnings` is used instead, when there is one.

    Returns:
        ``[SyncWarning, ...]`` in the order of ``records``; ``line`` is the stripped source
        line from :mod:`linecache` ("" when Python cannot find it).

    Raises:
        TypeError: a record is neither a ``WarningMessage`` nor a ``(WarningMessage, stack)`` pair.
    """
    found = []
    for rec in records:
        if isinstance(rec, warnings.WarningMessage):
            w, stack = rec, ()
        elif (isinstance(rec, tuple) and len(rec) == 2
              and isinstance(rec[0], warnings.WarningMessage)):
            w, stack = rec
        else:
            raise TypeError("records must hold warnings.WarningMessage objects or "
                            f"(WarningMessage, stack) pairs, got {type(rec).__name__}")
        text = str(w.message)
        if SYNC_WARNING_TEXT not in text:
            continue
        filename, lineno = w.filename, w.lineno
        if is_library(filename, library_dirs):
            for frame in reversed(list(stack)):
                f_name, f_line = (frame.filename, frame.lineno) if isinstance(
                    frame, traceback.FrameSummary) else (frame[0], frame[1])
                if not is_library(f_name, library_dirs):
                    filename, lineno = f_name, f_line
                    break
        line = linecache.getline(filename, lineno).strip() if filename else ""
        found.append(SyncWarning(filename, lineno, line, text))
    return found


def warnings_by_line(found: Sequence[SyncWarning]) -> list[tuple[str, int]]:
    """Group :class:`SyncWarning` s by source line: ``[(line text, count), ...]``, most first.

    Lines without source text are shown as ``"<filename>:<lineno>"``; ties keep first-seen order.
    """
    counts: Counter = Counter()
    for w in found:
        counts[w.line or f"{w.filename}:{w.lineno}"] += 1
    return counts.most_common()


class _StackRecorder:
    """Records each warning with the Python stack at the moment it was issued."""

    def __init__(self) -> None:
        self.records: list[tuple[warnings.WarningMessage, list]] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        stack = traceback.extract_stack()[:-1]
        self.records.append((warnings.WarningMessage(message, category, filename, lineno,
                                                     file, line), stack))


def _record_with_stacks(fn: Callable[..., Any], *args, **kwargs):
    """Run ``fn`` with every warning recorded, with its stack; returns (out, records)."""
    recorder = _StackRecorder()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        warnings.showwarning = recorder   # restored by catch_warnings on exit
        out = fn(*args, **kwargs)
    return out, recorder.records


def sync_debug_warnings(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, list[SyncWarning]]:
    """Run ``fn(*args, **kwargs)`` under ``torch.cuda.set_sync_debug_mode("warn")`` and collect the warnings.

    Every CUDA call that synchronizes the host with the device warns ("called a synchronizing
    CUDA operation"); each warning is recorded with the Python stack at that moment, with the
    filter set to ``"always"`` so repeated warnings from one line are all kept, and
    :func:`sync_warnings_from` keeps only those warnings (not the one-time "prototype feature"
    warning that setting the mode emits from inside ``torch.cuda``) and locates each at the
    caller's line, not PyTorch's. The previous
    sync debug mode is restored afterwards, even when ``fn`` raises. PyTorch documents the mode as
    covering most, not all, synchronizing operations (``torch.distributed`` and ``torch.sparse``
    are not covered).

    Returns:
        ``(result of fn, [SyncWarning, ...])`` in the order the calls happened.

    Raises:
        RuntimeError: no CUDA GPU (sync debug mode is a CUDA feature).
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not torch.cuda.is_available():
        raise RuntimeError("sync_debug_warnings needs a CUDA GPU: sync debug mode watches CUDA calls")
    previous = torch.cuda.get_sync_debug_mode()

    def watched():
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    out, records = _record_with_stacks(watched)
    return out, sync_warnings_from(records)
