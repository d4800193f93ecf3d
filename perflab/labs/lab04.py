"""Lab 4's check: a diagnosis of a mystery step from its evidence."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable

import torch

import perflab.core.timing as timing
from perflab.core.rounds import interleaved
from perflab.core.timing import benchmark
from perflab.core.validate import number
from perflab.labs.standin import stand_in_device
from perflab.labs.exercises import ExerciseFailed, as_float, plain, NotPlain
from perflab.machine import ceilings
from perflab.machine.costs import count_cost, matmul_cost
from perflab.profiling.mystery import MysteryStep, _ANSWERS, _EVIDENCE_KEYS, _digest
from perflab.profiling.trace import REGIMES, regime
from perflab.record.numbers import fmt, fmt_range

__all__ = ["check_diagnosis", "check_first_call", "check_waits", "cpu_ceilings", "flops_hint", "fractions",
           "time_fresh_call"]

#: the evidence a shared CPU measures in interleaved rounds (one value per round, in the same
#: rounds): the step's time and the two ceilings it is divided by
_ROUND_KEYS = ("seconds", "flops_ceiling", "bandwidth_ceiling")


def _finite(name: str, evidence: dict, key: str) -> float | tuple[float, ...]:
    """One evidence value as a float, or (a key of ``_ROUND_KEYS``) a tuple of per-round floats."""
    value = evidence.get(key)
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] has no value yet.")
    if key in _ROUND_KEYS and isinstance(value, (list, tuple)):
        if not value:
            raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] is an empty list of rounds.")
        vs = tuple(as_float(f"step {name}: evidence[{key!r}][{k}]", v) for k, v in enumerate(value))
    else:
        vs = (as_float(f"step {name}: evidence[{key!r}]", value),)
    if min(vs) < 0:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] holds {min(vs)}, not a finite, "
                             "non-negative number.")
    return vs if len(vs) > 1 or isinstance(value, (list, tuple)) else vs[0]


def _per_round(name: str, ev: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The fractions of the compute and the copy ceiling, round by round: a value given once
    stands for every round; values given per round must come from the same rounds."""
    sizes = {len(ev[k]) for k in _ROUND_KEYS if isinstance(ev[k], tuple)}
    if len(sizes) > 1:
        raise ExerciseFailed(f"✗ step {name}: seconds and the ceilings hold different numbers of "
                             f"rounds ({sorted(sizes)}): measure them in the same rounds.")
    n = sizes.pop() if sizes else 1
    col = {k: ev[k] if isinstance(ev[k], tuple) else (ev[k],) * n for k in _ROUND_KEYS}
    flops = tuple(ev["flops"] / t / c for t, c in zip(col["seconds"], col["flops_ceiling"]))
    bw = tuple(ev["bytes"] / t / c for t, c in zip(col["seconds"], col["bandwidth_ceiling"]))
    return flops, bw


def fractions(evidence: dict) -> tuple[float, float]:
    """The step's achieved FLOP/s and bytes/s as fractions of its ceilings: the medians of the
    per-round fractions when ``seconds`` and the ceilings were measured in the same interleaved
    rounds (tuples, one value per round), else the plain ratios.

    Raises:
        ExerciseFailed: a missing or non-finite value, or rounds of different lengths.
    """
    name = "(evidence)"
    ev = {k: _finite(name, evidence, k) for k in ("flops", "bytes") + _ROUND_KEYS}
    if any(min(ev[k]) <= 0 if isinstance(ev[k], tuple) else ev[k] <= 0 for k in _ROUND_KEYS):
        raise ExerciseFailed("✗ seconds and both ceilings must be positive.")
    flops, bw = _per_round(name, ev)
    return statistics.median(flops), statistics.median(bw)


