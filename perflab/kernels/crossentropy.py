"""Plumbing of the fused cross-entropy heads: a tiled transpose operator and the compute dtype.

Chapter 10's fused heads (the loss and the gradient of the logits in one kernel, in bf16 and in
FP8) are written on its page and exported to :mod:`perflab.gpt2.heads`; what they need that is
not the idea lives here: :func:`transpose`, a row-major copy of a matrix's transpose (any dtype,
FP8 included: FP8 products take one memory layout, so the FP8 head's weight gradient needs the
gradient transposed), an operator that ``torch.compile`` and AOTAutograd may trace, a tiled
Triton kernel on a CUDA device; and :func:`compute_dtype`, the dtype a product of a tensor runs
in under autocast (an operator of our own is not cast by autocast).
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "transpose"]

_KERNELS: dict = {}


def _triton_kernels():
    """The tiled Triton transpose (compiled on first use; CUDA only)."""
    if not _KERNELS:
        import triton  # optional: CUDA builds of torch ship it; CPU builds take the torch path
        import triton.language as tl  # optional: as above

        @triton.jit
        def _transpose(src, dst, M, N, BM: tl.constexpr, BN: tl.constexpr):
            rm = tl.program_id(0) * BM + tl.arange(0, BM)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            tile = tl.load(src + rm[:, None].to(tl.int64) * N + rn[None, :], mask=mask)
            tl.store(dst + rn[None, :].to(tl.int64) * M + rm[:, None], tile, mask=mask)

        _KERNELS.update(transpose=_transpose, cdiv=triton.cdiv)
    return _KERNELS


@torch.library.custom_op("perflab::transpose_copy", mutates_args=())
def _transpose_copy(t: torch.Tensor) -> torch.Tensor:
    """``t (M, N)`` -> a row-major ``(N, M)`` copy of its transpose."""
    if t.device.type != "cuda":
        return t.t().contiguous()
    m, n = t.shape
    out = torch.empty((n, m), dtype=t.dtype, device=t.device)
    k = _triton_kernels()
    k["transpose"][(k["cdiv"](m, 64), k["cdiv"](n, 64))](t, out, m, n, BM=64, BN=64)
    return out


@_transpose_copy.register_fake
def _(t):
    return t.new_empty((t.shape[1], t.shape[0]))


_transpose_copy.register_autograd(lambda ctx, g: _transpose_copy(g.contiguous()))


def transpose(t: torch.Tensor) -> torch.Tensor:
    """A row-major copy of the transpose of a contiguous 2-D tensor ``t`` (``(M, N)`` ->
    ``(N, M)``), any dtype (FP8 included). On a CUDA device a tiled Triton kernel (reads and
    writes both coalesced: 2 x ``t.nbytes`` of traffic); elsewhere ``t.t().contiguous()``.
    An operator (``perflab::transpose_copy``), so code that ``torch.compile`` or AOTAutograd
    traces may call it.

    Raises:
        ValueError: ``t`` is not a contiguous 2-D tensor.
    """
    if t.dim() != 2 or not t.is_contiguous():
        raise ValueError(f"t must be a contiguous 2-D tensor, got shape {tuple(t.shape)}, "
                         f"strides {t.stride()}")
    return _transpose_copy(t)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matrix product of ``t`` runs in here: the autocast dtype when autocast is on
    for ``t``'s device type (an operator of our own is not cast by autocast), else ``t``'s."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype
