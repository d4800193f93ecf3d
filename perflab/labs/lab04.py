"""Lab 4's check: a diagnosis of a mystery step from its evidence."""

from __future__ import annotations

import math
from typing import Any, Callable

from perflab.core.timing import benchmark
from perflab.core.validate import number
from perflab.labs.exercises import ExerciseFailed, as_float, plain, NotPlain
from perflab.machine.ceilings import Ceilings, measure_all
from perflab.machine.costs import count_cost
from perflab.profiling.mystery import MysteryStep, _ANSWERS, _EVIDENCE_KEYS, _digest
from perflab.profiling.trace import REGIMES, regime
from perflab.record.numbers import fmt

__all__ = ["check_diagnosis", "check_first_call", "time_fresh_call"]


def _finite(name: str, evidence: dict, key: str) -> float:
    value = evidence.get(key)
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] has no value yet.")
    v = as_float(f"step {name}: evidence[{key!r}]", value)
    if v < 0:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] = {v} is not a finite, non-negative number.")
    return v


def time_fresh_call(timer: Callable, fn: Callable, state: dict, device: Any) -> float:
    """Exercise 1's hidden test, run in the student's kernel: ``fn``'s costly first call made
    fresh again (``state["initialised"] = False``), then ``timer(fn, device, warmup=2, reps=1)``,
    the student's timer, as a plain float (seconds)."""
    state["initialised"] = False
    return as_float("honest_median's time", timer(fn, device, warmup=2, reps=1))


def check_first_call(timer: Callable, fn: Callable, state: dict, device: Any, runs: int = 3,
                     leak_s: float = 0.01) -> float:
    """Exercise 1's check that the costly first call stays out: the best of ``runs`` runs of the
    student's ``timer(fn, device)`` with the first call already spent, then the best of ``runs``
    with it made fresh before each (``state["initialised"] = False``). A timer that warms up, or
    takes a median, reads the same; one that averages the first call in reads its 300 ms over
    the calls it averages (30 ms for a mean of 10), far above ``leak_s``. Prints one sentence
    and returns the warmed best (seconds).

    Raises:
        ExerciseFailed: the fresh runs read ``leak_s`` or more above the warmed ones.
        ValueError: ``runs`` not a positive integer or ``leak_s`` not positive.
    """
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    number("leak_s", leak_s, above=0)
    state["initialised"] = True
    warm = min(as_float("honest_median's time", timer(fn, device)) for _ in range(runs))
    fresh = []
    for _ in range(runs):
        state["initialised"] = False
        fresh.append(as_float("honest_median's time", timer(fn, device)))
    leak = min(fresh) - warm
    if leak >= leak_s:
        raise ExerciseFailed(f"✗ with the first call fresh your timer read {leak * 1e3:.0f} ms more: the "
                             "first call leaked in (warm up first, and take the median).")
    print(f"✓ with the first call fresh your timer read {leak * 1e3:+.1f} ms more: the first call "
          "stays out.")
    return warm


def _cpu_agrees_now(step: MysteryStep, answer: str, cost, seconds: float) -> bool:
    """Whether the check's own evidence, taken now, names ``answer`` for ``step`` on a CPU: the
    ceilings measured again (``measure_all(quick=True)``, as the lab's cell does) beside the
    check's re-timing of the step (``seconds``), with the step's own counts (``cost``).

    On a loaded 2-core machine the lab's reference diagnosis once read step b (1.1 ms, 2.3 MB:
    19 % of an 11 GB/s copy ceiling on a quiet machine) as bandwidth-bound, at 26 % of a copy
    ceiling measured at 8 GB/s. The rule follows the measurement; an answer the check can
    reproduce on the same machine at the same time is a right reading of it."""
    ceil = Ceilings(machine={}, measured="now", path="(the check)",
                    items=measure_all(step.device, quick=True))
    flops_fraction = cost.flops / seconds / ceil.compute_roof("fp32")
    bandwidth_fraction = cost.bytes / seconds / ceil.value("copy_bandwidth")
    return regime(flops_fraction, bandwidth_fraction, None) == answer


