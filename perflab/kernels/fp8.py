"""FP8 training of linear layers: per-tensor dynamic scaling and ``torch._scaled_mm``.

A linear layer ``y = x W^T + b`` does three matrix products per training step: the forward
``x W^T``, ``grad_x = g W`` and ``grad_W = g^T x`` (``g`` the gradient of ``y``). On Hopper the
tensor cores multiply 8-bit floats at twice the bf16 rate, so :class:`Float8Linear` runs all
three in FP8, the recipe of Micikevicius et al. (2022), "FP8 Formats for Deep Learning"
(arXiv:2209.05433; ``micikevicius2022fp8`` in the book's bibliography), with one scale per
tensor computed from the tensor itself in the same step (*dynamic* scaling, no history):

* activations ``x`` and weights ``W`` are cast to ``float8_e4m3fn`` (4 exponent bits, 3 mantissa
  bits, largest value 448); gradients ``g`` to ``float8_e5m2`` (5 exponent bits, 2 mantissa
  bits, largest value 57,344: gradients span a wider range and need less precision);
* the scale of a tensor ``t`` is ``s = amax(|t|) / finfo(dtype).max``, the FP8 tensor
  ``q = clamp(t / s)`` (its largest magnitude lands on the format's largest value, so nothing
  overflows), and ``q * s`` approximates ``t``: a relative error of about 2^-4 (e4m3) or 2^-3
  (e5m2) per element, which averages down in the long dot products of a matmul;
* ``torch._scaled_mm(qa, qb, scale_a, scale_b, out_dtype=torch.bfloat16)`` multiplies the FP8
  operands on the tensor cores, accumulates in fp32, multiplies by ``scale_a * scale_b`` and
  rounds the result to bf16. The bias is added afterwards in bf16 (outside ``_scaled_mm``).

Layout rule of ``_scaled_mm`` on a GPU (cuBLASLt's FP8 kernels take only the "TN" layout): the
first operand row-major, the second column-major, every dimension of the second and the
inner dimension a multiple of 16. So the forward passes ``q_W.t()`` (a column-major view of the
row-major ``(N, K)`` weight: free); ``grad_x`` needs ``q_W`` transposed (a copy of the small
weight); ``grad_W = g^T x`` needs row-major ``q_g^T`` and column-major ``q_x``, i.e. transposed
copies of both activation-sized FP8 tensors.

Why ``grad_W`` runs in FP8 too (``grad_weight="fp8"``, the default, as in the paper's recipe):
it is a third of the layer's matmul FLOPs. In FP8 it costs two transposed FP8 copies, of ``x``
and of ``g`` (1 byte written per element, plus a re-read of the source: under
``torch.compile`` Inductor recomputes the cast inside the copy kernel). For GPT-2 124M at
65,536 tokens per step, ``x`` and ``g`` of the 48 block linears hold 4.2 G and 5.4 G elements:
the copies move about 20-30 GB, 5-8 ms at ~4 TB/s, against ~17 ms of bf16 ``grad_W`` products
of which FP8 saves 35-45 % (6-7.5 ms). At GPT-2 small's widths that is a near tie; the copies
grow with the token count like the products, but the products' FP8 gain grows with width, and
FP8 halves the bytes ``x`` keeps for the backward, so FP8 is the default and
``grad_weight="bf16"`` (a bf16 product from a saved bf16 ``x``, no copies) exists to measure
the other side. ``grad_W`` sums over all M tokens: it uses ``_scaled_mm``'s default (slower,
precise) fp32 accumulation, like ``grad_x``; the forward, whose sums are only K long, uses the
Hopper "fast accumulation" mode (``use_fast_accum=True``).

On a CPU there are no FP8 tensor cores, but ``torch._scaled_mm`` has a CPU kernel (in torch
2.13, the CI's build): it dequantizes exactly the same FP8 operands and multiplies them in
fp32, so the CPU computes the same quantized numbers (up to summation order and the bf16
rounding of the output) and the unit tests check the GPU code path's arithmetic (its layout
rules too, by intercepting every call). :func:`emulated_mm` is the same computation written
out (cast to FP8 and back, matmul in fp32), the reference of the tests.

Under ``torch.compile`` the product is one custom operator (``perflab::fp8_matmul``, opaque
to the compiler: its quantization of ``x`` and ``W`` runs inside it) whose registered backward
is traced like ordinary code, so Inductor fuses the gradient's amax reduction and cast into the
kernels around it. (An autograd.Function version returned zero gradients when compiled on
torch 2.11 with CUDA: see the comment above :func:`_fp8_forward`.) Without compile (eager)
every cast is a few separate kernels and FP8 is slower than bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from perflab.core.validate import one_of
from perflab.kernels import crossentropy

__all__ = ["Float8Linear", "convert", "fp8_matmul", "quantize", "scaled_mm", "emulated_mm",
           "check_shape", "E4M3", "E5M2"]

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
GRAD_WEIGHT = ("fp8", "bf16")
_EPS = 1e-12          # smallest amax: an all-zero tensor gets a tiny scale and stays zero


def quantize(t: torch.Tensor, dtype: torch.dtype = E4M3, bound: float | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling of ``t`` to FP8: returns ``(q, scale)``.

    Dynamic scaling (``bound=None``): ``scale = max(amax(|t|), 1e-12) / finfo(dtype).max`` (a
    0-d float32 tensor), one reduction over ``t`` first. Static scaling (``bound`` a float
    known in advance to satisfy ``|t| <= bound``): ``scale = bound / finfo(dtype).max``, no
    reduction, so the cast can fuse into the kernel that produces ``t``. Either way
    ``q = clamp(t / scale, -max, max).to(dtype)`` (``t``'s shape and strides), so ``q.float() *
    scale`` approximates ``t`` (Micikevicius et al., 2022, section 4.3); a value beyond a static
    bound saturates at the format's largest value, it never becomes inf. An all-zero tensor
    quantizes to zeros. Works under ``torch.compile`` (no data-dependent Python).

    Raises:
        ValueError: ``dtype`` is not ``float8_e4m3fn`` or ``float8_e5m2``; ``t`` not floating;
            ``bound`` not a positive finite number.
    """
    if dtype not in (E4M3, E5M2):
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if not t.is_floating_point() or t.dtype in (E4M3, E5M2):
        raise ValueError(f"t must be a float32/bf16/fp16 tensor, got {t.dtype}")
    top = torch.finfo(dtype).max
    if bound is not None:
        if isinstance(bound, bool) or not 0 < float(bound) < float("inf"):
            raise ValueError(f"bound must be a positive finite float, got {bound!r}")
        scale = torch.full((), float(bound) / top, dtype=torch.float32, device=t.device)
    else:
        amax = t.detach().abs().amax().float().clamp(min=_EPS)
        scale = amax / top
    q = (t.float() / scale).clamp(-top, top).to(dtype)
    return q, scale