def cpu_ceilings(device: torch.device | str = "cpu") -> dict[str, Callable[[], float]]:
    """A CPU's two ceilings as callables that each measure once, to time in interleaved rounds
    beside a step (:func:`perflab.core.rounds.interleaved`), so a burst of other work on a shared
    machine slows a round's step and its ceilings alike.

    ``{"copy_bandwidth": bytes/s of one tensor copied beyond the caches, "matmul_fp32": FLOP/s
    of an n^3 float32 product}``, at the sizes ``perflab.machine.ceilings.measure_all(quick=True)``
    times (read from :func:`perflab.machine.ceilings.sizes`, not repeated here), each timed by
    :func:`perflab.core.timing.benchmark` for 0.1 s.

    Raises:
        ValueError: ``device`` is not a CPU.
    """
    dev = torch.device(device)
    if dev.type != "cpu":
        raise ValueError(f"device must be a CPU (a GPU's roofs are the run's fixed ceilings), got {device!r}")
    size = ceilings.sizes(dev, quick=True)     # the run's quick sizes, one place
    src = torch.randn(size["copy_numel"])
    dst = torch.empty_like(src)
    n = size["matmul_n"]
    a, b = torch.randn(n, n), torch.randn(n, n)
    copy_bytes = 2 * src.numel() * src.element_size()
    product = matmul_cost(n, n, n, torch.float32).flops
    return {
        "copy_bandwidth": lambda: copy_bytes / benchmark(lambda: dst.copy_(src), dev, 0.1),
        "matmul_fp32": lambda: product / benchmark(lambda: a @ b, dev, 0.1),
    }


def flops_hint(calls: int) -> Callable[[float], str]:
    """Exercise 2's hint for wrong FLOPs per call, chosen by the ratio of the answer to the right
    one (:func:`perflab.labs.exercises.check_close` calls it with that ratio): ``calls`` times
    (the top item's ``KernelStats.calls``) is the item's total over its calls taken for one
    call; one half is a multiply-add counted as one FLOP (or the total divided by twice the
    calls); one k-th (k >= 3) is the total divided by k times the calls the trace holds;
    anything else gets the count itself.
    """
    def hint(ratio: float) -> str:
        if calls > 1 and abs(ratio / calls - 1) < 0.01:
            return (f"{calls}x is the item's number of calls: a KernelStats' .flops is summed over "
                    "its .calls (the active steps of the schedule); divide by them.")
        if abs(ratio - 0.5) < 0.005:
            return ("half: a multiply-add is 2 FLOPs, or the total was divided by twice the calls "
                    "the trace recorded (the summary's .calls counts the active steps only).")
        k = round(1 / ratio) if 0 < ratio < 0.4 else 0
        if k >= 3 and abs(ratio * k - 1) < 0.01:
            return (f"1/{k}: the total was divided by {k} times the calls the trace recorded (the "
                    "summary's .calls counts the active steps only, not the warm-up).")
        return ("a product of an m x k and a k x n matrix does m*n*k multiply-adds, 2 FLOPs each, "
                "per call.")
    return hint


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