def check_diagnosis(step: MysteryStep, answer: Any, evidence: dict, time_tolerance: float | None = None) -> bool:
    """Check a diagnosis of a mystery step: the regime and the evidence for it.

    ``evidence`` holds what the student measured in this run:

    * ``seconds``: median time of one step (s);
    * ``flops`` and ``bytes``: the step's FLOPs and minimum bytes
      (:func:`perflab.profiling.trace.count_cost`);
    * ``flops_ceiling`` (FLOP/s, the matrix-multiply rate of ``step.dtype``) and
      ``bandwidth_ceiling`` (bytes/s, the copy bandwidth), measured on this machine;
    * ``busy_fraction``: the share of the step's wall time in which kernels ran (on a CPU: ATen
      operators), from a profiler trace (:func:`perflab.profiling.trace.summarize_trace`).

    The check recounts FLOPs and bytes (they must match within 1 %), re-times the step (the
    student's time must be within ``time_tolerance`` x of it either way; default 5 on a GPU,
    where a timer that does not wait for the kernels is off by far more, and 20 on a CPU, which
    has no queue to forget and whose timings on a shared machine scatter widely), requires the achieved fractions to stay below 2 x the ceilings on a GPU, 5 x on a CPU (a
    ceiling measured wrongly shows up as an impossible fraction), requires ``answer`` to follow
    from the evidence by :func:`perflab.profiling.trace.regime`, and finally compares it with the right
    answer. On a CPU, an answer other than the right one passes only when the check's own
    evidence, taken now (the ceilings measured again beside its re-timing of the step), names it
    too: a shared CPU's load can move a step across a regime's edge, and the sentence says so.

    Returns True (after printing one sentence) when all hold.

    Raises:
        ExerciseFailed: the first thing that does not hold, in one sentence.
        TypeError: ``step`` is not a MysteryStep or ``evidence`` not a dict.
        ValueError: ``time_tolerance`` < 1.
    """
    if not isinstance(step, MysteryStep):
        raise TypeError(f"step must be a MysteryStep (from step_a/step_b/step_c), got {type(step).__name__}")
    if not isinstance(evidence, dict):
        raise TypeError(f"evidence must be a dict, got {type(evidence).__name__}")
    name = step.name
    try:
        answer = plain(answer)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ step {name}: the answer must be one of {list(REGIMES)}, got {err}.") from None
    if answer not in REGIMES:
        raise ExerciseFailed(f"✗ step {name}: the answer must be one of {list(REGIMES)}, got {answer!r}.")
    missing = [k for k in _EVIDENCE_KEYS if k not in evidence]
    if missing:
        raise ExerciseFailed(f"✗ step {name}: evidence lacks {missing}.")
    ev = {k: _finite(name, evidence, k) for k in _EVIDENCE_KEYS}
    if ev["seconds"] <= 0 or ev["flops_ceiling"] <= 0 or ev["bandwidth_ceiling"] <= 0:
        raise ExerciseFailed(f"✗ step {name}: seconds and both ceilings must be positive.")
    if ev["busy_fraction"] > 1:
        raise ExerciseFailed(f"✗ step {name}: busy_fraction is a share of wall time, at most 1; "
                             f"got {fmt(ev['busy_fraction'])}.")
    step()  # not the first step: the optimizer's state (momentum buffers) exists, as in a real run
    cost = count_cost(step)
    for key, true in (("flops", cost.flops), ("bytes", cost.bytes)):
        if not math.isclose(ev[key], true, rel_tol=0.01):
            unit = "FLOP" if key == "flops" else "B"
            raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] = {fmt(ev[key], unit, sig=4)} but the step "
                                 f"does {fmt(true, unit, sig=4)} "
                                 f"(count it with perflab.profiling.trace.count_cost(step)).")
    if time_tolerance is None:
        time_tolerance = 5.0 if step.device.type == "cuda" else 20.0
    number("time_tolerance", time_tolerance, minimum=1)
    seconds = benchmark(step, step.device, min_run_time_s=0.2)
    ratio = ev["seconds"] / seconds
    if not 1 / time_tolerance <= ratio <= time_tolerance:
        raise ExerciseFailed(f"✗ step {name}: your step time {fmt(ev['seconds'], 's')} is {fmt(ratio, 'x', sig=2)} "
                             f"the check's {fmt(seconds, 's')}: time it with warm-up and synchronization.")
    flops_fraction = ev["flops"] / ev["seconds"] / ev["flops_ceiling"]
    bandwidth_fraction = ev["bytes"] / ev["seconds"] / ev["bandwidth_ceiling"]
    # a GPU's roofs are the clock model's peaks, which no step exceeds; a shared CPU's speed
    # changes from minute to minute, and the student's ceilings and step were timed minutes
    # apart (a loaded CI machine once read a right step at 2.2x its ceiling): 5x there, still
    # far below what a ceiling in the wrong unit or of the wrong dtype gives
    impossible = 2.0 if step.device.type == "cuda" else 5.0
    for label, frac in (("FLOP/s", flops_fraction), ("bandwidth", bandwidth_fraction)):
        if frac > impossible:
            raise ExerciseFailed(f"✗ step {name}: achieved {label} is {fmt(frac, 'x', sig=2)} its ceiling, "
                                 "which is impossible: re-measure the ceiling (right dtype, large enough "
                                 "sizes).")
    busy = ev["busy_fraction"] if step.device.type == "cuda" else None
    implied = regime(flops_fraction, bandwidth_fraction, busy)
    if answer != implied:
        raise ExerciseFailed(f"✗ step {name}: your evidence ({fmt(flops_fraction, '%')} of the compute ceiling, "
                             f"{fmt(bandwidth_fraction, '%')} of the bandwidth, "
                             f"busy {fmt(ev['busy_fraction'], '%', sig=2)}) says "
                             f"{implied!r}, not {answer!r}.")
    if _digest(name, answer) != _ANSWERS[name]:
        if step.device.type == "cpu" and _cpu_agrees_now(step, answer, cost, seconds):
            print(f"✓ step {name} is {answer} on this CPU now: your evidence and the check's own "
                  f"(the step re-timed, the copy bandwidth and matrix rate measured again) both "
                  f"say so, though a quiet machine puts this step in another regime: a shared "
                  f"CPU's other work moves the ceilings, and the step near a regime's edge. "
                  f"Run it again when the machine is idle.")
            return True
        raise ExerciseFailed(f"✗ step {name}: {answer!r} follows from your numbers but is not the right "
                             "regime" + (": the check's own evidence, taken now, disagrees with yours; on "
                                         "a shared CPU the load moves the ceilings and the step, so "
                                         "measure the ceilings again right beside the step, or run it "
                                         "again when the machine is idle." if step.device.type == "cpu"
                                         else ": check the ceilings and the counts."))
    print(f"✓ step {name} is {answer}: {fmt(flops_fraction, '%')} of the compute ceiling, "
          f"{fmt(bandwidth_fraction, '%')} of the copy bandwidth, "
          f"busy {fmt(ev['busy_fraction'], '%', sig=2)} of the step.")
    return True
