"""Custom operators: one fused operation written in C++, CUDA and Triton, registered with PyTorch.

The operation is BLAS's *axpby*, out-of-place: ``out = a * x + b * y`` for two float32 tensors of
one shape and two Python floats. Eager PyTorch runs ``a * x + b * y`` as three kernels that move
seven tensors' worth of bytes (read x, write ax; read y, write by; read ax and by, write out); one
fused kernel moves three (read x and y, write out), so a bandwidth-bound fused kernel should take
about 3/7 of the eager time.

The kernels (``CPP_SOURCE``: a CPU loop split across threads by ``at::parallel_for``;
``CUDA_SOURCE``: one thread per element; ``triton_axpby``: the Triton version) and their
registration with ``torch.library.custom_op`` (``register``) are taught on chapter 9's page and
exported from it to :mod:`perflab.kernels.axpby`. This module holds what is not the idea:

* :func:`build_extension` compiles and loads the C++/CUDA sources with
  ``torch.utils.cpp_extension.load_inline``. The C++ side registers the kernels with the
  dispatcher (``TORCH_LIBRARY``), so no pybind11 and only a few ATen headers are compiled (a
  build takes seconds, not a minute). The extension's name is derived from a hash of its source,
  so a fixed source builds under a new name and can be loaded in the same Python process that
  loaded a broken one; builds are cached in ``TORCH_EXTENSIONS_DIR`` (default: the clone's
  ``.cache/torch_extensions``).
* lab 9's checks of a fused operator (:func:`check_fused_speedup`) and of its registration
  (:func:`check_registered`).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from . import exercises
from .compiler import graph_breaks
from .exercises import ExerciseFailed
from .kernels.axpby import CPP_SOURCE, CUDA_SOURCE
from .timing import benchmark, paired_ratio

__all__ = [
    "check_fused_speedup",
    "check_registered",
    "Build",
    "axpby_eager",
    "build_extension",
    "extension_dir",
]

ROOT = Path(__file__).resolve().parent.parent

# The dispatcher namespace of the compiled kernels (the page's sources register it)
KERNEL_NAMESPACE = "perflab_ext"


def extension_dir() -> Path:
    """Where compiled extensions are cached: ``$TORCH_EXTENSIONS_DIR``, else ``<clone>/.cache/torch_extensions``.

    The directory is created if missing. The Makefile exports the same default, so CI builds
    each extension once per clean clone.
    """
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or ROOT / ".cache" / "torch_extensions")
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class Build:
    """A loaded extension.

    Attributes:
        name: the extension's name (``perflab_axpby_<hash>``); a different source, a new name.
        library: path of the loaded shared library.
        seconds: wall time of :func:`build_extension` (compiling, or loading a cached build).
        cuda: whether the CUDA source was compiled in.
    """

    name: str
    library: str
    seconds: float
    cuda: bool


_LOADED: dict[str, Build] = {}


def build_extension(cpp_source: str = CPP_SOURCE, cuda_source: str | None = None,
                    verbose: bool = False) -> Build:
    """Compile (or load from the cache) and load an extension that registers its kernels.

    The sources must register their operators themselves (``TORCH_LIBRARY`` /
    ``TORCH_LIBRARY_IMPL``): no Python bindings are generated, and no implicit
    ``torch/extension.h`` is added (it alone takes most of a minute to compile). The extension's
    name is ``perflab_axpby_`` plus the first 12 hex digits of the SHA-256 of the sources and
    flags, so editing a source that failed to compile and calling this again builds a new
    library in the same process. ``cuda_source`` defaults to :data:`CUDA_SOURCE` when a GPU is
    present (``""`` forces a CPU-only build). A source that registers a namespace already
    registered by another loaded library fails to load (C++ ``TORCH_LIBRARY`` may appear once
    per namespace per process): rename the namespace in a variant.

    Returns:
        :class:`Build`.

    Raises:
        TypeError: a source is not a string.
        ValueError: ``cpp_source`` is empty.
        RuntimeError: the compiler or linker failed (the message carries its output), or
            ninja is missing (``pip install ninja``).
    """
    if not isinstance(cpp_source, str) or (cuda_source is not None and not isinstance(cuda_source, str)):
        raise TypeError("cpp_source and cuda_source must be strings of C++ / CUDA source code")
    if not cpp_source.strip():
        raise ValueError("cpp_source is empty")
    if cuda_source is None:
        cuda_source = CUDA_SOURCE if torch.cuda.is_available() else ""
    cflags = ["-O3"]
    cuda_flags = ["-O3"]
    digest = hashlib.sha256("\0".join([cpp_source, cuda_source, *cflags, *cuda_flags]).encode()).hexdigest()
    name = f"perflab_axpby_{digest[:12]}"
    if name in _LOADED:
        return _LOADED[name]
    from torch.utils.cpp_extension import load_inline

    directory = extension_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    library = load_inline(
        name=name,
        cpp_sources=[cpp_source],
        cuda_sources=[cuda_source] if cuda_source else None,
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_flags if cuda_source else None,
        build_directory=str(directory),
        is_python_module=False,
        no_implicit_headers=True,
        verbose=verbose,
    )
    build = Build(name, str(library), time.perf_counter() - t0, bool(cuda_source))
    _LOADED[name] = build
    return build


def axpby_eager(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
    """``a * x + b * y`` as eager PyTorch composes it: three kernels, seven tensor passes."""
    return a * x + b * y


def _not_done(exercise: int, what: str):
    """Raise the lab's "Exercise N is not done yet: ..." error (ExerciseNotDone where it exists)."""
    raise exercises.ExerciseNotDone(exercise, what)

#: The fewest elements :func:`check_fused_speedup` times on a CPU (64 MB float32 arrays).
CPU_TIMING_NUMEL = 2**24


def check_fused_speedup(fused: Callable | None, device, numel: int, minimum: float = 1.3,
                        exercise: int = 1, cpu_minimum: float = 1.2) -> float:
    """Lab check: ``fused(x, a, y, b)`` equals ``a*x + b*y`` and beats the eager composition.

    Both are timed in this run on float32 tensors of ``numel`` elements. On a GPU,
    :func:`perflab.timing.benchmark` (``do_bench``, L2 flushed) times each in three
    alternating rounds and the best time of each gives the ratio eager / fused. On a CPU the
    ratio is the median of 15 paired ratios, each from two back-to-back blocks of about 10 ms
    (eager then fused, or fused then eager, alternately): a shared CPU's load comes in bursts
    that slow both blocks of a pair alike, while the best of a few rounds each can land in
    different bursts (a 2-core CI machine read the eager composition against itself at 1.19x
    that way). The ratio must be at least ``minimum`` on a GPU, ``cpu_minimum`` on a CPU. A
    fused kernel moves 3 tensors' worth of bytes against eager's 7, so a right answer reaches
    about 2x where the arrays stream from DRAM; the default 1.3 leaves room for noise. On a
    CPU the check times at least :data:`CPU_TIMING_NUMEL` (2**24) elements, raising a smaller
    ``numel``: each float32 array is then 64 MB, above glibc's largest mmap threshold (32 MB),
    so every output is freshly mapped and pays its page faults on every call alike. With
    smaller arrays the allocator sometimes hands back a freed, already-faulted block and
    sometimes not, and the ratio of one right answer swung between 1.1x and 3.5x from block
    to block on a 2-core machine. At 2**24 a right answer read
    1.6x-1.7x there and the eager composition against itself 0.98x-1.04x; the CPU bar of 1.2
    lies between them.

    Returns:
        the measured speedup.

    Raises:
        perflab.exercises.ExerciseFailed: ``fused`` is None, gives a wrong result, or is too
            slow (one sentence each).
        ValueError: ``numel``, ``minimum`` or ``cpu_minimum`` not positive.
    """
    if numel < 1 or minimum <= 0 or cpu_minimum <= 0:
        raise ValueError(f"numel, minimum and cpu_minimum must be positive, got {numel}, "
                         f"{minimum} and {cpu_minimum}")
    if fused is None:
        _not_done(exercise, "set `fused_axpby` to your fused operator")
    dev = torch.device(device)
    if dev.type == "cpu":
        numel = max(numel, CPU_TIMING_NUMEL)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=g).to(dev)
    y = torch.randn(numel, generator=g).to(dev)
    with torch.no_grad():
        got = fused(x, 1.5, y, -0.25)
        want = axpby_eager(x, 1.5, y, -0.25)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
                not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            raise ExerciseFailed(f"✗ Exercise {exercise}: your operator's result differs from "
                                 "1.5 * x - 0.25 * y.")
        if dev.type == "cpu":
            ratio, _ = paired_ratio(lambda: axpby_eager(x, 1.5, y, -0.25),
                                    lambda: fused(x, 1.5, y, -0.25))
            minimum = cpu_minimum
        else:
            # three alternating rounds, the best of each: a burst of load during one
            # measurement cannot decide the verdict
            eager_s = fused_s = math.inf
            for _ in range(3):
                eager_s = min(eager_s, benchmark(lambda: axpby_eager(x, 1.5, y, -0.25), dev))
                fused_s = min(fused_s, benchmark(lambda: fused(x, 1.5, y, -0.25), dev))
            ratio = eager_s / fused_s
    if ratio < minimum:
        raise ExerciseFailed(f"✗ Exercise {exercise}: your operator is {ratio:.2f}x the eager "
                             f"composition; it must reach {minimum:.2f}x (one pass over memory).")
    print(f"✓ Exercise {exercise}: correct, and {ratio:.2f}x as fast as eager a*x + b*y.")
    return ratio


