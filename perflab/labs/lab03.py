"""Lab 3's checks: tensors hidden from autograd's saved-tensor hooks, the CPU saving a fast path
must show."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["hidden_ctx_tensors", "required_cpu_saving"]


def required_cpu_saving(fast_issue_s: float, fast_total_s: float, target: float = 1.5,
                        min_lead: float = 1.2) -> float | None:
    """The CPU-time ratio (slow loop / fast loop) to require of a loop that stopped synchronizing.

    A loop that never synchronizes returns after the host has issued its work (``fast_issue_s``)
    while the device finishes later (``fast_total_s``); a loop that synchronizes every step holds
    the CPU until the device is done, about ``fast_total_s`` or more. So the most the CPU can win
    is the *lead* ``fast_total_s / fast_issue_s``. When the device's work per step is short next
    to the host's issue time (a fast GPU behind a slow host, small kernels), the lead is near 1
    and there is nothing to win: this returns None (no requirement). Otherwise it returns half
    of the possible gain, at most ``target``: ``min(target, 1 + (lead - 1) / 2)``, so that noise
    cannot fail a right answer on any host/GPU balance. (A loop that still synchronizes has a
    lead near 1 too; the synchronization count, checked first, rejects it.)

    Raises:
        ValueError: a time is not positive, or ``target`` / ``min_lead`` is not above 1.
    """
    if not (fast_issue_s > 0 and fast_total_s > 0):
        raise ValueError(f"fast_issue_s and fast_total_s must be positive, got {fast_issue_s}, {fast_total_s}")
    if not (target > 1 and min_lead > 1):
        raise ValueError(f"target and min_lead must be above 1, got {target}, {min_lead}")
    lead = fast_total_s / fast_issue_s
    if lead < min_lead:
        return None
    return min(target, 1 + (lead - 1) / 2)

def hidden_ctx_tensors(output: Any) -> list[str]:
    """Tensors a custom ``autograd.Function`` kept as ``ctx`` attributes instead of saving them.

    ``ctx.s = torch.sigmoid(x)`` keeps ``s`` alive until backward just as
    ``ctx.save_for_backward(s)`` does, but ``saved_tensors_hooks`` (and so
    :func:`perflab.internals.autograd.saved_tensors`) never see it. ``output`` is the Function's output;
    its ``grad_fn`` is the ``ctx`` object. Returns the attribute names holding tensors (also
    inside lists, tuples and dicts), empty when there are none or ``output`` has no ``grad_fn``.
    """
    ctx = getattr(output, "grad_fn", None)
    names = []
    for name, value in (getattr(ctx, "__dict__", None) or {}).items():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.Tensor) for v in values):
            names.append(name)
    return names
