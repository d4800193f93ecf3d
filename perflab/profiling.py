"""Reading torch.profiler output: how many kernels a call launches, and where time goes."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["kernels_per_call"]

# ATen calls that allocate, view or reshape metadata without touching every element.
_NOT_COMPUTE = {
    "aten::empty", "aten::empty_strided", "aten::as_strided", "aten::view", "aten::reshape",
    "aten::_reshape_alias", "aten::resize_", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::empty_like", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze",
}


def kernels_per_call(fn: Callable, *args, calls: int = 5, **kwargs) -> float:
    """Average number of kernels one call of ``fn(*args, **kwargs)`` runs, read from torch.profiler.

    On a GPU (any tensor argument on CUDA, or CUDA available and no tensor arguments) this counts
    device kernels (memcpy and memset excluded): a fused ``torch.compile`` graph shows 1, eager
    ``x*2*2`` shows 2. On a CPU there are no device kernels to count, so it counts ATen compute
    operator calls instead (allocation and view operators excluded): eager code shows one per
    operator, a fused Inductor C++ kernel shows 0.

    Call ``fn`` once before this (compilation and warm-up would otherwise be profiled).

    Raises:
        ValueError: ``calls`` < 1.
    """
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    on_gpu = any(t.is_cuda for t in tensors) if tensors else torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn(*args, **kwargs)
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.events()
    if on_gpu:
        n = sum(1 for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset", "[memory]")))
    else:
        n = sum(1 for e in events if e.name.startswith("aten::") and e.name not in _NOT_COMPUTE
                and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    return n / calls