def check_registered(op: Callable | None, device, exercise: int = 2) -> bool:
    """Lab check: ``op(x, a, y, b)`` is a registered operator that compile and autograd accept.

    Three tests: ``torch.library.opcheck`` on the operator's overload (schema, fake tensor,
    autograd registration, AOT dispatch) must all succeed; gradients must be ``a * g`` and
    ``b * g``; and ``torch.compile(fullgraph=True)`` of a function using it must show no graph
    break (``torch._dynamo.explain``).

    Raises:
        perflab.exercises.ExerciseFailed: ``op`` is None, not a custom operator, fails
            opcheck, has wrong gradients or breaks the graph.
    """
    if op is None:
        _not_done(exercise, "set `registered_axpby` to the operator torch.library.custom_op returned")
    overload = getattr(getattr(op, "_opoverload", None), "_schema", None) and op._opoverload
    if overload is None:
        raise ExerciseFailed(f"✗ Exercise {exercise}: `registered_axpby` is not an operator made "
                             "by torch.library.custom_op.")
    dev = torch.device(device)
    x = torch.randn(32, device=dev, requires_grad=True)
    y = torch.randn(32, device=dev, requires_grad=True)
    try:
        torch.library.opcheck(overload, (x, 2.0, y, -0.5))
    except Exception as err:  # opcheck's failure is the answer being wrong: report it
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExerciseFailed(f"✗ Exercise {exercise}: torch.library.opcheck failed: {first}") from None
    g = torch.randn(32, device=dev)
    op(x, 2.0, y, -0.5).backward(g)
    if x.grad is None or y.grad is None or not torch.allclose(x.grad, 2.0 * g) or \
            not torch.allclose(y.grad, -0.5 * g):
        raise ExerciseFailed(f"✗ Exercise {exercise}: the gradients are wrong: d out/dx must be a "
                             "and d out/dy must be b.")
    breaks = graph_breaks(lambda p, q: op(p.sin(), 2.0, q, -0.5), x, y)
    if breaks.breaks:
        raise ExerciseFailed(f"✗ Exercise {exercise}: torch.compile breaks the graph at your "
                             f"operator: {breaks.reasons[0]}")
    print(f"✓ Exercise {exercise}: opcheck passed, gradients are right, and the compiled "
          "graph has no break.")
    return True
