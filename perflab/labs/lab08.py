"""Lab 8's checks: a manual all-reduce, a communication prediction, a bucket size, a sharded
optimizer."""

from __future__ import annotations

from typing import Sequence

from perflab.labs.exercises import ExerciseFailed, ExerciseNotDone, _number

__all__ = ["check_bucket_choice", "check_comm_prediction", "check_manual_allreduce",
           "check_sharded_optimizer"]


def check_manual_allreduce(max_param_diff, tol: float = 1e-9) -> bool:
    """Exercise 1: a hand-written gradient all-reduce gives DDP's parameters (float64, ``tol``).

    Raises:
        ExerciseFailed: the difference is missing or above ``tol``.
    """
    if max_param_diff is None:
        raise ExerciseNotDone(1, "write allreduce_gradients, then run the launch cell after it")
    d = _number("Exercise 1 (largest parameter difference from DDP)", max_param_diff)
    if d <= tol:
        print(f"✓ Exercise 1: after the steps your parameters differ from DDP's by at most {d:.2g} "
              f"(float64, tolerance {tol:.0g}).")
        return True
    raise ExerciseFailed(f"✗ Exercise 1: your parameters differ from DDP's by up to {d:.3g}; DDP "
                         "averages the gradients (sum over ranks divided by the world size).")

def check_comm_prediction(predicted_s, measured_s, factor: float = 2.0) -> bool:
    """Exercise 2: a predicted all-reduce time within ``factor`` of the measured one (both seconds).

    Raises:
        ExerciseFailed: missing, non-positive, or off by more than ``factor`` either way.
    """
    p = _number("Exercise 2 (predicted seconds)", predicted_s)
    m = _number("Exercise 2 (measured seconds)", measured_s)
    if p <= 0 or m <= 0:
        raise ExerciseFailed(f"✗ Exercise 2: times must be positive, got {p:.3g} and {m:.3g} s.")
    if 1 / factor <= p / m <= factor:
        print(f"✓ Exercise 2: predicted {p * 1e3:.3g} ms, measured {m * 1e3:.3g} ms "
              f"(ratio {p / m:.2f}, within {factor:g}x).")
        return True
    raise ExerciseFailed(f"✗ Exercise 2: predicted {p * 1e3:.3g} ms but measured {m * 1e3:.3g} ms "
                         f"({p / m:.2f}x); count bytes (4 per float32 gradient) and use "
                         "t = alpha + bytes * 2 (n-1)/n / busbw.")

def check_bucket_choice(choice_mb, step_s_by_mb: dict, slack: float = 0.10) -> bool:
    """Exercise 3: the chosen ``bucket_cap_mb`` has a measured step time within ``slack`` of the best.

    Raises:
        ExerciseFailed: no choice, a size that was not measured, or one slower than
            ``(1 + slack) x`` the fastest.
        ValueError: ``step_s_by_mb`` empty.
    """
    if not step_s_by_mb:
        raise ValueError("step_s_by_mb must hold at least one measured bucket size")
    times = {float(k): float(v) for k, v in step_s_by_mb.items()}
    c = _number("Exercise 3 (bucket_cap_mb)", choice_mb)
    if c not in times:
        raise ExerciseFailed(f"✗ Exercise 3: {c:g} MB was not measured; choose one of {sorted(times)}.")
    best = min(times.values())
    if times[c] <= (1 + slack) * best:
        print(f"✓ Exercise 3: {c:g} MB steps in {times[c] * 1e3:.3g} ms, within {slack:.0%} of "
              f"the fastest measured ({best * 1e3:.3g} ms).")
        return True
    raise ExerciseFailed(f"✗ Exercise 3: {c:g} MB steps in {times[c] * 1e3:.3g} ms, "
                         f"{times[c] / best:.2f}x the fastest measured ({best * 1e3:.3g} ms).")

def check_sharded_optimizer(state_bytes_per_rank: Sequence, params: int, predicted_bytes,
                            rtol: float = 0.05) -> bool:
    """Exercise 4: Adam's state is sharded across the ranks, and the bytes per rank were predicted.

    Passes when (a) the ranks together hold ``8 P`` bytes of Adam moments (within ``rtol``),
    (b) no rank holds more than ``8 P x (1/N + 0.5 (1 - 1/N))`` (half-way between a perfect
    shard and none: a sharded optimizer passes, a replicated one does not), and (c)
    ``predicted_bytes`` is within ``rtol`` of the mean bytes per rank.

    Raises:
        ExerciseFailed: any of the three fails, or an answer is missing.
    """
    got = [_number("Exercise 4 (state bytes per rank)", b) for b in state_bytes_per_rank]
    if len(got) < 2:
        raise ExerciseFailed("✗ Exercise 4: need the state bytes of at least 2 ranks.")
    n, full = len(got), 8 * int(params)
    pred = _number("Exercise 4 (predicted bytes per rank)", predicted_bytes)
    limit = full * (1 / n + 0.5 * (1 - 1 / n))
    if max(got) > limit:
        raise ExerciseFailed(f"✗ Exercise 4: a rank holds {max(got):,.0f} bytes of optimizer state, "
                             f"{max(got) / full:.0%} of the whole: the state is not sharded.")
    if abs(sum(got) - full) > rtol * full:
        raise ExerciseFailed(f"✗ Exercise 4: the ranks hold {sum(got):,.0f} bytes of optimizer state in "
                             f"all, not Adam's 8 bytes x {params:,} parameters = {full:,} bytes.")
    mean = sum(got) / n
    if abs(pred - mean) > rtol * mean:
        raise ExerciseFailed(f"✗ Exercise 4: you predicted {pred:,.0f} bytes per rank; the ranks hold "
                             f"{mean:,.0f} on average ({pred / mean:.2f}x).")
    print(f"✓ Exercise 4: {n} ranks hold {', '.join(f'{b:,.0f}' for b in got)} bytes of Adam state "
          f"(all of it: {full:,}); your prediction {pred:,.0f} is within {rtol:.0%}.")
    return True
