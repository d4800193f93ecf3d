"""Lab 8's checks: a manual all-reduce, a communication prediction, the exposed time of DDP's
buckets and a bucket size, a sharded optimizer that trains the right model, a sampler that deals
every rank its own data; and the launch that runs the student's functions inside torchrun's
workers. The reference models are chapter 8's own (:mod:`perflab.distributed.costs`):
``allreduce_seconds(nbytes, busbw, world, alpha=0.0)`` and ``exposed_seconds(bucket_bytes,
backward_s, busbw, world, alpha=0.0)``, whose argument order the lab's functions share."""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable, Mapping, Sequence

from perflab.core.rounds import spread
from perflab.distributed.costs import allreduce_seconds, exposed_seconds
from perflab.distributed.launch import launch, source_of
from perflab.labs.exercises import ExerciseFailed, ExerciseNotDone, _number
from perflab.record.numbers import fmt, fmt_small

__all__ = ["check_allreduce_seconds", "check_bucket_choice", "check_comm_prediction", "check_exposed_model",
           "check_manual_allreduce", "check_sampler", "check_sharded_optimizer", "exposed_reference",
           "lab_launch", "task_result"]


def _names(task: dict) -> list[str]:
    """The student functions a task calls (its ``fns``)."""
    return [str(f) for f in task.get("args", {}).get("fns", [])]


def lab_launch(exercise: int | Mapping[str, int], tasks: Sequence[dict], user_code: Sequence = (),
               skip_unfinished: bool = False, **kwargs) -> list[dict]:
    """:func:`perflab.distributed.launch.launch` for lab exercises: the student's functions
    (``user_code``) run inside the workers.

    ``exercise`` is the exercise of every function, or ``{function name: exercise}`` when one
    launch runs several exercises' functions. A function that is still the student edition's
    stub (``not_done(...)`` or ``raise NotImplementedError``) makes it refuse at once with one
    sentence; with ``skip_unfinished``, it says so in one printed line per such function
    instead, drops the tasks that call one (the tasks' ``fns``), and runs the others (the
    measurements that need no student code, the finished functions' tasks), so that the other
    exercises get their results. When no task is left it launches nothing and returns ``[]``.

    Raises:
        ExerciseNotDone: "Exercise N is not done yet: ..." for an unfinished function (unless
            ``skip_unfinished``).
        LaunchError: see :func:`perflab.distributed.launch.launch`.
    """
    def number(name: str) -> int:
        return exercise.get(name, min(exercise.values())) if isinstance(exercise, Mapping) else exercise

    kept, unfinished = [], set()
    for fn in user_code:
        src = source_of(fn)
        name = getattr(fn, "__name__", None) or src.split("def ", 1)[-1].split("(", 1)[0].strip()
        if "raise NotImplementedError" in src or "not_done(" in src:
            what = f"write the body of {name}() in its cell above and run it again"
            if not skip_unfinished:
                raise ExerciseNotDone(number(name), what)
            print(f"Exercise {number(name)} is not done yet: {what}; the other measurements run.")
            unfinished.add(name)
        else:
            kept.append(fn)
    runnable = [t for t in tasks if not set(_names(t)) & unfinished]
    if not runnable:
        return []
    return launch(runnable, user_code=kept, **kwargs)


def task_result(ranks: Sequence[dict], task: str, exercise: int, what: str, fn: str | None = None):
    """Rank 0's result of ``task`` (for the function ``fn`` of a ``user_*`` task) in a
    :func:`lab_launch`, or "Exercise N is not done yet: ``what``" when that launch did not run
    it (the function was unfinished, or nothing ran).

    Raises:
        ExerciseNotDone: the result is missing.
    """
    found = ranks[0]["results"].get(task) if ranks else None
    if found is not None and fn is not None:
        found = found.get(fn)
    if found is None:
        raise ExerciseNotDone(exercise, what)
    return found


