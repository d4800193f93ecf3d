"""Number formats and mixed precision: what fp32, tf32, bf16, fp16 and fp8 can hold, and training with them.

* :func:`format_table` reads each format's bits, range and precision from ``torch.finfo``
  (TF32 has no torch dtype: it is float32's exponent with a 10-bit mantissa, the tensor cores'
  internal multiply format, NVIDIA A100 whitepaper); :func:`round_trip` shows overflow,
  underflow and rounding.
* :func:`lost_update_fraction` shows why pure-bf16 weights lose small updates that fp32
  master weights keep.
* :func:`make_mlp` is the matmul-heavy model chapter 9 and lab 9 train in each precision; the
  training step itself (``fp32``, ``tf32``, ``bf16`` autocast, ``fp16`` with
  ``torch.amp.GradScaler``, ``bf16_pure``) is taught on chapter 9's page and exported to
  :mod:`perflab.kernels.amp`.
* :func:`quantize_fp8` / :func:`fp8_matmul`: an fp8 (e4m3) matrix product with one scale per
  tensor through ``torch._scaled_mm``.

Units: bytes, seconds; relative errors are dimensionless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from perflab.core.validate import number
from perflab.kernels.amp import MODES

__all__ = ["format_table", "FormatInfo", "FORMATS", "fp8_matmul", "lost_update_fraction",
           "make_mlp", "MODES", "quantize_fp8", "relative_error", "round_trip"]

FORMATS = ("float32", "tf32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class FormatInfo:
    """One floating-point format.

    Attributes:
        name: ``"float32"``, ``"tf32"``, ... (a torch dtype name, except tf32).
        bits: total bits (tf32: 19 significant bits, stored in 32).
        exponent_bits, mantissa_bits: field widths (the sign is the remaining bit).
        max: largest finite value.
        smallest_normal: smallest positive normal value (``finfo.tiny``).
        smallest_subnormal: smallest positive value at all (``smallest_normal * eps``).
        eps: gap between 1 and the next value, ``2**-mantissa_bits``.
        decimal_digits: about ``-log10(eps)`` significant decimal digits.
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    decimal_digits: float


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"format must be one of {FORMATS}, got {name!r}")
    return dtype


def format_table(names: tuple[str, ...] = FORMATS) -> list[FormatInfo]:
    """:class:`FormatInfo` for each format name, read from ``torch.finfo``.

    The mantissa width is ``-log2(eps)`` and the exponent width ``bits - 1 - mantissa``. TF32's
    row takes float32's range with ``eps = 2**-10`` (10 explicit mantissa bits).

    Raises:
        ValueError: an unknown format name.
    """
    rows = []
    for name in names:
        if name == "tf32":
            f32 = torch.finfo(torch.float32)
            eps = 2.0 ** -10
            rows.append(FormatInfo("tf32", 19, 8, 10, f32.max, f32.tiny, f32.tiny * eps, eps, -math.log10(eps)))
            continue
        info = torch.finfo(_dtype(name))
        mant = round(-math.log2(info.eps))
        rows.append(FormatInfo(name, info.bits, info.bits - 1 - mant, mant, info.max, info.tiny,
                               info.tiny * info.eps, info.eps, -math.log10(info.eps)))
    return rows


def round_trip(values, dtype: torch.dtype, device="cpu") -> list[float]:
    """Each value stored in ``dtype`` on ``device`` and read back as float64: shows rounding,
    overflow, underflow.

    The cast runs on ``device`` (default the CPU), whose implementation decides what happens
    beyond a format's range: float16 overflows to ``inf`` past 65504; float8_e4m3fn has no
    infinity, and a plain cast of a value past 448 gives NaN on CUDA, while some CPU builds
    saturate at 448; values below the smallest subnormal flush to 0.

    Raises:
        TypeError: ``dtype`` is not a floating-point torch dtype.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    return t.to(dtype).to(torch.float64).cpu().tolist()


def lost_update_fraction(weights: torch.Tensor, updates: torch.Tensor, dtype: torch.dtype) -> float:
    """Fraction of nonzero updates that vanish when ``weights + updates`` is computed in ``dtype``.

    An update is lost when the sum, rounded to ``dtype``, equals the weight rounded to
    ``dtype``: the update is smaller than half the gap between neighbouring values at that
    weight (bf16 keeps 8 significant bits, so at a weight of 1 any update below 2**-9 is lost).
    Keeping an fp32 master copy of the weights avoids this.

    Raises:
        ValueError: shapes differ or no update is nonzero.
    """
    if weights.shape != updates.shape:
        raise ValueError(f"weights and updates must have one shape, got {tuple(weights.shape)} and "
                         f"{tuple(updates.shape)}")
    nonzero = updates != 0
    if not bool(nonzero.any()):
        raise ValueError("updates has no nonzero element")
    w = weights.to(dtype)
    lost = (w + updates.to(dtype)) == w
    return float((lost & nonzero).sum() / nonzero.sum())


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norms, computed in float64)."""
    exact64 = exact.double()
    return float(torch.linalg.vector_norm(approx.double() - exact64) / torch.linalg.vector_norm(exact64))


def make_mlp(width: int, depth: int, device, seed: int = 0) -> torch.nn.Module:
    """A matmul-heavy model: ``depth`` blocks of Linear(width, 4 width) -> GELU -> Linear(4 width, width).

    Each block does ``16 * width**2`` FLOPs per sample forward (two matmuls of ``2 * 4 width**2``),
    so for widths in the thousands nearly all its time is matrix products. Ends with a
    Linear(width, 1) head; float32 parameters.

    Raises:
        ValueError: ``width`` or ``depth`` below 1.
    """
    number("width", width, minimum=1)
    number("depth", depth, minimum=1)
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers).to(device)


def quantize_fp8(t: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling to fp8: ``scale = amax / finfo(dtype).max``, ``q = (t / scale).to(dtype)``.

    The largest magnitude lands on the format's largest value, so nothing overflows and the
    format's few mantissa bits cover the tensor's range. Returns ``(q, scale)`` with ``scale``
    a 0-d float32 tensor; ``q.float() * scale`` approximates ``t``.

    Raises:
        ValueError: ``dtype`` is not an fp8 dtype, or ``t`` is all zeros.
    """
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    amax = t.abs().max().float()
    if float(amax) == 0:
        raise ValueError("t is all zeros: no scale can be derived")
    scale = amax / torch.finfo(dtype).max
    q = (t.float() / scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    return q, scale


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``a @ b`` through fp8 e4m3 with one scale per tensor (``torch._scaled_mm``).

    ``a`` is ``(m, k)``, ``b`` is ``(k, n)``; both are quantized by :func:`quantize_fp8`. The
    kernel wants the first operand row-major and the second column-major, so ``b`` is quantized
    as ``b.t().contiguous()`` and passed transposed back (a column-major view). ``scale_a`` and
    ``scale_b`` multiply the fp32 accumulator before the output is rounded to ``out_dtype``.
    On a GPU the dimensions must be multiples of 16 and the chip must have fp8 tensor cores
    (compute capability 8.9 or newer).

    Raises:
        ValueError: not two 2-D tensors with matching inner dimension.
        RuntimeError: from ``torch._scaled_mm`` (unsupported device or shape).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a and b must be (m, k) and (k, n), got {tuple(a.shape)} and {tuple(b.shape)}")
    qa, sa = quantize_fp8(a)
    qbt, sb = quantize_fp8(b.t().contiguous())
    return torch._scaled_mm(qa, qbt.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