def check_shape(in_features: int, out_features: int, where: str = "linear layer") -> None:
    """Raise ValueError unless ``_scaled_mm`` can take a layer ``in_features -> out_features``.

    cuBLASLt's FP8 products need every dimension of the second operand and the inner dimension
    to be multiples of 16: here ``in_features`` (K) and ``out_features`` (N).
    """
    bad = [f"{n}={v}" for n, v in (("in_features", in_features),
                                    ("out_features", out_features)) if v % 16]
    if bad:
        raise ValueError(f"{where}: torch._scaled_mm needs in_features and out_features "
                         f"that are multiples of 16, got {', '.join(bad)}")


def scaled_mm(a, b, sa, sb, fast: bool) -> torch.Tensor:
    """``(a * sa) @ (b * sb)`` in bf16 by ``torch._scaled_mm``: ``a`` row-major FP8 ``(m, k)``,
    ``b`` FP8 ``(k, n)`` made column-major here if it is not (a copy); ``sa``, ``sb`` 0-d
    float32 scales; ``fast`` FP8 fast accumulation (the forward's choice, not the gradients').
    Chapter 10's FP8 head (:mod:`perflab.gpt2.heads`) multiplies with it too."""
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=None,
                            out_dtype=torch.bfloat16, use_fast_accum=fast)


