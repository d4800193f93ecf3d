"""Custom operators: one fused operation written in C++, CUDA and Triton, registered with PyTorch.

The operation is BLAS's *axpby*, out-of-place: ``out = a * x + b * y`` for two float32 tensors of
one shape and two Python floats. Eager PyTorch runs ``a * x + b * y`` as three kernels that move
seven tensors' worth of bytes (read x, write ax; read y, write by; read ax and by, write out); one
fused kernel moves three (read x and y, write out), so a bandwidth-bound fused kernel should take
about 3/7 of the eager time.

Three backends, one operator:

* :func:`build_extension` compiles :data:`CPP_SOURCE` (CPU, a loop split across threads by
  ``at::parallel_for``) and, when a CUDA compiler and GPU are present, :data:`CUDA_SOURCE` (one
  thread per element) with ``torch.utils.cpp_extension.load_inline``. The C++ side registers the
  kernels with the dispatcher (``TORCH_LIBRARY``), so no pybind11 and only a few ATen headers are
  compiled (a build takes seconds, not a minute). The extension's name is derived from a hash of
  its source, so a fixed source builds under a new name and can be loaded in the same Python
  process that loaded a broken one; builds are cached in ``TORCH_EXTENSIONS_DIR`` (default: the
  clone's ``.cache/torch_extensions``).
* :func:`triton_axpby` is the same operation as a Triton kernel (GPU only; Triton is imported on
  first use).
* :func:`register` wraps a kernel in ``torch.library.custom_op`` with a fake (meta) implementation
  for tracing and an autograd formula, so ``torch.compile(fullgraph=True)`` and
  ``torch.library.opcheck`` accept it. :func:`axpby` is the registered operator
  ``perflab::axpby`` (C++ on CPU, CUDA C++ on a GPU) and :func:`axpby_triton` the Triton one.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

__all__ = ["axpby", "axpby_eager", "axpby_triton", "Build", "build_extension", "code_of",
           "CPP_SOURCE", "CUDA_SOURCE", "extension_dir", "register", "triton_axpby"]

ROOT = Path(__file__).resolve().parent.parent.parent

# The dispatcher namespace of the compiled kernels; the registered Python operators live in "perflab".
KERNEL_NAMESPACE = "perflab_ext"

CPP_SOURCE = r"""
// out = a * x + b * y for float32 tensors of one shape: one pass over memory.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

at::Tensor axpby_cpu(const at::Tensor& x, double a, const at::Tensor& y, double b) {
  TORCH_CHECK(x.sizes() == y.sizes(), "axpby: x and y must have the same shape");
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat,
              "axpby: x and y must be float32");
  TORCH_CHECK(x.is_cpu() && y.is_cpu(), "axpby_cpu: x and y must be CPU tensors");
  at::Tensor xc = x.contiguous(), yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);
  const float* px = xc.data_ptr<float>();
  const float* py = yc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float fa = static_cast<float>(a), fb = static_cast<float>(b);
  // threads split the range; inside a chunk the compiler vectorizes the loop (-O3)
  at::parallel_for(0, xc.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = fa * px[i] + fb * py[i];
  });
  return out;
}

TORCH_LIBRARY(perflab_ext, m) {
  m.def("axpby(Tensor x, float a, Tensor y, float b) -> Tensor");
}

TORCH_LIBRARY_IMPL(perflab_ext, CPU, m) { m.impl("axpby", &axpby_cpu); }
"""

CUDA_SOURCE = r"""
// The CUDA version: one thread per element, launched on PyTorch's current stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

__global__ void axpby_kernel(const float* __restrict__ x, const float* __restrict__ y,
                             float* __restrict__ out, float a, float b, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}

at::Tensor axpby_cuda(const at::Tensor& x, double a, const at::Tensor& y, double b) {
  TORCH_CHECK(x.sizes() == y.sizes(), "axpby: x and y must have the same shape");
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat,
              "axpby: x and y must be float32");
  TORCH_CHECK(x.is_cuda() && y.device() == x.device(), "axpby_cuda: x and y must be on one GPU");
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor xc = x.contiguous(), yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel();
  if (n == 0) return out;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  axpby_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(),
      static_cast<float>(a), static_cast<float>(b), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