def check_manual_allreduce(max_param_diff, tol: float = 1e-9) -> bool:
    """Exercise 1: a hand-written gradient all-reduce gives DDP's parameters (float64, ``tol``).

    Raises:
        ExerciseFailed: the difference is missing or above ``tol``.
    """
    if max_param_diff is None:
        raise ExerciseNotDone(1, "write allreduce_gradients, then run the launch cell after it")
    d = _number("Exercise 1 (largest parameter difference from DDP)", max_param_diff)
    if d <= tol:
        print(f"✓ Exercise 1: after the steps your parameters differ from DDP's by at most {fmt_small(d)} "
              f"(float64, tolerance {fmt_small(tol)}).")
        return True
    raise ExerciseFailed(f"✗ Exercise 1: your parameters differ from DDP's by up to {fmt_small(d)}; DDP "
                         "averages the gradients (sum over ranks divided by the world size).")


def check_allreduce_seconds(fn: Callable | None, exercise: int = 2) -> bool:
    """Exercise 2: ``fn(nbytes, busbw, world, alpha=0.0)`` is chapter 8's alpha-beta model of a
    ring all-reduce (:func:`perflab.distributed.costs.allreduce_seconds`), ``alpha + nbytes x
    2 (n-1)/n / busbw``, for 2, 3, 4 and 8 ranks, with and without ``alpha``.

    Testing the function at several world sizes is what tells the model from its slips: on two
    ranks the bus factor 2 (n-1)/n is 1, so leaving it out, or dividing by the algorithm
    bandwidth instead of the bus bandwidth, gives the same number there and a wrong one on
    three ranks or more.

    Raises:
        ExerciseFailed: ``fn`` is missing or wrong at some world size (the sentence names it).
    """
    if fn is None:
        raise ExerciseNotDone(exercise, "write allreduce_seconds(nbytes, busbw, world, alpha=0.0)")
    nbytes, busbw, alpha = 1e8, 100e9, 20e-6
    for n in (2, 3, 4, 8):
        for a in (alpha, None):
            try:
                answer = fn(nbytes, busbw, n) if a is None else fn(nbytes, busbw, n, a)
            except TypeError as e:
                raise ExerciseFailed(f"✗ Exercise {exercise}: allreduce_seconds({fmt(nbytes, 'B')}, "
                                     f"busbw, {n}) failed ({e}): keep the signature "
                                     "allreduce_seconds(nbytes, busbw, world, alpha=0.0).") from None
            got = _number(f"Exercise {exercise} (allreduce_seconds at {n} ranks)", answer)
            want = allreduce_seconds(nbytes, busbw, n, a or 0.0)
            if not math.isclose(got, want, rel_tol=1e-6):
                hint = (" On two ranks the bus factor 2 (n-1)/n is 1: leaving it out shows only from "
                        "three ranks on." if n > 2 and math.isclose(got, (a or 0.0) + nbytes / busbw,
                                                                     rel_tol=1e-6) else "")
                given = "without alpha" if a is None else f"with alpha {fmt(a, 's')}"
                raise ExerciseFailed(f"✗ Exercise {exercise}: on {n} ranks, {given}, your model gives "
                                     f"{fmt(got, 's', 4)} for {fmt(nbytes, 'B')} at {fmt(busbw, 'B/s')} "
                                     f"bus bandwidth, the ring needs {fmt(want, 's', 4)}.{hint}")
    print(f"✓ Exercise {exercise}: your model is the ring's alpha + bytes x 2 (n-1)/n / busbw on "
          "2, 3, 4 and 8 ranks.")
    return True


def net_busbw(point: Mapping, alpha_s: float, world: int) -> float:
    """Exercise 2's bus bandwidth of one swept message net of the start-up: ``point["nbytes"]
    x 2 (n-1)/n / (point["seconds"] - alpha_s)`` (bytes/s). The sweep's own ``busbw`` divides
    by the whole time, alpha included, so a model that adds ``alpha_s`` to it counts alpha twice
    (review of run 07ca410, finding 21).

    Raises:
        ValueError: ``world`` below 2, or a message no slower than ``alpha_s`` (no bytes' time
            is left to divide by: take a larger message than the smallest).
    """
    if world < 2:
        raise ValueError(f"world must be >= 2, got {world}")
    left = float(point["seconds"]) - float(alpha_s)
    if left <= 0:
        raise ValueError(f"a message of {point['nbytes']} bytes took {point['seconds']} s, no more "
                         f"than alpha ({alpha_s} s): take a larger message")
    return float(point["nbytes"]) * 2 * (world - 1) / world / left


def check_comm_prediction(predicted_s, measured_s, expected_s=None, factor: float = 2.0,
                          world: int | None = None, alpha_twice_s: float | None = None) -> bool:
    """Exercise 2: a predicted all-reduce time that is chapter 8's model of the measured inputs,
    and within ``factor`` of the measured time (all seconds).

    With ``expected_s`` (the model, :func:`perflab.distributed.costs.allreduce_seconds`, of the
    gradients' bytes at the bus bandwidth measured nearest them on the ``world`` ranks, with the
    smallest message's time as alpha) the prediction must equal it (``rel_tol`` 1e-6, as
    exercise 6 checks its own): leaving out the bus factor (0.67x on 4 ranks), dividing by the
    algorithm bandwidth, forgetting alpha or counting bits fails even where the measured time
    is too noisy to tell them apart (without the bus factor a 4-rank prediction came closer to
    the measured time than the model did in the reference run). The comparison with the
    measured time then says whether the model carries over to the step's own all-reduce; with
    ``expected_s`` it is reported, not judged (a loaded CI host ran the reference's 7.21 ms
    prediction at 3.37 ms: no answer of the student's is wrong there). ``alpha_twice_s``, the
    model with the sweep's own bus bandwidth (alpha inside it) plus alpha, names that slip.

    Raises:
        ExerciseFailed: missing, non-positive, not the model of the measured inputs, or
            (without ``expected_s``) off the measured time by more than ``factor`` either way.
    """
    p = _number("Exercise 2 (predicted seconds)", predicted_s)
    m = _number("Exercise 2 (measured seconds)", measured_s)
    if p <= 0 or m <= 0:
        raise ExerciseFailed(f"✗ Exercise 2: times must be positive, got {fmt(p, 's')} and {fmt(m, 's')}.")
    if expected_s is not None:
        e = _number("Exercise 2 (the model's seconds)", expected_s)
        if not math.isclose(p, e, rel_tol=1e-6):
            hint = ""
            bus = 2 * (world - 1) / world if world else 1.0
            if alpha_twice_s is not None and math.isclose(p, alpha_twice_s, rel_tol=1e-6):
                hint = (" Your number counts alpha twice: the sweep's busbw divides by the whole "
                        "time, alpha included; take alpha out of it first.")
            elif bus > 1 and 0.98 / bus <= p / e < 1:   # alpha + S / busbw: between 1/bus and 1
                hint = (f" Your number lies between the model's and 1 / {bus:g} of it: the bus factor "
                        f"2 (n-1)/n = {bus:g} on {world} ranks is missing.")
            elif bus > 1 and 1 < p / e <= 1.02 * bus:  # alpha + S x bus / algbw, algbw = busbw / bus
                hint = (" Your number lies between the model's and the bus factor times it: the "
                        "algorithm bandwidth (bytes / seconds) replaced the bus bandwidth.")
            elif math.isclose(p / e, 8, rel_tol=0.05):
                hint = " Your number is 8x the model's: bits instead of bytes."
            raise ExerciseFailed(f"✗ Exercise 2: you predicted {fmt(p, 's', 4)}; the model of the measured "
                                 f"inputs gives {fmt(e, 's', 4)} ({p / e:.2f}x): count bytes (4 per float32 "
                                 "gradient) and use t = alpha + bytes x 2 (n-1)/n / busbw, with alpha the "
                                 "smallest message's time and busbw measured at the size nearest the "
                                 f"gradients', net of alpha.{hint}")
    if 1 / factor <= p / m <= factor or expected_s is not None:
        # the model of the measured inputs is the answer; how far the all-reduce of S bytes
        # ran from it is the machine's (a loaded host's sweep and this message's rounds
        # differ), reported, never the student's failure
        print(f"✓ Exercise 2: predicted {fmt(p, 's')}" + (" (the model of your measured inputs)"
                                                          if expected_s is not None else "")
              + f", measured {fmt(m, 's')} (ratio {p / m:.2f}, "
              + (f"within {factor:g}x)." if 1 / factor <= p / m <= factor else
                 f"beyond {factor:g}x: this all-reduce ran at another rate than the sweep's "
                 "messages around it, which a loaded host does; the model is right)."))
        return True
    raise ExerciseFailed(f"✗ Exercise 2: predicted {fmt(p, 's')} but measured {fmt(m, 's')} "
                         f"({p / m:.2f}x); count bytes (4 per float32 gradient) and use "
                         "t = alpha + bytes * 2 (n-1)/n / busbw.")


def exposed_reference(bucket_bytes: Sequence[float], backward_s: float, busbw: float, world: int,
                      alpha: float = 0.0) -> float:
    """The communication a DDP step still waits for after its backward: chapter 8's model
    (:func:`perflab.distributed.costs.exposed_seconds`), with its inputs checked. Bucket k is
    ready when the backward, producing gradient bytes at an even rate, has produced it; it starts
    when the link is free of the buckets before it and takes ``alpha + bytes x 2 (n-1)/n /
    busbw``; whatever ends after ``backward_s`` is exposed.

    Raises:
        ValueError: no buckets, a negative ``backward_s``, a non-positive ``busbw`` or
            ``world`` below 2.
    """
    if not bucket_bytes or backward_s < 0 or busbw <= 0 or world < 2:
        raise ValueError(f"need buckets, backward_s >= 0, busbw > 0 and world >= 2, got "
                         f"{len(bucket_bytes)} bucket(s), {backward_s}, {busbw}, {world}")
    return exposed_seconds(list(bucket_bytes), backward_s, busbw, world, alpha)


def check_exposed_model(fn: Callable | None, exercise: int = 3,
                        allreduce_fn: Callable | None = None) -> bool:
    """Exercise 3: ``fn(bucket_bytes, backward_s, busbw, world, alpha)`` is the exposed
    time of DDP's buckets (:func:`exposed_reference`), tried where the model's regimes differ:
    a backward long enough to hide all but the last bucket, no backward at all (everything
    exposed), and backwards in between, on 2, 3, 4 and 8 ranks. A model that counts every
    bucket's start-up as exposed, or that ignores when the buckets become ready, fails.
    ``allreduce_fn`` (the student's exercise 2 ``allreduce_seconds``, which ``fn`` may call):
    where ``fn`` is wrong and ``allreduce_fn`` is not the ring's model, the sentence says that
    exercise 2's function is the first thing to fix.

    Raises:
        ExerciseFailed: ``fn`` missing or wrong in some case (the sentence names it).
    """
    if fn is None:
        raise ExerciseNotDone(exercise, "write exposed(bucket_bytes, backward_s, busbw, world, alpha)")
    rng = random.Random(8)
    cases = [("a long backward", [4e6] * 8, 1.0), ("no backward", [4e6] * 8, 0.0),
             ("one bucket", [3e7], 0.05)]
    cases += [("a backward about as long as the communication", [rng.uniform(1e5, 2e7) for _ in range(12)],
               rng.uniform(0.01, 0.1)) for _ in range(4)]
    for what, buckets, backward in cases:
        for n in (2, 3, 4, 8):
            want = exposed_reference(buckets, backward, 1e9, n, 50e-6)
            got = _number(f"Exercise {exercise} (exposed, {what})", fn(list(buckets), backward, 1e9, n, 50e-6))
            if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
                first = _wrong_allreduce(allreduce_fn, buckets[0], n)
                todo = (f" Your exposed() calls allreduce_seconds of exercise 2, which is wrong: {first}; "
                        "fix exercise 2 first (its check says how)." if first else
                        " Try: bucket k is ready when the backward has produced the bytes of buckets 0 "
                        "to k (backward_s x those bytes / all bytes); it starts at the later of that and "
                        "the end of bucket k-1, and takes allreduce_seconds(b, busbw, world, alpha); "
                        "return how far the last end lies past backward_s (0 if it does not).")
                raise ExerciseFailed(f"✗ Exercise {exercise}: with {what} ({len(buckets)} buckets, backward "
                                     f"{fmt(backward, 's')}, {n} ranks) your model exposes "
                                     f"{fmt(got, 's', 4)}, the queue of buckets {fmt(want, 's', 4)}.{todo}")
    print(f"✓ Exercise {exercise}: your model exposes what the queue of buckets does: the last bucket "
          "behind a long backward, everything behind none.")
    return True


def _wrong_allreduce(fn: Callable | None, nbytes: float, world: int) -> str:
    """How a student's ``allreduce_seconds`` differs from the ring's model on ``world`` ranks
    (1 GB/s, alpha 50 us, as :func:`check_exposed_model` calls it), in words; "" where it
    agrees, or where there is no function to try."""
    if fn is None:
        return ""
    want = allreduce_seconds(nbytes, 1e9, world, 50e-6)
    try:
        got = float(fn(nbytes, 1e9, world, 50e-6))
    except Exception as e:  # noqa: BLE001 -- any error of the student's function is the answer
        return f"allreduce_seconds({fmt(nbytes, 'B')}, 1 GB/s, {world}, 50 µs) raises {type(e).__name__}"
    if math.isclose(got, want, rel_tol=1e-6):
        return ""
    return (f"on {world} ranks it gives {fmt(got, 's', 4)} for {fmt(nbytes, 'B')} at 1 GB/s with alpha 50 µs, "
            f"the ring {fmt(want, 's', 4)}")


def check_bucket_choice(choice_mb, rounds_by_mb: dict, predicted_mb=None, expected_mb=None,
                        within: float = 0.05, overlap: bool | None = None) -> bool:
    """Exercise 3: a measured bucket cap among the fastest, and the predicted best cap.

    ``rounds_by_mb`` maps each measured cap (MiB) to its step times, one per interleaved round
    (the same number of rounds for every cap). Each round's steps are divided by that round's
    fastest step, whichever cap it was (a drift of the machine slows every cap of a round and
    cancels), and the chosen cap's ratios are judged on their spread
    (:class:`perflab.core.rounds.Spread`: the inter-quartile range from 8 rounds, as chapter 8's
    bucket verdict): the choice fails when the low end of its ratios lies more than ``within``
    above 1 (it ran that much slower than the round's fastest cap in most rounds) and above
    the high end of the ratios of the cap with the fastest median (the rounds tell it from
    that cap). The cap with the fastest median always passes; a cap the rounds cannot tell
    from it passes. With ``expected_mb`` (the cap the exposed-time model picks, with the
    reference model), ``predicted_mb`` must be that cap. A second line then says whether the
    rounds contradict the predicted cap and, with ``overlap`` (whether the launch's
    communication can overlap the backward: NCCL, or gloo's threads pinned to cores of their
    own; False where they share the backward's cores), why a contradicted model misses.

    Raises:
        ExerciseFailed: no choice, a size that was not measured, one the rounds put more than
            ``within`` behind each round's fastest cap, or a different predicted cap.
        ValueError: ``rounds_by_mb`` empty, or caps with different numbers of rounds.
    """
    if not rounds_by_mb:
        raise ValueError("rounds_by_mb must hold at least one measured bucket size")
    rounds = {float(k): [float(t) for t in v] for k, v in rounds_by_mb.items()}
    if len({len(v) for v in rounds.values()}) != 1 or not next(iter(rounds.values())):
        raise ValueError("rounds_by_mb must hold the same number (>= 1) of rounds for every cap, got "
                         f"{ {k: len(v) for k, v in rounds.items()} }")
    c = _number("Exercise 3 (bucket_cap_mb)", choice_mb)
    if c not in rounds:
        raise ExerciseFailed(f"✗ Exercise 3: {c:g} MiB was not measured; choose one of {sorted(rounds)}.")
    fastest = [min(r) for r in zip(*rounds.values())]
    ratio = {k: spread(t / f for t, f in zip(v, fastest)) for k, v in rounds.items()}
    best = min(rounds, key=lambda k: statistics.median(rounds[k]))
    r, rb = ratio[c], ratio[best]
    if c != best and r.lo > 1 + within and r.lo > rb.hi:
        raise ExerciseFailed(f"✗ Exercise 3: {c:g} MiB ran {r.lo:.2f}x to {r.hi:.2f}x each round's "
                             f"fastest cap ({r.kind}), more than {within:.0%} behind it, and behind "
                             f"the cap of the fastest median, {best:g} MiB ({rb.lo:.2f}x to {rb.hi:.2f}x): "
                             "the rounds tell them apart.")
    if expected_mb is not None:
        p = _number("Exercise 3 (predicted best cap, MiB)", predicted_mb)
        if p != float(expected_mb):
            raise ExerciseFailed(f"✗ Exercise 3: you predicted {p:g} MiB; the exposed-time model, with "
                                 f"DDP's own buckets of each cap, exposes least at {float(expected_mb):g} MiB.")
    among = ("is the cap of the fastest median" if c == best else
             f"is among the fastest caps measured (the rounds do not tell it from {best:g} MiB)")
    print(f"✓ Exercise 3: {c:g} MiB {among}: {r.lo:.2f}x to {r.hi:.2f}x each round's fastest cap "
          f"({r.kind})" + (f"; your predicted cap is the model's, {float(expected_mb):g} MiB."
                           if expected_mb is not None else "."))
    if predicted_mb is not None and float(predicted_mb) in rounds:
        print("  " + _prediction_against_rounds(float(predicted_mb), ratio, best, within, overlap))
    return True


#: why the overlap model misses where gloo's threads share the backward's cores (chapter 8,
#: "Bucket size"), said where the rounds contradict it there
SHARED_CORES_MISS = (
    "Why: on this launch gloo's threads share the backward's cores, so the all-reduce does not "
    "overlap the backward as the model assumes; every bucket pays its alpha (and gloo's "
    "per-call cost) inside the step, which favours fewer, larger buckets, and the overlap "
    "model, which counts only what ends after the backward, picks too small a cap here "
    "(chapter 8, Bucket size: the start-up model). On GPUs, or gloo threads on cores of their "
    "own, the overlap exists.")


def _prediction_against_rounds(p: float, ratio: dict, best: float, within: float,
                               overlap: bool | None = None) -> str:
    """Whether the rounds contradict a predicted cap ``p``, by the rule the choice is judged
    by (review F6 of chapter 8, series f: the grade checks the model, the rounds judge it);
    where they do and ``overlap`` is False, why (:data:`SHARED_CORES_MISS`)."""
    rp, rb = ratio[p], ratio[best]
    if p == best:
        return f"The model's cap, {p:g} MiB, is the cap of the fastest median: the rounds agree."
    if rp.lo > 1 + within and rp.lo > rb.hi:
        why = (" " + SHARED_CORES_MISS if overlap is False else
               " The model misses what sets this step (chapter 8 names a second regime).")
        return (f"The rounds contradict the model: its cap, {p:g} MiB, ran {rp.lo:.2f}x to "
                f"{rp.hi:.2f}x each round's fastest cap ({rp.kind}), behind {best:g} MiB." + why)
    return (f"The model's cap, {p:g} MiB, ran {rp.lo:.2f}x to {rp.hi:.2f}x each round's fastest "
            f"cap ({rp.kind}): the rounds do not tell it from {best:g} MiB, the fastest median.")


def check_sharded_optimizer(state_bytes_per_rank: Sequence, params: int, predicted_bytes,
                            rtol: float = 0.05, rank_spread: float | None = None,
                            vs_reference: float | None = None, settings: Mapping | None = None,
                            lr: float = 1e-3) -> bool:
    """Exercise 4: Adam's state is sharded across the ranks, the model is the right one, and the
    bytes per rank were predicted.

    Passes when (a) no rank holds more than ``8 P x (1/N + 0.5 (1 - 1/N))`` (half-way between
    a perfect shard and none: a sharded optimizer passes, a replicated one does not), (b) the
    ranks together hold ``8 P`` bytes of Adam moments (within ``rtol``), (c) after the steps every
    rank holds the same parameters (``rank_spread``, the largest difference from rank 0, at most
    1e-6), (d) they are the parameters one process gets with plain Adam on the whole batch
    (``vs_reference``, float64, at most 1e-9): sharding the state must neither shard the model
    nor change it, and (e) ``predicted_bytes`` is within ``rtol`` of the mean bytes per rank.
    An optimizer that steps only its rank's parameters holds the right bytes and trains ``n``
    different models (c); one that then copies rank 0's parameters to every rank keeps them
    equal and trains a model whose other parameters never move (d).

    Each failure says what was wrong, what was expected and what to try: (a) tells a replicated
    state (every rank ``8 P``) from one split unevenly by tensors (all ``8 P`` between them, one
    rank most of it, as ``params[rank::world]`` gives when the weights and the biases alternate);
    (d) names the optimizer's own settings where they differ from ``torch.optim.Adam(lr=lr)``
    (``settings``, the ``user_optimizer`` task's: ``class``, ``lr``, ``weight_decay``, ...; an
    AdamW decays the weights). The passing sentence prints no byte count: the student edition
    shows the reference's output before the student predicts.

    Raises:
        ExerciseFailed: any of them fails, or an answer is missing.
    """
    got = [_number("Exercise 4 (state bytes per rank)", b) for b in state_bytes_per_rank]
    if len(got) < 2:
        raise ExerciseFailed("✗ Exercise 4: need the state bytes of at least 2 ranks.")
    n, full = len(got), 8 * int(params)
    pred = _number("Exercise 4 (predicted bytes per rank)", predicted_bytes)
    share = full / n
    if max(got) > full * (1 / n + 0.5 * (1 - 1 / n)):
        held = ", ".join(f"{b:,.0f} ({fmt(b / full, '%', sig=2)})" for b in got)
        if abs(sum(got) - full) <= rtol * full:
            raise ExerciseFailed(
                f"✗ Exercise 4: the ranks hold all of Adam's 8 B x {params:,} = {full:,} bytes between them, "
                f"but unevenly: {held}; a sharded state gives each of the {n} ranks about 1/{n} of it "
                f"({share:,.0f} bytes). Dealing out whole tensors by position (params[rank::world]) puts "
                "the large ones on some ranks and the small ones on others: let ZeroRedundancyOptimizer "
                "assign them (it balances the ranks by bytes).")
        if all(abs(b - full) <= rtol * full for b in got):
            raise ExerciseFailed(
                f"✗ Exercise 4: every rank holds all {full:,} bytes of Adam's state (8 B x {params:,}): it is "
                f"replicated, not sharded; sharded, each of the {n} ranks holds about {share:,.0f}. Wrap "
                f"Adam: ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr={lr:g}).")
        raise ExerciseFailed(
            f"✗ Exercise 4: the ranks hold {held} of the {full:,} bytes of Adam's state (8 B x {params:,}): "
            f"a rank holds too much for the state to be sharded; each of the {n} ranks should hold about "
            f"{share:,.0f}. Use ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr={lr:g}).")
    if abs(sum(got) - full) > rtol * full:
        raise ExerciseFailed(f"✗ Exercise 4: the ranks hold {sum(got):,.0f} bytes of optimizer state in "
                             f"all, not Adam's 8 bytes x {params:,} parameters = {full:,} bytes: every "
                             "parameter needs its two moments on exactly one rank; give the optimizer "
                             "all the parameters (ZeroRedundancyOptimizer shards them itself).")
    if rank_spread is not None and _number("Exercise 4 (rank spread)", rank_spread) > 1e-6:
        raise ExerciseFailed(f"✗ Exercise 4: after the steps the ranks' parameters differ by up to "
                             f"{fmt_small(rank_spread)} (expected at most 1e-6): each rank updated its "
                             "shard but the others never received it, so the ranks now train different "
                             "models. ZeroRedundancyOptimizer broadcasts each rank's updated shard.")
    if vs_reference is not None and _number("Exercise 4 (difference from Adam)", vs_reference) > 1e-9:
        unlike = _unlike_adam(settings or {}, lr)
        cause = (f"your optimizer is not plain Adam: {unlike}; use optimizer_class=torch.optim.Adam, "
                 f"lr={lr:g} and Adam's defaults" if unlike else
                 "some parameters stepped by no rank, or overwritten by one rank's copy; give "
                 "ZeroRedundancyOptimizer all the parameters and let it step and broadcast them")
        raise ExerciseFailed(f"✗ Exercise 4: the ranks agree, but their parameters differ by up to "
                             f"{fmt_small(vs_reference)} (expected at most 1e-9) from one process's "
                             f"torch.optim.Adam(lr={lr:g}) on the whole batch: they trained another model. "
                             f"Cause: {cause}.")
    mean = sum(got) / n
    if abs(pred - mean) > rtol * mean:
        raise ExerciseFailed(f"✗ Exercise 4: you predicted {pred:,.0f} bytes per rank; the ranks hold "
                             f"{mean:,.0f} on average ({pred / mean:.2f}x): Adam's 8 bytes per parameter, "
                             "divided among the ranks.")
    even = max(abs(b - share) for b in got) / share
    print(f"✓ Exercise 4: the {n} ranks hold all of Adam's 8 B per parameter between them, each within "
          f"{fmt(even, '%', sig=2)} of an even share, train plain Adam's model, and your prediction of the "
          f"bytes per rank is within {fmt(rtol, '%', sig=2)} of their mean.")
    return True


def _unlike_adam(settings: Mapping, lr: float) -> str:
    """How an optimizer's ``settings`` (class and first param group's hyper-parameters) differ
    from ``torch.optim.Adam(lr=lr)``'s defaults, in words; "" where they do not, or are unknown."""
    want = {"lr": lr, "weight_decay": 0.0, "eps": 1e-8, "betas": [0.9, 0.999], "amsgrad": False}
    said = []
    if settings.get("class") not in (None, "Adam"):
        said.append(f"{settings['class']}, not Adam")
    for key, value in want.items():
        have = settings.get(key)
        if have is None:
            continue
        same = (all(math.isclose(float(a), b) for a, b in zip(have, value)) if key == "betas"
                else bool(have) == value if key == "amsgrad" else math.isclose(float(have), value))
        if not same:
            said.append(f"{key} {have} (Adam's {value})" if key != "lr" else f"lr {have:g}, not {lr:g}")
    return ", ".join(said)


def check_sampler(result: dict | None, exercise: int = 5) -> bool:
    """Exercise 5: a sampler that deals every rank its own samples, and a new order each epoch.

    ``result`` is the ``user_sampler`` task's ``{"per_rank": [[indices of rank r] for each
    epoch], "n"}``. Passes when in every epoch every rank reads the same number of indices
    (``ceil(n / world)``: ranks with unequal shares run unequal numbers of steps and the
    collectives of the longer ones wait for ever), the ranks together cover the ``n`` samples,
    and no sample is read twice beyond the padding that makes the shares equal
    (``world x ceil(n / world) - n`` repeats, as ``DistributedSampler`` pads when ``n`` is not
    a multiple of the world size); and the order of the first epoch is not repeated in the
    second. Two ranks with the same batch (a sampler that ignores the rank) and an order that
    never changes (no epoch in the seed: ``set_epoch`` forgotten) fail.

    Raises:
        ExerciseFailed: the sampler breaks a rule (the sentence names it) or gave no result.
    """
    if not result:
        raise ExerciseNotDone(exercise, "write indices_for(n, rank, world, epoch), then run the launch cell")
    n, epochs = int(result["n"]), result["per_rank"]
    for e, ranks in enumerate(epochs):
        world = len(ranks)
        share = -(-n // world)
        pad = world * share - n
        seen = [i for r in ranks for i in r]
        repeats = len(seen) - len(set(seen))
        for a in range(len(ranks)):
            for b in range(a + 1, len(ranks)):
                common = set(ranks[a]) & set(ranks[b])
                if len(common) > pad:
                    raise ExerciseFailed(f"✗ Exercise {exercise}: in epoch {e} ranks {a} and {b} both read "
                                         f"{len(common)} of the same samples (e.g. {sorted(common)[:3]}): "
                                         "the ranks must split the data, not repeat it.")
        if set(seen) != set(range(n)) or repeats > pad:
            raise ExerciseFailed(f"✗ Exercise {exercise}: in epoch {e} the ranks together read {len(seen)} "
                                 f"indices covering {len(set(seen) & set(range(n)))} of the {n} samples "
                                 f"({repeats} read twice, {pad} allowed as padding): every sample once "
                                 "per epoch.")
        lengths = [len(r) for r in ranks]
        if any(k != share for k in lengths):
            raise ExerciseFailed(f"✗ Exercise {exercise}: in epoch {e} the ranks read {lengths} indices; "
                                 f"each of the {world} ranks must read ceil({n} / {world}) = {share}, "
                                 "or the ranks run different numbers of steps.")
    if len(epochs) > 1 and epochs[0] == epochs[1]:
        raise ExerciseFailed(f"✗ Exercise {exercise}: epochs 0 and 1 deal every rank the same indices in "
                             "the same order: seed the shuffle with the epoch (DistributedSampler's "
                             "set_epoch).")
    print(f"✓ Exercise {exercise}: {len(epochs[0])} ranks read equal slices of all {n} samples (disjoint "
          "but for padding), in a new order every epoch.")
    return True
