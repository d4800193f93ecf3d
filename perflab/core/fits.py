"""The one "fixed cost + linear" fit of the course: ``y = fixed + slope * x`` by least squares.

Three chapters read a fixed cost and a rate off a line: a kernel's launch-and-tail cost and the
marginal bandwidth of a cache level (chapter 2, :func:`perflab.machine.caches.fit_fixed_cost`), the
per-call overhead and per-element cost of an operator (chapter 3,
:func:`perflab.internals.operators.fit_call_cost`), and the time per wave of a matrix product (chapter 2,
:func:`perflab.machine.waves.fit_waves`). All call :func:`fit_line`.

``relative=True`` minimises the *relative* residuals ``sum(((fixed + slope*x_i) - y_i) / y_i)^2``
(weighted least squares with weights ``1 / y_i^2``), so that small measurements (which set the
fixed cost) weigh as much as large ones (which set the slope).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["LineFit", "fit_line"]


@dataclass(frozen=True)
class LineFit:
    """``y = fixed + slope * x``.

    Attributes:
        fixed: the intercept, in the unit of ``y``.
        slope: in the unit of ``y`` per unit of ``x``.
        rms_relative: root-mean-square of the relative residuals ``(fit - y) / y``.
        points: how many points were fitted.
    """

    fixed: float
    slope: float
    rms_relative: float
    points: int

    def __call__(self, x: float) -> float:
        """The fitted ``y`` at ``x``."""
        return self.fixed + self.slope * x


def fit_line(x: Sequence[float], y: Sequence[float], relative: bool = False) -> LineFit:
    """Fit ``y = fixed + slope * x`` by least squares (relative residuals when ``relative``).

    Raises:
        ValueError: ``x`` and ``y`` of different lengths, fewer than two distinct ``x``, a value
            that is not finite, or (``relative``) a ``y`` that is not positive.
    """
    xs = np.asarray(list(x), dtype=float)
    ys = np.asarray(list(y), dtype=float)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size < 2 or np.unique(xs).size < 2:
        raise ValueError("need at least two distinct x values to fit a line")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ValueError("x and y must be finite")
    if relative and (ys <= 0).any():
        raise ValueError("relative=True needs every y > 0")
    design = np.stack([np.ones_like(xs), xs], axis=1)
    if relative:
        (fixed, slope), *_ = np.linalg.lstsq(design / ys[:, None], np.ones_like(ys), rcond=None)
    else:
        (fixed, slope), *_ = np.linalg.lstsq(design, ys, rcond=None)
    fitted = fixed + slope * xs
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = float(np.sqrt(np.mean(((fitted - ys) / ys) ** 2)))
    return LineFit(float(fixed), float(slope), rms, int(xs.size))