def emulated_mm(a: torch.Tensor, b: torch.Tensor, a_dtype: torch.dtype = E4M3,
                b_dtype: torch.dtype = E4M3) -> torch.Tensor:
    """What an FP8 product computes, written out: ``a (m, k) @ b (k, n)`` with both operands
    quantized by :func:`quantize` (to ``a_dtype`` and ``b_dtype``), dequantized back
    (``q.float() * scale``) and multiplied in float32. Returns float32 ``(m, n)``.

    The reference :class:`Float8Linear` is tested against (and a stand-in for
    ``_scaled_mm`` where a build has no kernel for the device).

    Raises:
        ValueError: not two 2-D tensors with matching inner dimension (or bad dtypes).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a and b must be (m, k) and (k, n), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    qa, sa = quantize(a, a_dtype)
    qb, sb = quantize(b, b_dtype)
    return (qa.float() * sa) @ (qb.float() * sb)


_out_dtype = crossentropy.compute_dtype


# The product is a custom operator (torch.library.custom_op) with its gradient registered
# (register_autograd), not a torch.autograd.Function: torch.compile then treats the forward as
# one opaque node and AOTAutograd traces the registered backward like any other code (its
# amax reductions and casts fuse with the kernels around them). A torch.autograd.Function
# version of exactly this code, compiled on torch 2.11 with CUDA, returned all-zero gradients
# for x and W (Dynamo's tracing of the Function's backward; every backend, even "eager"; with
# the grad_W product in bf16 too), while the same code run eagerly was right: the FP8 layers'
# weights never moved, which chapter 10's loss curves showed. tests/test_fp8.py compares
# compiled and eager gradients; the reference run checks the loss curve on the GPU.
def _fp8_forward(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, fp8_grad_weight: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x (M, K) @ W (N, K)^T`` in FP8 -> ``(y (M, N), saved_x, scale_x, q_W, scale_W)``, ``y``
    rounded to bf16 and then cast to ``out_dtype``; ``saved_x`` is the FP8 ``x`` (for an FP8
    ``grad_W``) or ``x`` in bf16."""
    qx, sx = quantize(x, E4M3)
    qw, sw = quantize(w, E4M3)
    y = scaled_mm(qx, qw.t(), sx, sw, fast=True).to(out_dtype)
    saved = qx if fp8_grad_weight else x.to(torch.bfloat16)
    return y, saved, sx, qw, sw


