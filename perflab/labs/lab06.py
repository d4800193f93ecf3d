"""Lab 6's check: the fast loop gives the same result, and is faster."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from perflab.labs.exercises import ExerciseFailed, check_ratio_at_least, not_done
from perflab.speed.techniques import loss_within

__all__ = ["check_same_and_faster"]


def check_same_and_faster(what: str, slow_losses: Sequence[float], fast_losses: Sequence[float],
                          slow_s: float, fast_s: float, device: torch.device | str,
                          min_ratio: float, ratio_on_cpu: bool = False, rtol: float = 0.05,
                          atol: float = 0.02) -> bool:
    """A lab check: the fast loop gives the same result, and (where meaningful) is faster.

    ``what`` starts with the exercise's name, e.g. ``"Exercise 2: pinned copies"``; an answer
    that is still ``None`` raises "Exercise 2 is not done yet" (see :func:`not_done`).

    * Result (every device): both loss lists have the same length and the fast loop's final
      loss is within :func:`loss_within` (``rtol``, ``atol``) of the slow loop's.
    * Speed: ``slow_s / fast_s >= min_ratio`` (both measured in the same run). Checked on a
      CUDA device always, on a CPU only when ``ratio_on_cpu`` (for effects that exist there,
      such as per-call overhead); otherwise the check says that the speed part needs a GPU.

    Prints one sentence and returns True on success.

    Raises:
        perflab.labs.exercises.ExerciseFailed: missing answers, a changed result or too small a
            speedup (the message says which).
    """
    if slow_losses is None or fast_losses is None or fast_s is None:
        number = what.split(":")[0].replace("Exercise", "").strip() or "?"
        not_done(number, "run your version of the loop first (its result is still None)")
    slow, fast = [float(v) for v in slow_losses], [float(v) for v in fast_losses]
    if not fast or len(fast) != len(slow):
        raise ExerciseFailed(f"✗ {what}: expected {len(slow)} losses, got {len(fast)}.")
    if not all(math.isfinite(v) for v in fast):
        raise ExerciseFailed(f"✗ {what}: a loss is not finite.")
    if not loss_within(fast[-1], slow[-1], rtol, atol):
        raise ExerciseFailed(f"✗ {what}: the result changed: final loss {fast[-1]:.4f} against "
                             f"{slow[-1]:.4f} (tolerance {rtol:.0%} + {atol}).")
    dev = torch.device(device)
    if dev.type == "cuda" or ratio_on_cpu:
        check_ratio_at_least(slow_s, fast_s, min_ratio, f"{what} (speedup, same result)")
    else:
        print(f"✓ {what}: same result (final loss {fast[-1]:.4f}); the speed part "
              f"(≥ {min_ratio:g}x) needs a GPU and is not checked on a {dev.type}.")
    return True
