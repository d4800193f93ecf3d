"""Attention kernels: which ``scaled_dot_product_attention`` backend runs, and what it costs.

``torch.nn.functional.scaled_dot_product_attention`` picks one of several implementations per
call: FlashAttention (fused, never stores the ``L x L`` score matrix; half precision, no
arbitrary mask), memory-efficient attention (fused; float32 and additive masks allowed),
cuDNN attention, or the *math* path (plain matmul + softmax + matmul in PyTorch, which stores
the scores). :func:`sdpa_kernels` runs one call under ``torch.profiler`` and returns the kernel
(or, on a CPU, ATen operator) names; :func:`backend_of` names the backend from them.
:func:`math_scores_bytes` is the memory the math path needs for its score matrix.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from perflab.core.validate import number

__all__ = ["BACKEND_MARKERS", "backend_kernel", "backend_of", "math_scores_bytes", "sdpa_kernels"]

# Substrings of kernel names that identify each backend (checked in this order).
BACKEND_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cudnn", ("cudnn", "cudnn_generated_fort_native_sdpa")),
    ("flash", ("flash_fwd", "flash", "pytorch_flash")),
    ("efficient", ("fmha", "mem_efficient", "efficient_attention", "attentionkernel")),
    ("math", ("softmax",)),
)


def backend_kernel(names: list[str]) -> tuple[str, str]:
    """``(backend, name)``: the SDPA backend the names point to and the first name that says so.

    Backends: ``"cudnn"``, ``"flash"``, ``"efficient"``, ``"math"``, checked in that order
    against :data:`BACKEND_MARKERS`; ``("unknown", "")`` when no marker matches.
    """
    for backend, markers in BACKEND_MARKERS:
        for n in names:
            if any(m in n.lower() for m in markers):
                return backend, n
    return "unknown", ""


def backend_of(names: list[str]) -> str:
    """The SDPA backend a list of kernel/operator names points to (see :func:`backend_kernel`)."""
    return backend_kernel(names)[0]


def sdpa_kernels(fn: Callable[[], object]) -> list[str]:
    """Names of the device kernels (CUDA) or ATen operators (CPU) one call of ``fn()`` runs.

    ``fn`` is called once untimed first. Kernel names come from ``torch.profiler`` events of
    device type CUDA; on a CPU the ``aten::`` operator names stand in.

    Raises:
        TypeError: ``fn`` is not callable.
    """

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    fn()
    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    names = []
    for e in prof.events():
        on_device = getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        if (cuda and on_device) or (not cuda and e.name.startswith("aten::")):
            if e.name not in names:
                names.append(e.name)
    return names


def math_scores_bytes(batch: int, heads: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of one ``batch x heads x length x length`` score matrix, which the math path stores.

    The fused kernels keep scores in on-chip tiles instead, so their memory grows with
    ``length``, not ``length**2``.

    Raises:
        ValueError: a size below 1.
    """
    for name, size in (("batch", batch), ("heads", heads), ("length", length)):
        number(name, size, minimum=1)
    return batch * heads * length * length * torch.tensor([], dtype=dtype).element_size()
