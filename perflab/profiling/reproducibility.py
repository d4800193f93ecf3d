"""Making runs repeatable: seeds, deterministic algorithms, and run-to-run noise.

Following PyTorch's reproducibility notes ("Reproducibility", PyTorch documentation): seed every
random number generator the program uses (Python's ``random``, NumPy, torch on CPU and every CUDA
device), and ask for deterministic algorithms where bitwise-identical results matter, knowing that
some of them are slower. Noise is measured, not assumed: :func:`coefficient_of_variation` of
repeated medians says how far two runs of one benchmark disagree.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from perflab.core.timing import benchmark
from perflab.core.validate import integer, number, positive

__all__ = ["coefficient_of_variation", "cv_interval", "deterministic", "repeated_medians",
           "seed_everything"]


def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and all CUDA devices).

    Returns the seed. Data-loader workers and other processes need their own seeding.

    Raises:
        ValueError: ``seed`` is not an integer in ``[0, 2**32)``.
    """
    integer("seed", seed, 0, 2**32 - 1)

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Within the block, require deterministic algorithms (or, ``enabled=False``, allow any).

    Sets ``torch.use_deterministic_algorithms(enabled)``, ``torch.backends.cudnn.deterministic``
    and turns ``torch.backends.cudnn.benchmark`` off when enabling (autotuning may pick a
    different algorithm run to run); restores all three afterwards. Operators that have no
    deterministic implementation raise ``RuntimeError`` inside the block. On CUDA, cuBLAS
    additionally needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment before the process
    first uses it, or matrix products raise.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic = before[2]
        torch.backends.cudnn.benchmark = before[3]


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation divided by the mean (dimensionless): the relative spread.

    A CV of 0.02 says repeated measurements typically differ by about 2 %; differences smaller
    than a few CVs are noise, not speed-ups.

    Raises:
        ValueError: fewer than 2 values, a non-finite value, or a mean that is not positive.
    """
    vals = [float(v) for v in values]
    if len(vals) < 2:
        raise ValueError(f"values needs at least 2 measurements, got {len(vals)}")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError("values must all be finite numbers")
    mean = statistics.fmean(vals)
    number("the mean of values", mean, above=0)
    return statistics.stdev(vals) / mean


def _chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of the chi-square distribution with ``df`` degrees of freedom, by
    bisection on its CDF (the regularized lower incomplete gamma, ``torch.special.gammainc``)."""
    lo, hi = 0.0, 10.0 * df + 50.0
    a = torch.tensor(df / 2, dtype=torch.float64)
    for _ in range(80):
        mid = (lo + hi) / 2
        cdf = torch.special.gammainc(a, torch.tensor(mid / 2, dtype=torch.float64)).item()
        lo, hi = (mid, hi) if cdf < p else (lo, mid)
    return (lo + hi) / 2


def cv_interval(values: Sequence[float], level: float = 0.9) -> tuple[float, float, float]:
    """The coefficient of variation of ``values`` with its sampling interval:
    ``(low, cv, high)``, dimensionless.

    A CV read from ten medians is itself uncertain (by about a quarter). The interval is the
    standard confidence interval on the standard deviation of ``n`` normal samples, scaled by
    the mean: ``cv * sqrt((n - 1) / q)`` for ``q`` the chi-square quantiles with ``n - 1``
    degrees of freedom at ``(1 + level) / 2`` (low end) and ``(1 - level) / 2`` (high end);
    Hoefler and Belli ask for such an interval beside every reported spread
    (``hoefler2015benchmarking``). For ten values at ``level=0.9`` it runs from 0.73 to 1.64
    times the CV. A verdict about the noise ("a 1 % difference is above three CVs") is decided
    only when the whole interval is on one side.

    Raises:
        ValueError: as :func:`coefficient_of_variation`, or ``level`` not in (0, 1).
    """
    cv = coefficient_of_variation(values)
    number("level", level, above=0, below=1)
    df = len(values) - 1
    low = cv * math.sqrt(df / _chi2_quantile((1 + level) / 2, df))
    high = cv * math.sqrt(df / _chi2_quantile((1 - level) / 2, df))
    return low, cv, high


def repeated_medians(
    fn: Callable[[], object],
    device: torch.device | str | None = None,
    repeats: int = 10,
    min_run_time_s: float = 0.1,
) -> list[float]:
    """Run :func:`perflab.core.timing.benchmark` ``repeats`` times on ``fn``; each call's median, seconds.

    Each repetition is a full benchmark (warm-up, many calls, a median), so the spread of the
    returned list is run-to-run noise, not call-to-call jitter.

    Raises:
        ValueError: ``repeats`` < 2 or ``min_run_time_s`` not positive.
    """
    integer("repeats", repeats, 2)             # a spread needs two
    positive("min_run_time_s", min_run_time_s)
    return [benchmark(fn, device, min_run_time_s=min_run_time_s) for _ in range(repeats)]
