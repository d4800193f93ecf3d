""""The same result": whether a faster training loop still trains the same, with a tolerance that can fail.

:func:`final_loss` (a run's result, less noisy than its last step), :func:`loss_tolerance` (from
the seed-to-seed spread of training) and :func:`same_losses` (step by step, for loops that only
reorder floating-point sums).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from perflab.core.validate import positive

__all__ = ["final_loss", "loss_tolerance", "same_losses"]


def final_loss(losses: Sequence[float]) -> float:
    """Mean of the last fifth of ``losses`` (at least one): a training run's result, less noisy
    than its last step.

    Raises:
        ValueError: no losses, or one that is not finite.
    """
    values = [float(v) for v in losses]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError("losses must be a non-empty list of finite numbers")
    k = max(1, len(values) // 5)
    return sum(values[-k:]) / k


def loss_tolerance(seed_losses: Sequence[float], k: float = 3.0) -> float:
    """How far a final loss may be from a reference and still be "the same training": ``k``
    standard deviations of the final loss over runs that differ only in their random seed.

    Training from another seed is the spread a result has by nature; a speed optimization that
    only reorders floating-point sums moves the loss far less, and one that changes the training
    (fewer batches, one batch seen over and over, another learning rate) moves it by more than the
    seeds do. The floor, 1e-4 of the mean loss, keeps a degenerate spread (identical seeds) from
    rejecting rounding.

    Raises:
        ValueError: fewer than two losses, a loss that is not finite, or ``k`` not positive.
    """
    values = [float(v) for v in seed_losses]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError("need at least two finite final losses from different seeds")
    positive("k", k)
    return max(k * statistics.stdev(values), 1e-4 * abs(statistics.fmean(values)))


def same_losses(reference: Sequence[float], losses: Sequence[float], rtol: float = 1e-3) -> bool:
    """True when ``losses`` follow ``reference`` step by step: same length, and every loss within
    ``rtol`` (relative) of the reference's at that step.

    For two loops that do the same arithmetic in another order (a fused optimizer, a mask turned
    into a weight, a copy made asynchronous) the losses differ by rounding, about 1e-6 relative,
    growing slowly over the steps; a loop that trains on other data or with another loss differs
    at its first steps by percents.

    Raises:
        ValueError: ``rtol`` not positive, or a loss that is not finite.
    """
    positive("rtol", rtol)
    ref, got = [float(v) for v in reference], [float(v) for v in losses]
    if not all(math.isfinite(v) for v in ref + got):
        raise ValueError("losses must be finite")
    return len(ref) == len(got) and all(abs(a - b) <= rtol * abs(a) for a, b in zip(ref, got))
