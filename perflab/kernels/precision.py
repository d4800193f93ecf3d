"""Number formats and mixed precision: what fp32, tf32, bf16, fp16 and fp8 can hold, and training with them.

* :func:`format_table` reads each format's bits, range and precision from ``torch.finfo``
  (TF32 has no torch dtype: it is float32's exponent with a 10-bit mantissa, the tensor cores'
  internal multiply format, NVIDIA A100 whitepaper); :func:`round_trip` shows overflow,
  underflow and rounding.
* :func:`lost_update_fraction` shows why pure-bf16 weights lose small updates that fp32
  master weights keep.
* :func:`tf32_flags` / :func:`float32_matmul` read and set the flags that let float32 matmuls
  (``torch.backends.cuda.matmul.allow_tf32``, ``torch.set_float32_matmul_precision``) and
  convolutions (``torch.backends.cudnn.allow_tf32``) use TF32 tensor cores.
* :func:`make_mlp`, :func:`make_train_step` and :func:`train` run the same training step in
  the modes a chapter compares: ``fp32`` (TF32 off), ``tf32``, ``bf16`` (autocast), ``fp16``
  (autocast with ``torch.amp.GradScaler``) and ``bf16_pure`` (bf16 weights, no master copy).
* :func:`quantize_fp8` / :func:`fp8_matmul`: an fp8 (e4m3) matrix product with one scale per
  tensor through ``torch._scaled_mm``.

Units: bytes, seconds; relative errors are dimensionless.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

__all__ = ["float32_matmul", "format_table", "FormatInfo", "FORMATS", "fp8_matmul",
           "lost_update_fraction", "make_mlp", "make_train_step", "MODES", "quantize_fp8",
           "relative_error", "round_trip", "tf32_flags", "train", "TrainResult"]

FORMATS = ("float32", "tf32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
MODES = ("fp32", "tf32", "bf16", "fp16", "bf16_pure")


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


def round_trip(values, dtype: torch.dtype) -> list[float]:
    """Each value stored in ``dtype`` and read back as float64: shows rounding, overflow, underflow.

    float16 overflows to ``inf`` past 65504; float8_e4m3fn has no infinity and saturation is
    not applied by a plain cast, so values past 448 become NaN; values below the smallest
    subnormal flush to 0.

    Raises:
        TypeError: ``dtype`` is not a floating-point torch dtype.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    t = torch.tensor(list(values), dtype=torch.float64)
    return t.to(dtype).to(torch.float64).tolist()


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


def tf32_flags() -> dict[str, object]:
    """The three settings that decide whether float32 math may use TF32 tensor cores.

    Returns ``{"cuda.matmul.allow_tf32": bool, "cudnn.allow_tf32": bool,
    "float32_matmul_precision": "highest" | "high" | "medium"}``. ``allow_tf32`` for matmuls and
    the matmul precision are two views of one setting (``"high"`` allows TF32); convolutions have
    their own flag, on by default.
    """
    with _quiet_tf32():
        return {
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }


@contextlib.contextmanager
def _quiet_tf32():
    with warnings.catch_warnings():
        # newer torch may suggest its fp32_precision API when the classic flags are read or set;
        # the classic flags are what torch 2.11 and 2.13 both honour
        warnings.filterwarnings("ignore", message=".*fp32_precision.*")
        warnings.filterwarnings("ignore", message=".*new API settings.*")
        yield


@contextlib.contextmanager
def float32_matmul(precision: str) -> Iterator[None]:
    """Run a block with ``torch.set_float32_matmul_precision(precision)``, restoring it after.

    ``"highest"``: float32 matmuls in full float32 (CUDA cores); ``"high"``: TF32 tensor cores
    allowed. Convolutions are governed by ``torch.backends.cudnn.allow_tf32`` instead, which
    this leaves alone.

    Raises:
        ValueError: ``precision`` is not ``"highest"``, ``"high"`` or ``"medium"``.
    """
    if precision not in ("highest", "high", "medium"):
        raise ValueError(f"precision must be 'highest', 'high' or 'medium', got {precision!r}")
    with _quiet_tf32():
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        with _quiet_tf32():
            torch.set_float32_matmul_precision(before)


def make_mlp(width: int, depth: int, device, seed: int = 0) -> torch.nn.Module:
    """A matmul-heavy model: ``depth`` blocks of Linear(width, 4 width) -> GELU -> Linear(4 width, width).

    Each block does ``16 * width**2`` FLOPs per sample forward (two matmuls of ``2 * 4 width**2``),
    so for widths in the thousands nearly all its time is matrix products. Ends with a
    Linear(width, 1) head; float32 parameters.

    Raises:
        ValueError: ``width`` or ``depth`` below 1.
    """
    if width < 1 or depth < 1:
        raise ValueError(f"width and depth must be >= 1, got {width} and {depth}")
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers).to(device)


@dataclass
class TrainResult:
    """What :func:`train` saw: the loss of each step, in order, and the model's final weights."""

    losses: list[float]
    model: torch.nn.Module


def make_train_step(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, mode: str,
                    lr: float = 1e-3, max_norm: float = 1.0) -> Callable[[], torch.Tensor]:
    """One training step (forward, MSE loss, backward, clip, SGD with momentum) in ``mode``.

    Modes: ``"fp32"`` (TF32 off), ``"tf32"`` (float32 storage, TF32 matmuls), ``"bf16"``
    (``torch.autocast`` to bfloat16; weights and optimizer stay float32), ``"fp16"`` (autocast
    to float16 with ``torch.amp.GradScaler``: scale the loss, backward, ``unscale_`` the
    gradients *before* clipping so the clip sees true magnitudes, ``step`` (skipped when a
    gradient is inf/NaN), ``update`` the scale), ``"bf16_pure"`` (the model converted to
    bfloat16: no master weights). Returns a callable that runs one step and returns the loss
    (a 0-d tensor; call ``.item()`` outside timed regions).

    Raises:
        ValueError: unknown ``mode``, or fp16 requested on a device without fp16 autocast.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    dev = inputs.device
    if mode == "bf16_pure":
        model.to(torch.bfloat16)
        inputs, targets = inputs.to(torch.bfloat16), targets.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler(dev.type) if mode == "fp16" else None
    precision = "high" if mode == "tf32" else "highest"

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with float32_matmul(precision), torch.autocast(dev.type, dtype=amp_dtype or torch.float32,
                                                       enabled=amp_dtype is not None):
            loss = torch.nn.functional.mse_loss(model(inputs).float(), targets.float())
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)                  # true gradients, before the clip reads them
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(opt)                      # skipped if unscale_ found inf/NaN
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
        return loss.detach()

    return step


def train(mode: str, width: int, depth: int, batch: int, steps: int, device, lr: float = 1e-3,
          seed: int = 0) -> TrainResult:
    """Train a fresh :func:`make_mlp` for ``steps`` steps on a fixed regression problem.

    The data (``batch x width`` inputs, targets from a fixed random linear map) and the initial
    weights depend only on ``seed``, so every mode starts from the same point and the loss
    curves can be compared step by step.

    Raises:
        ValueError: ``steps`` below 1, or as :func:`make_train_step`.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    model = make_mlp(width, depth, device, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, width, generator=g).to(device)
    target = (x @ torch.randn(width, 1, generator=g).to(device)) / math.sqrt(width)
    step = make_train_step(model, x, target, mode, lr=lr)
    losses = [step() for _ in range(steps)]
    return TrainResult([float(v) for v in losses], model)


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