@torch.library.custom_op("perflab::fp8_matmul", mutates_args=())
def _fp8_matmul(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, fp8_grad_weight: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_fp8_forward` as one operator (opaque to torch.compile)."""
    return _fp8_forward(x, w, out_dtype, fp8_grad_weight)


@_fp8_matmul.register_fake
def _(x, w, out_dtype, fp8_grad_weight):
    m, n = x.shape[0], w.shape[0]
    scalar = x.new_empty((), dtype=torch.float32)
    saved = x.new_empty(x.shape, dtype=E4M3 if fp8_grad_weight else torch.bfloat16)
    return (x.new_empty((m, n), dtype=out_dtype), saved, scalar,
            w.new_empty(w.shape, dtype=E4M3), scalar.clone())


def _fp8_setup(ctx, inputs, output):
    x, w, _, fp8_grad_weight = inputs
    _, saved, sx, qw, sw = output
    ctx.save_for_backward(saved, sx, qw, sw)
    ctx.fp8_grad_weight = fp8_grad_weight
    ctx.x_dtype, ctx.w_dtype = x.dtype, w.dtype
    ctx.mark_non_differentiable(*output[1:])


def _fp8_backward(ctx, g, *_unused):
    saved, sx, qw, sw = ctx.saved_tensors
    g = g.contiguous()
    qg, sg = quantize(g, E5M2)
    # g (M, N) @ W (N, K): W must be column-major, i.e. a row-major copy of W^T
    grad_x = scaled_mm(qg, qw.t().contiguous().t(), sg, sw, fast=False).to(ctx.x_dtype)
    if ctx.fp8_grad_weight:
        # g^T (N, M) row-major @ x (M, K) column-major (a (K, M) row-major copy, .t())
        grad_w = scaled_mm(qg.t().contiguous(), saved.t().contiguous().t(), sg, sx, fast=False)
    else:
        grad_w = g.to(torch.bfloat16).t() @ saved
    return grad_x, grad_w.to(ctx.w_dtype), None, None


_fp8_matmul.register_autograd(_fp8_backward, setup_context=_fp8_setup)


def fp8_matmul(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
               grad_weight: str = "fp8") -> torch.Tensor:
    """``x (M, K) @ w (N, K)^T`` with its three training products in FP8 (module docstring).

    Args:
        x: 2-D float input ``(M, K)``; ``M`` a multiple of 16 with ``grad_weight="fp8"``.
        w: 2-D float weight ``(N, K)``; ``N`` and ``K`` multiples of 16.
        out_dtype: the output's dtype (the product is rounded to bf16 first); the gradient
            arrives in it and is quantized from it.
        grad_weight: ``"fp8"`` or ``"bf16"``: the precision of ``grad_W = g^T x``.

    Returns:
        ``(M, N)`` in ``out_dtype``; differentiable in ``x`` and ``w``.

    Raises:
        ValueError: not two 2-D tensors with a shared inner dimension, or an unknown
            ``grad_weight``.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x and w must be (M, K) and (N, K), got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    one_of("grad_weight", grad_weight, GRAD_WEIGHT)
    return _fp8_matmul(x, w, out_dtype, grad_weight == "fp8")[0]


class Float8Linear(nn.Linear):
    """``nn.Linear`` whose matrix products run in FP8 with per-tensor dynamic scales.

    Input ``(..., in_features)`` of any float dtype, output ``(..., out_features)`` in the
    autocast dtype under ``torch.autocast``, else in the input's dtype. The weight and bias
    stay in their own dtype (float32 master weights); every call casts them anew.
    ``x W^T`` and ``grad_x = g W`` always run through ``torch._scaled_mm`` (e4m3 ``x`` and
    ``W``, e5m2 ``g``); ``grad_W = g^T x`` too with ``grad_weight="fp8"``, in bf16 with
    ``"bf16"`` (see the module docstring for why FP8 is the default). The bias is added in the
    output dtype after the product.

    Args (beyond ``nn.Linear``'s):
        grad_weight: ``"fp8"`` or ``"bf16"``.

    Raises:
        ValueError: ``in_features``/``out_features`` not multiples of 16, an unknown
            ``grad_weight``; at call time, with ``grad_weight="fp8"``, a token count
            (the product of the input's leading dimensions) not a multiple of 16.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None, grad_weight: str = "fp8"):
        check_shape(in_features, out_features, "Float8Linear")
        one_of("grad_weight", grad_weight, GRAD_WEIGHT)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.grad_weight = grad_weight

    @classmethod
    def from_linear(cls, linear: nn.Linear, grad_weight: str = "fp8") -> "Float8Linear":
        """A :class:`Float8Linear` sharing ``linear``'s weight and bias Parameters (no copy).

        Raises:
            TypeError: ``linear`` is not an ``nn.Linear``; ValueError: see the class.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device="meta", grad_weight=grad_weight)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input's last dimension must be in_features={self.in_features}, "
                             f"got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        fp8_gw = self.grad_weight == "fp8"
        if fp8_gw and x2.shape[0] % 16:
            raise ValueError(f"Float8Linear with grad_weight='fp8' needs a token count "
                             f"(product of the leading dimensions) that is a multiple of 16, "
                             f"got {x2.shape[0]} from input shape {tuple(x.shape)}; use "
                             f"grad_weight='bf16' or pad")
        out_dtype = _out_dtype(x)
        y = fp8_matmul(x2, self.weight, out_dtype, self.grad_weight)
        if self.bias is not None:
            y = y + self.bias.to(out_dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", grad_weight={self.grad_weight!r}"


def convert(model: nn.Module, grad_weight: str = "fp8") -> int:
    """Swap every ``nn.Linear`` inside ``model.blocks`` for a :class:`Float8Linear` sharing its
    Parameters (in place; an optimizer built before still holds the same tensors). Returns
    how many were swapped (0 if already converted). The tied head/embedding, outside the
    blocks, stays as it is. Call it before ``torch.compile``.

    For GPT-2 124M: 12 blocks x 4 layers (qkv 768->2304, proj 768->768, fc 768->3072,
    proj 3072->768) = 48.

    Raises:
        TypeError: ``model`` has no ``blocks``; ValueError: a layer whose sizes
            ``_scaled_mm`` cannot take (named; nothing is swapped then) or a bad
            ``grad_weight``.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise TypeError(f"model must have a .blocks module (a perflab.gpt2.model.GPT), "
                        f"got {type(model).__name__}")
    one_of("grad_weight", grad_weight, GRAD_WEIGHT)
    todo = []
    for name, module in blocks.named_modules():
        for child_name, child in module.named_children():
            if type(child) is nn.Linear:
                full = f"blocks.{name + '.' if name else ''}{child_name}"
                check_shape(child.in_features, child.out_features, full)
                todo.append((module, child_name, child))
    for parent, child_name, child in todo:
        setattr(parent, child_name, Float8Linear.from_linear(child, grad_weight))
    return len(todo)
