"""A fused cross-entropy: the loss and the gradient of the logits in one pass over the logits.

A language model's head ends in ``loss = cross_entropy(h @ W^T, y)`` over ``M`` tokens and ``V``
classes. For GPT-2 at 65,536 tokens per step and ``V`` = 50,304 the logits are 3.3 G numbers
(6.6 GB in bf16), the largest tensor of the step, and the usual composition moves them several
times: the loss's forward reads them (log-softmax), its backward reads them again and writes
their gradient, as large again. Nothing in that gradient needs the backward: for a mean over
``M`` tokens,

    d loss / d logit[i, j] = (softmax(logit[i])[j] - [j == y[i]]) / M,

a function of the logits and targets alone, times the incoming gradient of the loss (a
scalar). So :func:`loss_and_grad` computes, row by row, the log-sum-exp (an *online* softmax:
running maximum and sum in one read of the row), the loss ``lse - logit[y]`` and the gradient,
written in whatever dtype its output buffer has, in the forward; the backward only scales it.
The idea is the one of the Liger kernels' fused cross-entropy (Hsu et al., 2024, "Liger Kernel:
Efficient Triton Kernels for LLM Training", arXiv:2410.10989; ``hsu2024liger`` in the
bibliography); the online softmax is Milakov and Gimelshein (2018), arXiv:1805.02867
(``milakov2018online``).

On a CUDA device the row pass is a Triton kernel (one program per row); elsewhere the same
arithmetic in plain PyTorch, which the unit tests compare with ``F.cross_entropy``.
:func:`linear_cross_entropy` is the whole head fused (product, loss and gradient, one operator
that ``torch.compile`` treats as one opaque call; the backward folds the incoming gradient into
the two small products instead of a pass over the ``M x V`` gradient);
:func:`perflab.kernels.fp8.head_cross_entropy` is the same in FP8, and uses :func:`transpose` for the
one transposed copy its weight gradient needs.
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "linear_cross_entropy", "loss_and_grad", "transpose"]

_KERNELS: dict = {}


def _triton_kernels():
    """The Triton row pass and tiled transpose (compiled on first use; CUDA only)."""
    if not _KERNELS:
        import triton  # optional: CUDA builds of torch ship it; CPU builds take the torch path
        import triton.language as tl  # optional: as above

        @triton.jit
        def _rows(logits_ptr, stride_l, y_ptr, loss_ptr, grad_ptr, stride_g, V, scale,
                  BLOCK: tl.constexpr):
            row = tl.program_id(0).to(tl.int64)
            lrow = logits_ptr + row * stride_l
            # online softmax, one running maximum and sum per lane, combined at the end
            m = tl.full([BLOCK], -1e30, tl.float32)
            s = tl.zeros([BLOCK], tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(lrow + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
                m_new = tl.maximum(m, x)
                s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
                m = m_new
            top = tl.max(m, 0)
            lse = top + tl.log(tl.sum(s * tl.exp(m - top), 0))
            t = tl.load(y_ptr + row)
            tl.store(loss_ptr + row, lse - tl.load(lrow + t).to(tl.float32))
            grow = grad_ptr + row * stride_g
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < V
                x = tl.load(lrow + offs, mask=mask, other=0.0).to(tl.float32)
                p = tl.exp(x - lse)
                g = tl.where(offs == t, p - 1.0, p) * scale
                tl.store(grow + offs, g.to(grad_ptr.dtype.element_ty,
                                           fp_downcast_rounding="rtne"), mask=mask)

        @triton.jit
        def _transpose(src, dst, M, N, BM: tl.constexpr, BN: tl.constexpr):
            rm = tl.program_id(0) * BM + tl.arange(0, BM)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            tile = tl.load(src + rm[:, None].to(tl.int64) * N + rn[None, :], mask=mask)
            tl.store(dst + rn[None, :].to(tl.int64) * M + rm[:, None], tile, mask=mask)

        _KERNELS.update(rows=_rows, transpose=_transpose, cdiv=triton.cdiv)
    return _KERNELS


def loss_and_grad(logits: torch.Tensor, y: torch.Tensor, grad: torch.Tensor,
                  grad_scale: float) -> torch.Tensor:
    """Per-row cross-entropy of ``logits`` and, into ``grad``, its gradient times a constant.

    Args:
        logits: ``(M, V)`` float (bf16, fp16 or fp32), rows contiguous (``stride(1) == 1``).
        y: ``(M,)`` int64 targets in ``[0, V)`` (not checked on the device: an id outside the
            row reads another row's logit, as an out-of-range index would).
        grad: ``(M, V)`` output buffer, rows contiguous, any float dtype (bf16, fp32, or an
            FP8 dtype: the values are rounded to it, to nearest even).
        grad_scale: the constant ``c`` in ``grad[i, j] = c x (softmax(logits[i])[j] -
            [j == y[i]])``: ``1 / M`` for the gradient of the mean loss, or the FP8 format's
            largest value for a statically scaled FP8 gradient.

    Returns:
        ``(M,)`` float32 losses ``logsumexp(logits[i]) - logits[i, y[i]]`` (nats).

    Raises:
        ValueError: shapes or layouts that do not match, or a non-finite ``grad_scale``.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D float tensor, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    m, v = logits.shape
    if y.shape != (m,) or y.dtype != torch.int64:
        raise ValueError(f"y must be int64 of shape ({m},), got {y.dtype} {tuple(y.shape)}")
    if grad.shape != logits.shape or not grad.is_floating_point():
        raise ValueError(f"grad must be a float tensor of shape {tuple(logits.shape)}, got "
                         f"{grad.dtype} {tuple(grad.shape)}")
    if logits.stride(1) != 1 or grad.stride(1) != 1:
        raise ValueError("logits and grad need contiguous rows (stride(1) == 1)")
    if not abs(float(grad_scale)) < float("inf"):
        raise ValueError(f"grad_scale must be finite, got {grad_scale!r}")
    loss = torch.empty(m, dtype=torch.float32, device=logits.device)
    if logits.device.type == "cuda":
        k = _triton_kernels()
        k["rows"][(m,)](logits, logits.stride(0), y, loss, grad, grad.stride(0), v,
                        float(grad_scale), BLOCK=2048, num_warps=8)
        return loss
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=1)
    loss.copy_(lse - lf.gather(1, y[:, None]).squeeze(1))
    p = torch.exp(lf - lse[:, None])
    p[torch.arange(m, device=p.device), y] -= 1.0
    grad.copy_(p * float(grad_scale))
    return loss


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


