"""Lab 8's checks: a manual all-reduce, a communication prediction, a bucket size, a sharded
optimizer; and the launch that runs the student's functions inside torchrun's workers."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from perflab.distributed.training import launch, source_of
from perflab.labs.exercises import ExerciseFailed, ExerciseNotDone, _number

__all__ = ["best_bucket_bytes", "check_allreduce_model", "check_bucket_choice",
           "check_comm_prediction", "check_manual_allreduce", "check_sharded_optimizer",
           "lab_launch"]


def lab_launch(exercise: int, tasks: Sequence[dict], user_code: Sequence = (),
               skip_unfinished: bool = False, **kwargs) -> list[dict]:
    """:func:`perflab.distributed.training.launch` for a lab exercise: the student's functions
    (``user_code``) run inside the workers. When one of them is still the student edition's
    stub (``not_done(...)`` or ``raise NotImplementedError``), it refuses at once with one
    sentence; with ``skip_unfinished``, it says so in one printed line instead and runs the
    tasks that need no student code (names not starting with ``user_``), so that later
    exercises get their measurements.

    Raises:
        ExerciseNotDone: "Exercise N is not done yet: ..." for an unfinished function (unless
            ``skip_unfinished`` and some task needs no student code).
        LaunchError: see :func:`perflab.distributed.training.launch`.
    """
    for fn in user_code:
        src = source_of(fn)
        if "raise NotImplementedError" in src or "not_done(" in src:
            name = getattr(fn, "__name__", "your function")
            what = f"write the body of {name}() in the cell above and run it again"
            others = [t for t in tasks if not str(t.get("name", "")).startswith("user_")]
            if not (skip_unfinished and others):
                raise ExerciseNotDone(exercise, what)
            print(f"Exercise {exercise} is not done yet: {what}; the other measurements run.")
            return launch(others, user_code=(), **kwargs)
    return launch(tasks, user_code=user_code, **kwargs)


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

def check_allreduce_model(fn: Callable | None, exercise: int = 2) -> bool:
    """Exercise 2: ``fn(nbytes, busbw, world_size, alpha)`` is the alpha-beta model of a ring
    all-reduce, ``alpha + nbytes * 2 (n-1)/n / busbw``, for 2, 3, 4 and 8 ranks.

    Testing the function at several world sizes is what tells the model from its slips: on two
    ranks the bus factor 2 (n-1)/n is 1, so leaving it out, or dividing by the algorithm
    bandwidth instead of the bus bandwidth, gives the same number there and a wrong one on
    three ranks or more.

    Raises:
        ExerciseFailed: ``fn`` is missing or wrong at some world size (the sentence names it).
    """
    if fn is None:
        raise ExerciseNotDone(exercise, "write allreduce_model(nbytes, busbw, world_size, alpha)")
    nbytes, busbw, alpha = 1e8, 100e9, 20e-6
    for n in (2, 3, 4, 8):
        got = _number(f"Exercise {exercise} (allreduce_model at {n} ranks)",
                      fn(nbytes, busbw, n, alpha))      # the answer first, as plain data
        want = alpha + nbytes * 2 * (n - 1) / n / busbw
        if not math.isclose(got, want, rel_tol=1e-6):
            hint = (" On two ranks the bus factor 2 (n-1)/n is 1: leaving it out shows only from "
                    "three ranks on." if n > 2 and math.isclose(got, alpha + nbytes / busbw,
                                                                 rel_tol=1e-6) else "")
            raise ExerciseFailed(f"✗ Exercise {exercise}: on {n} ranks your model gives "
                                 f"{got * 1e3:.4g} ms for {nbytes:.0e} B at {busbw / 1e9:g} GB/s "
                                 f"bus bandwidth, the ring needs {want * 1e3:.4g} ms.{hint}")
    print(f"✓ Exercise {exercise}: your model is the ring's alpha + bytes x 2 (n-1)/n / busbw on "
          "2, 3, 4 and 8 ranks.")
    return True


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


def best_bucket_bytes(alpha: float, grad_bytes: float, busbw: float, world_size: int) -> float:
    """The bucket cap that minimizes the exposed all-reduce time of a DDP step, in bytes.

    With ``S`` bytes of gradients in buckets of ``c`` bytes, the buckets' start-up costs
    ``(S / c) alpha`` and the last bucket, which waits for the end of the backward, costs
    ``c 2 (n-1)/n / busbw``; their sum is smallest at ``c* = sqrt(alpha S busbw / (2 (n-1)/n))``.

    Raises:
        ValueError: a non-positive argument or fewer than 2 ranks.
    """
    if min(alpha, grad_bytes, busbw) <= 0 or world_size < 2:
        raise ValueError(f"need positive alpha, grad_bytes, busbw and world_size >= 2, got "
                         f"{alpha}, {grad_bytes}, {busbw}, {world_size}")
    return math.sqrt(alpha * grad_bytes * busbw / (2 * (world_size - 1) / world_size))


def check_bucket_choice(choice_mb, step_s_by_mb: dict, slack: float = 0.10,
                        predicted_mb=None, expected_mb: float | None = None) -> bool:
    """Exercise 3: a measured bucket cap among the fastest, and the predicted best cap.

    The chosen ``bucket_cap_mb`` must have been measured and step within a slack of the fastest:
    ``slack`` or half the sweep's own spread (slowest over fastest, minus 1), whichever is
    smaller, so that a sweep whose sizes all step alike does not pass every choice. With
    ``expected_mb`` (the model's best cap, :func:`best_bucket_bytes`, in MB), ``predicted_mb``
    must be within a factor 2 of it.

    Raises:
        ExerciseFailed: no choice, a size that was not measured, one too slow, or a prediction
            off by more than 2x.
        ValueError: ``step_s_by_mb`` empty.
    """
    if not step_s_by_mb:
        raise ValueError("step_s_by_mb must hold at least one measured bucket size")
    times = {float(k): float(v) for k, v in step_s_by_mb.items()}
    c = _number("Exercise 3 (bucket_cap_mb)", choice_mb)
    if c not in times:
        raise ExerciseFailed(f"✗ Exercise 3: {c:g} MB was not measured; choose one of {sorted(times)}.")
    best = min(times.values())
    allowed = min(slack, 0.5 * (max(times.values()) / best - 1))
    if times[c] > (1 + allowed) * best:
        raise ExerciseFailed(f"✗ Exercise 3: {c:g} MB steps in {times[c] * 1e3:.3g} ms, "
                             f"{times[c] / best:.2f}x the fastest measured ({best * 1e3:.3g} ms).")
    if expected_mb is not None:
        p = _number("Exercise 3 (predicted best cap, MB)", predicted_mb)
        if not 0.5 <= p / expected_mb <= 2:
            raise ExerciseFailed(f"✗ Exercise 3: you predicted a best cap of {p:.3g} MB; the "
                                 f"start-up and last-bucket costs balance at {expected_mb:.3g} MB "
                                 "(sqrt(alpha S busbw / (2 (n-1)/n))).")
    print(f"✓ Exercise 3: {c:g} MB steps in {times[c] * 1e3:.3g} ms, within {allowed:.1%} of the "
          f"fastest measured ({best * 1e3:.3g} ms)"
          + (f"; your predicted best cap is within 2x of {expected_mb:.3g} MB."
             if expected_mb is not None else "."))
    return True


def check_sharded_optimizer(state_bytes_per_rank: Sequence, params: int, predicted_bytes,
                            rtol: float = 0.05, rank_spread: float | None = None) -> bool:
    """Exercise 4: Adam's state is sharded across the ranks, and the bytes per rank were predicted.

    Passes when (a) the ranks together hold ``8 P`` bytes of Adam moments (within ``rtol``),
    (b) no rank holds more than ``8 P x (1/N + 0.5 (1 - 1/N))`` (half-way between a perfect
    shard and none: a sharded optimizer passes, a replicated one does not), and (c)
    ``predicted_bytes`` is within ``rtol`` of the mean bytes per rank, and (d) after the steps
    every rank holds the same parameters (``rank_spread``, the largest difference from rank 0,
    at most 1e-6): sharding the state must not shard the model. An optimizer that steps only
    its rank's shard and never sends the result to the others holds the right bytes and
    trains ``n`` different models.

    Raises:
        ExerciseFailed: any of the four fails, or an answer is missing.
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
    if rank_spread is not None and _number("Exercise 4 (rank spread)", rank_spread) > 1e-6:
        raise ExerciseFailed(f"✗ Exercise 4: after the steps the ranks' parameters differ by up to "
                             f"{rank_spread:.3g}: each rank updated its shard but the others never "
                             "received it, so the ranks now train different models.")
    mean = sum(got) / n
    if abs(pred - mean) > rtol * mean:
        raise ExerciseFailed(f"✗ Exercise 4: you predicted {pred:,.0f} bytes per rank; the ranks hold "
                             f"{mean:,.0f} on average ({pred / mean:.2f}x).")
    print(f"✓ Exercise 4: {n} ranks hold {', '.join(f'{b:,.0f}' for b in got)} bytes of Adam state "
          f"(all of it: {full:,}); your prediction {pred:,.0f} is within {rtol:.0%}.")
    return True
