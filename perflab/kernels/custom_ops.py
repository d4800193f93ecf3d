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
:func:`build_extension` compiles and loads the C++/CUDA sources with
``torch.utils.cpp_extension.load_inline``. The C++ side registers the kernels with the
dispatcher (``TORCH_LIBRARY``), so no pybind11 and only a few ATen headers are compiled (a
build takes seconds, not a minute). The extension's name is derived from a hash of its source,
so a fixed source builds under a new name and can be loaded in the same Python process that
loaded a broken one; builds are cached in ``TORCH_EXTENSIONS_DIR`` (default: the clone's
``.cache/torch_extensions``). Lab 9's checks live in :mod:`perflab.labs.lab09`.

Triton is optional: :func:`triton_modules` imports it where it is installed (CUDA builds of
torch ship it; on a CPU ``pip install triton`` adds it, and its interpreter, enabled by
``TRITON_INTERPRET=1`` before a kernel is defined, runs kernels with NumPy), and
:func:`triton_launches` counts the kernels a call launches, compiled or interpreted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
import torch
from torch.utils.cpp_extension import load_inline

from perflab.core.timing import Stopwatch

from perflab.kernels.axpby import CPP_SOURCE, CUDA_SOURCE

__all__ = ["axpby_eager", "Build", "build_extension", "extension_dir", "triton_launches",
           "triton_modules"]

ROOT = Path(__file__).resolve().parent.parent.parent

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

    directory = extension_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    clock = Stopwatch().start()
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
    build = Build(name, str(library), clock.elapsed(), bool(cuda_source))
    _LOADED[name] = build
    return build


def axpby_eager(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
    """``a * x + b * y`` as eager PyTorch composes it: three kernels, seven tensor passes."""
    return a * x + b * y


def triton_modules():
    """``(triton, triton.language)``, or ``(None, None)`` where Triton is not installed."""
    try:
        import triton  # optional: CUDA builds of torch ship it, CPU builds do not
        import triton.language as tl  # optional, as above
    except ImportError:
        return None, None
    return triton, tl


@contextlib.contextmanager
def triton_launches():
    """Count the Triton kernels launched inside the ``with`` block.

    Yields a list that gets the name of each kernel as it is launched (``kernel[grid](...)``
    calls the kernel's ``run``), compiled for a GPU (``JITFunction``) or run by Triton's
    interpreter (``InterpretedFunction``, ``TRITON_INTERPRET=1``). Where Triton is not
    installed the list stays empty. The kernels' classes are restored on exit.
    """
    triton, _ = triton_modules()
    seen: list[str] = []
    if triton is None:
        yield seen
        return
    from triton.runtime import interpreter, jit  # optional, as above
    patched = []
    for cls in (jit.JITFunction, interpreter.InterpretedFunction):
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            seen.append(getattr(getattr(self, "fn", None), "__name__", "kernel"))
            return _original(self, *args, **kwargs)

        cls.run = run
        patched.append((cls, original))
    try:
        yield seen
    finally:
        for cls, original in patched:
            cls.run = original