@torch.library.custom_op("perflab::linear_cross_entropy", mutates_args=())
def _linear_ce(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss, gradient of the mean loss w.r.t. the logits, in dtype)``."""
    logits = h.to(dtype) @ w.to(dtype).t()
    grad = torch.empty_like(logits)
    rows = loss_and_grad(logits, y, grad, grad_scale=1.0 / logits.shape[0])
    return rows.mean(), grad


@_linear_ce.register_fake
def _(h, w, y, dtype):
    return (h.new_empty((), dtype=torch.float32),
            h.new_empty((h.shape[0], w.shape[0]), dtype=dtype))


def _lce_setup(ctx, inputs, output):
    h, w, _, _ = inputs
    ctx.save_for_backward(h, w, output[1])
    ctx.mark_non_differentiable(output[1])


def _lce_backward(ctx, go, _unused):
    h, w, grad = ctx.saved_tensors
    # the incoming gradient (a scalar) scales the two small products, not the M x V gradient
    grad_h = (grad @ w.to(grad.dtype)).float().mul_(go).to(h.dtype)
    grad_w = (grad.t() @ h.to(grad.dtype)).float().mul_(go).to(w.dtype)
    return grad_h, grad_w, None, None


_linear_ce.register_autograd(_lce_backward, setup_context=_lce_setup)


def linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of a language-model head, ``cross_entropy(h @ w^T, y)``, fused.

    One operator (``perflab::linear_cross_entropy``, opaque to ``torch.compile``): the product
    ``logits = h @ w^T`` in the autocast dtype (or the inputs' dtype without autocast), then
    :func:`loss_and_grad`, which writes the gradient of the mean loss w.r.t. the logits in the
    same pass that computes the loss, in the forward. The logits die inside the forward; the
    backward keeps their gradient (as large: ``M x V`` in the compute dtype) and runs
    ``grad_h = g w`` and ``grad_w = g^T h``, multiplied by the incoming gradient of the loss
    *after* the products (a scalar times the small ``(M, d)`` and ``(V, d)`` results, instead
    of one more pass over the ``M x V`` gradient). The value equals
    ``F.cross_entropy((h @ w.t()).float(), y)`` up to summation order.

    Args:
        h: features ``(B, T, d)`` or ``(M, d)``, float.
        w: head weight ``(V, d)``, float.
        y: int64 targets ``(B, T)`` or ``(M,)`` in ``[0, V)``.

    Returns:
        The 0-d float32 mean loss, differentiable in ``h`` and ``w`` (gradients in their
        dtypes).

    Raises:
        ValueError: shapes that do not match, non-float inputs or non-int64 targets.
    """
    if not h.is_floating_point() or not w.is_floating_point():
        raise ValueError(f"h and w must be float tensors, got {h.dtype} and {w.dtype}")
    h2 = h.reshape(-1, h.shape[-1])
    y2 = y.reshape(-1)
    if w.dim() != 2 or w.shape[1] != h2.shape[1]:
        raise ValueError(f"w must be (V, {h2.shape[1]}), got {tuple(w.shape)}")
    if y2.shape[0] != h2.shape[0] or y2.dtype != torch.int64:
        raise ValueError(f"y must be int64 with {h2.shape[0]} targets, got {y.dtype} "
                         f"{tuple(y.shape)}")
    return _linear_ce(h2, w, y2, compute_dtype(h2))[0]