class _StandInQueue:
    """A GPU's queue, stood in for on a CPU: a call of :meth:`launch` queues one run of
    ``work`` and returns at once; :meth:`synchronize` (any arguments) runs what is queued and
    returns when it is done, as a GPU's synchronization returns when its kernels are."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work, self.pending, self.syncs = work, 0, 0

    def launch(self) -> None:
        self.pending += 1

    def synchronize(self, *args: Any, **kwargs: Any) -> None:
        self.syncs += 1
        while self.pending:
            self.pending -= 1
            self.work()


def check_waits(timer: Callable, fn: Callable, state: dict, device: Any, runs: int = 3,
                lowest: float = 0.1) -> float:
    """Exercise 1's check, on a CPU, that the timer waits for the work it times.

    A CPU runs ``fn`` before ``fn()`` returns, so a timer that forgets to synchronize reads
    right there. The check gives the student's ``timer`` a stand-in for a GPU's queue
    (:class:`_StandInQueue`): the timed function only queues ``fn``'s work and returns, and
    ``synchronize`` runs it. For the duration, every name of the timer's module bound to
    :func:`perflab.core.timing.synchronize`, the module's own attribute and
    ``torch.cuda.synchronize`` do that, ``torch.cuda.is_available()`` says True, the timer is
    handed ``torch.device("cuda")`` and the notebook's names for the CPU device name it too
    (:func:`perflab.labs.standin.stand_in_device`), so a timer written for a GPU takes its
    GPU path. A timer that synchronizes after each timed call reads ``fn``'s time; one that
    does not reads the queueing, thousands of times less. Passes when the best of ``runs``
    readings on the queue is at least ``lowest`` times the best of ``runs`` readings of ``fn``
    itself (the same timer, the costly first call already spent: ``state["initialised"]``).
    Prints one sentence and returns that ratio.

    Raises:
        ExerciseFailed: the timer read less than ``lowest`` times the work's time.
        ValueError: ``device`` is not a CPU (a GPU's queue is real: the check against
            ``event_timer`` shows a timer that does not wait), or ``runs`` < 1.
    """
    if torch.device(device).type != "cpu":
        raise ValueError(f"check_waits stands in for a GPU on a CPU; got device {device!r}")
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    state["initialised"] = True
    direct = min(as_float("honest_median's time", timer(fn, device)) for _ in range(runs))
    queue = _StandInQueue(fn)
    names = getattr(timer, "__globals__", {})
    real = timing.synchronize
    bound = [k for k, v in list(names.items()) if v is real]
    saved = (torch.cuda.synchronize, torch.cuda.is_available)
    try:
        for k in bound:
            names[k] = queue.synchronize
        timing.synchronize = torch.cuda.synchronize = queue.synchronize
        torch.cuda.is_available = lambda: True
        with stand_in_device(timer, "cuda") as gpu:
            queued = min(as_float("honest_median's time", timer(queue.launch, gpu))
                         for _ in range(runs))
    finally:
        for k in bound:
            names[k] = real
        timing.synchronize = real
        torch.cuda.synchronize, torch.cuda.is_available = saved
    queue.synchronize()                       # what a timer left queued
    ratio = queued / direct if direct > 0 else 0.0
    if ratio < lowest:
        raise ExerciseFailed(
            f"✗ honest_median does not wait for the work it times: given a stand-in for a GPU's "
            f"queue (fn() returns at once, synchronize runs the work), it read {fmt(ratio, sig=2)}x "
            "the work's time. Call synchronize(device) after fn() and before reading the clock.")
    print(f"✓ honest_median waits for the work: on a stand-in for a GPU's queue (fn() returns at "
          f"once, synchronize runs the work) it read {fmt(ratio, sig=2)}x the work's time.")
    return ratio


def _cpu_rounds_name(step: MysteryStep, answer: str, cost, rounds: int = 5) -> tuple[bool, str]:
    """Whether the check's own evidence, taken now, names ``answer`` for ``step`` on a CPU, and
    what it read: the step and both ceilings (:func:`cpu_ceilings`) timed in ``rounds``
    interleaved rounds, the regime of each round's fractions (with the step's own counts,
    ``cost``); ``answer`` is named when **most** rounds name it (more than half of them, each
    round's regime read from its own fractions).

    A single round would not do: on a shared CPU a round in which a burst of load slowed the
    step and not its ceilings crosses a regime's edge by chance, and "one of five rounds" then
    passes a wrong answer whenever any round strays. Most rounds cross only where the load that
    moved the student's step still moves the check's, as a steady load does (``stress-ng --cpu
    2`` beside the lab's test): that is the case this fallback exists for.

    On a loaded 2-core machine the lab's reference diagnosis once read step b (1.1 ms, 2.3 MB:
    19 % of an 11 GB/s copy ceiling on a quiet machine) as bandwidth-bound, at 26 % of a copy
    ceiling measured at 8 GB/s; a student's reading of step a moved from 6.5 % to 68 % of a
    ceiling measured up to a minute before the step (review of 6 December). In the same rounds
    a burst of load slows a round's step and its ceilings alike."""
    r = interleaved({"step": lambda: benchmark(step, step.device, min_run_time_s=0.2),
                     **cpu_ceilings(step.device)}, rounds=rounds, warmup=0)
    ff = cost.flops / r["step"] / r["matmul_fp32"]
    fb = cost.bytes / r["step"] / r["copy_bandwidth"]
    named = [regime(f, b, None) for f, b in zip(ff.values, fb.values)]
    votes = named.count(answer)
    said = (f"the check's {rounds} rounds read {fmt_range(fb.lo, fb.hi, '%')} of the copy "
            f"bandwidth and {fmt_range(ff.lo, ff.hi, '%')} of the matrix rate (rounds: "
            f"{', '.join(f'{named.count(k)} {k}' for k in sorted(set(named)))})")
    return 2 * votes > rounds, said


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

    ``seconds`` and the two ceilings may each be a tuple (or list) of per-round values measured
    in the same interleaved rounds (as the lab's reference does on a CPU, with
    :func:`cpu_ceilings`); the fractions are then taken round by round and their median judged
    (:func:`fractions`), and rounds of different lengths are an error.

    The check recounts FLOPs and bytes (they must match within 1 %), re-times the step (the
    student's time must be within ``time_tolerance`` x of it either way; default 5 on a GPU,
    where a timer that does not wait for the kernels is off by far more, and 20 on a CPU, which
    has no queue to forget and whose timings on a shared machine scatter widely), requires the achieved fractions to stay below 2 x the ceilings on a GPU, 5 x on a CPU (a
    ceiling measured wrongly shows up as an impossible fraction), requires ``answer`` to follow
    from the evidence by :func:`perflab.profiling.trace.regime`, and finally compares it with the right
    answer. On a CPU, an answer other than the right one passes only when the check's own
    evidence, taken now (the step and its ceilings timed in five interleaved rounds), names it in
    most rounds (:func:`_cpu_rounds_name`): a shared CPU's steady load can move a step across a
    regime's edge, and the sentence says so.

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
    if any(min(ev[k]) <= 0 if isinstance(ev[k], tuple) else ev[k] <= 0 for k in _ROUND_KEYS):
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
    yours = statistics.median(ev["seconds"]) if isinstance(ev["seconds"], tuple) else ev["seconds"]
    ratio = yours / seconds
    if not 1 / time_tolerance <= ratio <= time_tolerance:
        raise ExerciseFailed(f"✗ step {name}: your step time {fmt(yours, 's')} is {fmt(ratio, 'x', sig=2)} "
                             f"the check's {fmt(seconds, 's')}: time it with warm-up and synchronization.")
    # measured in rounds, the fractions are taken round by round (a burst of load slows a
    # round's step and its ceilings alike), and their median judged
    flops_rounds, bandwidth_rounds = _per_round(name, ev)
    flops_fraction = statistics.median(flops_rounds)
    bandwidth_fraction = statistics.median(bandwidth_rounds)
    # a GPU's roofs are the clock model's peaks, which no step exceeds; a shared CPU's speed
    # changes from minute to minute, and a student's ceilings and step may be timed minutes
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
        if step.device.type == "cpu":
            agrees, said = _cpu_rounds_name(step, answer, cost)
            if agrees:
                print(f"✓ step {name} is {answer} on this CPU now: your evidence says so and "
                      f"{said}, though a quiet machine puts this step in another regime: a "
                      f"shared CPU's other work moves the step near a regime's edge. Run it "
                      f"again when the machine is idle.")
                return True
            raise ExerciseFailed(f"✗ step {name}: {answer!r} follows from your numbers but is not the "
                                 f"right regime, and not what the check reads now: {said}. Measure "
                                 "the step and the ceilings in the same interleaved rounds (a load "
                                 "burst then slows both alike), or run it again when the machine "
                                 "is idle.")
        raise ExerciseFailed(f"✗ step {name}: {answer!r} follows from your numbers but is not the right "
                             "regime: check the ceilings and the counts.")
    print(f"✓ step {name} is {answer}: {fmt(flops_fraction, '%')} of the compute ceiling, "
          f"{fmt(bandwidth_fraction, '%')} of the copy bandwidth, "
          f"busy {fmt(ev['busy_fraction'], '%', sig=2)} of the step.")
    return True