TORCH_LIBRARY_IMPL(perflab_ext, CUDA, m) { m.impl("axpby", &axpby_cuda); }
"""


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


def triton_axpby(x: torch.Tensor, a: float, y: torch.Tensor, b: float, block: int = 4096) -> torch.Tensor:
    """``a * x + b * y`` by a Triton kernel: each program loads ``block`` elements of x and y once.

    Args:
        x, y: float32 CUDA tensors of one shape (made contiguous if they are not).
        a, b: scale factors (Python floats).
        block: elements per program, a power of two.

    Raises:
        ValueError: shapes differ, dtypes are not float32, tensors not on one CUDA device, or
            ``block`` not a power of two.
        ImportError: Triton is not installed.
    """
    _check_pair(x, y)
    if not x.is_cuda or y.device != x.device:
        raise ValueError(f"triton_axpby needs x and y on one CUDA device, got {x.device} and {y.device}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    kernel = _triton_kernel()
    xc, yc = x.contiguous(), y.contiguous()
    out = torch.empty_like(xc)
    n = xc.numel()
    grid = (max(1, -(-n // block)),)
    with torch.cuda.device(x.device):
        kernel[grid](xc, yc, out, float(a), float(b), n, BLOCK=block, num_warps=8)
    return out


_KERNEL = None


def _triton_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _axpby(x_ptr, y_ptr, out_ptr, a, b, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            x = tl.load(x_ptr + offsets, mask=mask)
            y = tl.load(y_ptr + offsets, mask=mask)
            tl.store(out_ptr + offsets, a * x + b * y, mask=mask)

        _KERNEL = _axpby
    return _KERNEL


def _check_pair(x: torch.Tensor, y: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError("x and y must be tensors")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != torch.float32 or y.dtype != torch.float32:
        raise ValueError(f"x and y must be float32, got {x.dtype} and {y.dtype}")


def register(name: str, kernel: Callable, device_types: str | tuple[str, ...] | None = None):
    """Register ``kernel(x, a, y, b)`` as the PyTorch operator ``name`` (e.g. ``"perflab::axpby"``).

    Three registrations make an operator that ``torch.compile(fullgraph=True)`` can trace and
    differentiate without a graph break:

    * ``torch.library.custom_op(name, mutates_args=())`` makes the kernel an opaque operator
      with the schema ``(Tensor x, float a, Tensor y, float b) -> Tensor``;
    * ``register_fake`` says what it returns without running it (a new tensor shaped like
      ``x``), which is all Dynamo and AOTAutograd need while tracing with fake tensors;
    * ``register_autograd``: ``d out / d x = a`` and ``d out / d y = b``, so the backward
      pass is ``(a * grad, b * grad)``; nothing but the two floats is saved.

    Returns:
        the operator (callable like the kernel).

    Raises:
        ValueError: ``name`` is not ``"namespace::name"``.
    """
    if not isinstance(name, str) or name.count("::") != 1:
        raise ValueError(f"name must look like 'namespace::op_name', got {name!r}")

    @torch.library.custom_op(name, mutates_args=(), device_types=device_types)
    def op(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
        return kernel(x, a, y, b)

    @op.register_fake
    def _(x, a, y, b):
        torch._check(x.shape == y.shape, lambda: "axpby: x and y must have one shape")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def setup_context(ctx, inputs, output):
        _, ctx.a, _, ctx.b = inputs

    def backward(ctx, grad):
        return ctx.a * grad, None, ctx.b * grad, None

    op.register_autograd(backward, setup_context=setup_context)
    return op


def _compiled_kernel(x, a, y, b):
    return getattr(torch.ops, KERNEL_NAMESPACE).axpby(x, a, y, b)


_OPS: dict[str, Callable] = {}


def axpby(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
    """The registered operator ``perflab::axpby``: ``a * x + b * y`` by the compiled extension.

    Builds (or loads) the extension on first use: C++ for CPU tensors, CUDA for GPU tensors.

    Raises:
        RuntimeError: from the kernel (shapes, dtypes) or the build.
    """
    if "axpby" not in _OPS:
        build_extension()
        _OPS["axpby"] = register("perflab::axpby", _compiled_kernel)
    return _OPS["axpby"](x, a, y, b)


def axpby_triton(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
    """The registered operator ``perflab::axpby_triton`` (CUDA only): :func:`triton_axpby`."""
    if "axpby_triton" not in _OPS:
        _OPS["axpby_triton"] = register("perflab::axpby_triton", triton_axpby, device_types="cuda")
    return _OPS["axpby_triton"](x, a, y, b)


def code_of(fn: Callable) -> str:
    """The source of a function without its docstring, for showing an implementation on a page.

    Raises:
        TypeError: ``fn``'s source is not available (a builtin).
    """
    import inspect
    import textwrap

    lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    doc = fn.__doc__
    if doc:
        quotes = [i for i, line in enumerate(lines) if '"""' in line]
        if len(quotes) >= 2 and quotes[0] < 3:
            lines = lines[:quotes[0]] + lines[quotes[1] + 1:]
    return "\n".join(lines)
