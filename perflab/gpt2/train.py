"""Training a GPT-2 rung on real tokens, timed: tokens/s, MFU, peak memory, every step's loss.

:func:`train` runs a :class:`perflab.gpt2.rungs.Rung` for a number of steps on real tokens
(chapter 5's offline corpus, :func:`perflab.loading.datasets.text_corpus`) and returns a
:class:`perflab.gpt2.rungs.RunResult`: tokens per second over the timed steps, model FLOP
utilization, peak memory, the loss of every step and the GPU telemetry (clock, power cap) of the
timed steps; optionally a profile of one more step (:mod:`perflab.gpt2.breakdown`) and a memory
snapshot.

* tokens per second are measured after ``warmup`` untimed steps (compilation, allocator warm-up,
  cuDNN/cuBLAS heuristics), over ``steps`` back-to-back steps with one synchronization at the end;
* every rung starts from the same initial weights (``seed``) and reads the same token windows in
  the same order (:func:`window_ids`, :func:`batches`), so the losses of two rungs over the same
  steps are comparable (:func:`losses_agree`);
* :func:`distributed_task` is one rank's part of a data-parallel run under ``torchrun``.
"""

from __future__ import annotations

import copy
import gc
from types import SimpleNamespace
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from perflab.core.rounds import interleaved
from perflab.core.telemetry import Telemetry
from perflab.core.timing import Stopwatch, seconds_per_call
from perflab.core.validate import integer, positive_int
from perflab.gpt2.model import GPT
from perflab.gpt2.steps import make_graphed_step, make_net, make_optimizer, make_step
from perflab.gpt2.breakdown import profile_pair, profile_step
from perflab.gpt2.rungs import Rung, RunResult, rung_from_dict
from perflab.memory.snapshots import record_snapshot, save_snapshot

try:
    from torch.distributed.fsdp import fully_shard  # torch >= 2.6
except ImportError:  # torch 2.4-2.5 kept FSDP2 under its composable-API name
    from torch.distributed._composable.fsdp import fully_shard

__all__ = ["window_ids", "batches", "train", "train_rounds", "train_pairs", "losses_agree",
           "run_clocks", "token_ids", "distributed_task"]


def window_ids(step: int, batch: int, n_windows: int, rank: int = 0, world: int = 1,
               start: int = 0) -> list[int]:
    """The token windows that ``rank`` of ``world`` reads in micro-step ``step`` (0, 1, ...).

    Data parallelism shards one stream, as ``torch.utils.data.DistributedSampler`` does (no
    shuffle): the windows are dealt round-robin to the ranks, so micro-step ``k`` of rank ``r``
    reads windows ``start + (k * batch + b) * world + r`` for ``b < batch`` (modulo
    ``n_windows``). In one micro-step the ranks read ``world x batch`` distinct windows, and
    consecutive micro-steps (gradient accumulation, the next optimizer step) never read a
    window again until the stream wraps around. With ``world == 1`` the windows are simply
    consecutive.

    Raises:
        ValueError: ``rank`` outside ``[0, world)``, or fewer windows than one micro-step of all
            ranks needs.
    """
    integer("rank", rank, 0, world - 1)         # one of the world's ranks
    if n_windows < batch * world:
        raise ValueError(f"{n_windows} windows cannot feed {world} rank(s) x batch={batch}")
    return [(start + (step * batch + b) * world + rank) % n_windows for b in range(batch)]


def batches(tokens: np.ndarray, batch: int, seq_len: int, start: int = 0, rank: int = 0,
            world: int = 1):
    """``(x, y)`` int64 CPU batches ``(batch, seq_len)`` from a 1-D token array, for one rank.

    Window ``i`` is ``tokens[i*seq_len : (i+1)*seq_len + 1]`` (``x`` its first ``seq_len``
    tokens, ``y`` the same shifted by one); micro-step ``k`` reads the windows
    :func:`window_ids` gives ``rank`` of ``world`` (consecutive windows for one process), so
    every rung reads the same tokens in the same order and no two ranks read the same window.

    Raises:
        ValueError: fewer tokens than one micro-step of all ranks needs.
    """
    n_windows = (len(tokens) - 1) // seq_len
    if n_windows < batch * world:
        raise ValueError(f"{len(tokens)} tokens hold {n_windows} windows of {seq_len}; "
                         f"need at least batch x world = {batch * world}")
    step = 0
    while True:
        rows = window_ids(step, batch, n_windows, rank, world, start)
        w = np.stack([tokens[r * seq_len: r * seq_len + seq_len + 1] for r in rows])
        w = torch.from_numpy(w.astype(np.int64))
        yield w[:, :-1], w[:, 1:]
        step += 1


class _Windows(torch.utils.data.Dataset):
    """Window ``i`` of a token array as ``(x, y)`` (for the DataLoader of the pinned loader)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i):
        L = self.seq_len
        w = torch.from_numpy(self.tokens[i * L: i * L + L + 1].astype(np.int64))
        return w[:-1], w[1:]


def _pinned_batches(tokens: np.ndarray, batch: int, seq_len: int, rank: int = 0,
                    world: int = 1):
    ds = _Windows(tokens, seq_len)
    if len(ds) < batch * world:
        raise ValueError(f"{len(tokens)} tokens hold {len(ds)} windows; need batch x world = "
                         f"{batch * world}")
    # the order of batches(): this rank's windows rank, rank + world, ... (a distributed
    # sampler without shuffling), the ragged end dropped
    mine = range(rank, len(ds) - len(ds) % (batch * world), world)
    while True:
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=mine, num_workers=2,
                                             pin_memory=torch.cuda.is_available(),
                                             drop_last=True, prefetch_factor=4)
        yield from loader


#: the most allocator events a snapshot keeps (one eager step of 8 micro-batches makes ~40,000)
_SNAPSHOT_EVENTS = 400_000


def _counting(stream, read: list):
    """``stream``'s batches, appending each micro-step's index to ``read`` as it is taken."""
    for item in stream:
        read.append(len(read))
        yield item


def _check_rungs(rungs: Sequence[Rung], least: int, rounds: int, steps: int,
                 warmup: int) -> list[Rung]:
    """``rungs`` as a list after the checks :func:`train_rounds` and :func:`train_pairs`
    share: at least ``least`` :class:`Rung` objects of distinct names, ``rounds`` and
    ``steps`` >= 1, ``warmup`` >= 0.

    Raises:
        TypeError: an element that is not a Rung.
        ValueError: fewer than ``least`` rungs, repeated names, or a bad count.
    """
    rungs = list(rungs)
    for r in rungs:
        if not isinstance(r, Rung):
            raise TypeError(f"rungs must hold Rungs, got {type(r).__name__}")
    if len(rungs) < least:
        word = {1: "one rung", 2: "two rungs"}.get(least, f"{least} rungs")
        raise ValueError(f"rungs must hold at least {word}, got {len(rungs)}")
    names = [r.name for r in rungs]
    if len(set(names)) != len(names):
        raise ValueError(f"rungs must have distinct names, got {names}")
    positive_int("rounds", rounds)
    positive_int("steps", steps)
    integer("warmup", warmup, 0)
    return rungs


def _prepare(rung: Rung, tokens: np.ndarray, device: torch.device, seed: int, lr: float,
             ddp: Any = None) -> SimpleNamespace:
    """Build ``rung``'s model (weights from ``seed``), optimizer, batch stream and step, as
    :func:`train` and :func:`train_rounds` time them; ``held`` is the memory allocated on a
    GPU before the model was made (earlier tensors, not this rung's)."""
    top = int(np.max(tokens[: 1 << 20])) if len(tokens) else 0
    if top >= rung.vocab:
        raise ValueError(f"tokens hold id {top}, outside the vocabulary of {rung.vocab}")
    cfg = rung.config()
    held = 0
    if device.type == "cuda":
        gc.collect()                     # earlier runs' models in reference cycles
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)   # not this run's: left out
    torch.manual_seed(seed)
    with device:        # the weights are made where they train: no host init, no copy
        model = GPT(cfg)
    # the page's step (chapter 10, perflab.gpt2.steps): this module only measures it
    net = make_net(model, rung, ddp)
    opt = make_optimizer(model, rung, lr)
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    # one stream of windows dealt to the ranks (window_ids): no two ranks, and no two
    # micro-steps, read the same tokens
    if rung.loader == "pinned":
        stream = _pinned_batches(tokens, rung.batch, rung.seq_len, rank, world)
    else:
        stream = batches(tokens, rung.batch, rung.seq_len, rank=rank, world=world)
    n_windows = (len(tokens) - 1) // rung.seq_len
    read: list[int] = []      # micro-steps read so far (their windows: window_ids)
    stream = _counting(stream, read)
    if rung.step_graph and device.type == "cuda":
        # two eager warm-up steps, then the capture: time only replays
        one_step = make_graphed_step(net, opt, rung, stream, device, warmup=2)
    else:
        one_step = make_step(net, opt, rung, stream, device)
    return SimpleNamespace(model=model, net=net, opt=opt, one_step=one_step, held=held,
                           read=read, n_windows=n_windows, rank=rank, world=world)


def train(rung: Rung, tokens: np.ndarray, steps: int, device: torch.device | str,
          warmup: int = 2, seed: int = 0, lr: float = 3e-4, ddp: Any = None,
          profile: bool = False, snapshot: str | None = None,
          snapshot_events: int = _SNAPSHOT_EVENTS, windows: int = 1,
          sustain_s: float | None = None, settle_s: float = 5.0) -> RunResult:
    """Train GPT-2 by ``rung`` for ``warmup + windows x steps`` optimizer steps; time the last
    ``windows x steps`` in ``windows`` back-to-back windows of ``steps`` steps.

    Args:
        rung: the configuration.
        tokens: 1-D array of token ids (uint16 memmap or any integer array), all ids below
            ``rung.vocab``.
        steps: timed optimizer steps (>= 1).
        device: where to train.
        warmup: untimed steps first (compilation happens in the first).
        windows: timed windows of ``steps`` steps, back to back (>= 1): ``result.step_s`` is the
            median of the windows' seconds per step, ``result.extra["window_step_s"]`` every
            window's (their spread is the run's noise between windows a few steps apart).
        sustain_s: after the timed windows (and any profiled or snapshot step), keep training
            for ``settle_s`` untimed seconds (the power cap and the clock settle) and then
            ``sustain_s`` timed seconds in blocks of ``steps`` steps (one synchronization per
            block), under its own telemetry window: ``result.extra["sustained"]`` holds the
            blocks' seconds per step (``"block_step_s"``), their median (``"step_s"``), the
            tokens/s it gives, the clock sentence and the median SM clock of that window. None
            (default): no sustained window.
        settle_s: untimed seconds before the sustained window (>= 0).
        seed: initial weights (the same for every rung with the same seed and model on the
            same device: they are drawn on ``device``, so a GPU's differ from a CPU's).
        lr: AdamW learning rate (betas 0.9, 0.95, weight decay 0.1 on matrices).
        ddp: a callable wrapping the model for data parallelism (e.g. ``DistributedDataParallel``
            with its arguments bound), or None. With DDP each rank reads its own windows.
        profile: after the timed steps, profile one more step and put what
            :func:`perflab.gpt2.breakdown.profile_step` returns in ``result.extra``.
        snapshot: a file to write a CUDA memory snapshot of one more step to
            (``torch.cuda.memory._dump_snapshot``, for https://pytorch.org/memory_viz); ignored
            on a CPU (``result.extra["snapshot"]`` is None there).
        snapshot_events: the most allocator events the snapshot keeps (the last ones; about
            100 bytes of file each); ``result.extra["snapshot_complete"]`` says whether the
            whole step fitted.

    Returns:
        A :class:`RunResult`; the model and optimizer are freed before it returns.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 0, or token ids outside the vocabulary.
    """
    positive_int("steps", steps)
    integer("warmup", warmup, 0)
    positive_int("windows", windows)
    if sustain_s is not None and not sustain_s > 0:
        raise ValueError(f"sustain_s must be positive or None, got {sustain_s!r}")
    if settle_s < 0:
        raise ValueError(f"settle_s must be >= 0, got {settle_s!r}")
    if not isinstance(rung, Rung):
        raise TypeError(f"rung must be a Rung, got {type(rung).__name__}")
    device = torch.device(device)
    if (rung.graphs or rung.step_graph) and ddp is not None:
        raise ValueError("a graphs or step_graph rung runs in one process: train it without ddp")
    torch.compiler.reset()
    run = _prepare(rung, tokens, device, seed, lr, ddp)
    model, net, opt, one_step = run.model, run.net, run.opt, run.one_step
    held, read, n_windows, rank, world = run.held, run.read, run.n_windows, run.rank, run.world
    if rung.step_graph and device.type == "cuda":
        warmup = max(warmup, 3)          # two eager warm-up steps, then the capture
    losses: list[torch.Tensor] = []

    def step():
        losses.append(one_step())

    first_step = Stopwatch(device).start()
    first = None
    for i in range(warmup):
        step()
        if i == 0:
            first = first_step.elapsed()
    index = device.index or 0 if device.type == "cuda" else 0
    window_s = []
    with Telemetry(index=index) as tel:
        for _ in range(windows):
            # each timed window is marked, so the rate's clock is read over its own steps
            with tel.window(), Stopwatch(device) as timed:
                for _ in range(steps):
                    step()
            window_s.append(timed.seconds / steps)
    summary = tel.summary()
    step_s = float(np.median(window_s))
    # the losses of the warm-up and timed steps only: a profiled or snapshot step (CUDA only)
    # would give rungs different counts, and the memory table compares them element by element
    n_losses = len(losses)
    # the windows of the timed steps, so that a data-parallel run can count distinct tokens
    timed_reads = read[len(read) - windows * steps * rung.accum:]
    extra = {"windows": sorted({w for k in timed_reads for w in window_ids(
        k, rung.batch, n_windows, rank, world)}), "window_step_s": window_s,
        **run_clocks(summary)}
    if profile:
        extra.update(profile_step(step, device))
    if snapshot is not None:
        extra["snapshot"] = None
        if device.type == "cuda":
            # the step's last `snapshot_events` events (the default keeps every event of
            # an eager step of 8 micro-batches), stacks cut to 8 frames
            snap = record_snapshot(step, max_entries=snapshot_events, max_frames=8)
            events = sum(len(t) for t in snap.get("device_traces", []))
            extra["snapshot_events"] = events
            extra["snapshot_complete"] = events < snapshot_events
            save_snapshot(snap, snapshot)
            extra["snapshot"] = str(snapshot)
    if sustain_s is not None:
        extra["sustained"] = _sustained(step, device, index, steps, rung.tokens_per_step,
                                        sustain_s, settle_s)
    peak = torch.cuda.max_memory_allocated(device) - held if device.type == "cuda" else None
    result = RunResult(
        rung=asdict(rung), tokens_per_s=rung.tokens_per_step / step_s, step_s=step_s,
        flops_per_token=model.flops_per_token(rung.seq_len), peak_bytes=peak,
        losses=[float(v) for v in torch.stack(losses[:n_losses]).cpu()],
        compile_s=max(0.0, (first if first is not None else step_s) - step_s),
        telemetry=summary.sentence(), telemetry_brief=summary.brief(),
        clock_fraction=summary.clock_fraction, params=model.num_params(), extra=extra)
    del net, model, opt, one_step, run
    _release(device)
    return result


def run_clocks(summary) -> dict:
    """The SM clock (MHz) a timed stretch ran at, as a rung's ``extra`` stores it.

    ``sm_clock_mhz`` is the time-weighted clock (``TelemetrySummary.sm_clock_mhz``): the
    statistic the ceilings' clocks and the telemetry sentences state, so that a goal scaled
    from a ceiling's clock to a rung's, or a sustained clock set against a burst's, compares
    one statistic with itself. The median of the readings is kept beside it, under its own
    name ``sm_clock_mhz_median`` (it can differ by 10 % from the weighted clock when the
    readings are unevenly spaced). Both None where no clock was read.

    Raises:
        ValueError: ``summary`` has no ``sm_clock_mhz`` (not a telemetry summary).
    """
    if not hasattr(summary, "sm_clock_mhz"):
        raise ValueError(f"summary must be a TelemetrySummary, got {type(summary).__name__}")
    return {"sm_clock_mhz": summary.sm_clock_mhz,
            "sm_clock_mhz_median": summary.sm_clock_mhz_median}


def _sustained(step, device: torch.device, index: int, block: int, tokens_per_step: int,
               sustain_s: float, settle_s: float) -> dict:
    """Train ``settle_s`` untimed seconds, then ``sustain_s`` timed seconds in blocks of
    ``block`` steps under a telemetry window; the blocks' seconds per step and what they give."""
    per_step = []
    with Telemetry(index=index) as tel:
        settle = Stopwatch(device).start()
        while settle.elapsed() < settle_s:
            step()
        with tel.window():
            total = Stopwatch(device).start()
            while total.elapsed() < sustain_s:
                with Stopwatch(device) as one:
                    for _ in range(block):
                        step()
                per_step.append(one.seconds / block)
    summary = tel.summary()
    median = float(np.median(per_step))
    return {"block_step_s": per_step, "step_s": median, "tokens_per_s": tokens_per_step / median,
            "seconds": float(sum(per_step) * block), "telemetry": summary.sentence(),
            **run_clocks(summary),
            "power_w_max": getattr(summary, "power_w_max", None)}


def train_rounds(rungs: Sequence[Rung], tokens: np.ndarray, device: torch.device | str,
                 rounds: int = 5, steps: int = 1, warmup: int = 1, seed: int = 0,
                 lr: float = 3e-4) -> dict[str, RunResult]:
    """Train eager ``rungs`` side by side and time them in interleaved rounds.

    Every rung is built as :func:`train` builds it (same weights, same tokens in the same
    order) and warmed up with ``warmup`` steps, one rung after the other (its peak memory is
    measured then, above what the rungs before it hold: as :func:`train` measures it). Then
    :func:`perflab.core.rounds.interleaved` times ``steps`` steps of every rung per round, the
    order rotating (A, B, C; B, C, A; ...), so that a drift of the clock or of the host slows
    every rung alike and a ratio taken round by round cancels it.

    Args:
        rungs: eager rungs (no ``compile``) with distinct names, at least one.
        tokens: as for :func:`train`.
        device: where to train.
        rounds: timed rounds (>= 1; 5 gives a min-max spread).
        steps: optimizer steps per rung per round (>= 1).
        warmup: untimed steps of each rung before the rounds (>= 0).
        seed, lr: as for :func:`train`.

    Returns:
        ``{name: RunResult}`` in the order of ``rungs``: ``step_s`` the median over the rounds
        of seconds per step, ``tokens_per_s`` what that gives, ``extra["window_step_s"]`` the
        seconds per step of every round (a :class:`perflab.core.rounds.Spread`'s values, round
        by round in the same order for every rung), ``telemetry`` the clock over this rung's
        timed steps only (``extra["telemetry_windows"]``: their ``(start, end)`` on the
        sampler's clock), ``losses`` the warm-up and timed steps'.

    Raises:
        ValueError: no rungs, a compiled rung, repeated names, ``rounds`` or ``steps`` < 1,
            ``warmup`` < 0, or token ids outside a rung's vocabulary.
    """
    rungs = _check_rungs(rungs, 1, rounds, steps, warmup)
    if any(r.compile for r in rungs):
        raise ValueError("rungs must be eager (compile=False): train compiled rungs with train()")
    names = [r.name for r in rungs]
    device = torch.device(device)
    index = device.index or 0 if device.type == "cuda" else 0
    torch.compiler.reset()
    runs, losses, peaks = {}, {}, {}
    for r in rungs:                      # one after the other: each its own peak
        run = runs[r.name] = _prepare(r, tokens, device, seed, lr)
        losses[r.name] = [run.one_step() for _ in range(warmup)]
        peaks[r.name] = (torch.cuda.max_memory_allocated(device) - run.held
                         if device.type == "cuda" else None)
    mine: dict[str, list[int]] = {n: [] for n in names}   # each rung's timed windows

    def timed(name):
        def one_round():
            run = runs[name]
            with tel.window(), Stopwatch(device) as watch:
                for _ in range(steps):
                    losses[name].append(run.one_step())
            mine[name].append(len(tel.windows) - 1)     # the window just closed
            return watch.seconds / steps
        return one_round

    with Telemetry(index=index) as tel:
        spreads = interleaved({n: timed(n) for n in names}, rounds=rounds, warmup=0)
    out = {}
    for r in rungs:
        run, per_round = runs[r.name], spreads[r.name]
        own = copy.copy(tel)             # the same readings, this rung's windows only
        own.windows = [tel.windows[i] for i in mine[r.name] if 0 <= i < len(tel.windows)]
        summary = own.summary()
        out[r.name] = RunResult(
            rung=asdict(r), tokens_per_s=r.tokens_per_step / per_round.median,
            step_s=per_round.median, flops_per_token=run.model.flops_per_token(r.seq_len),
            peak_bytes=peaks[r.name],
            losses=[float(v) for v in torch.stack(losses[r.name]).cpu()] if losses[r.name]
            else [], compile_s=0.0, telemetry=summary.sentence(), telemetry_brief=summary.brief(),
            clock_fraction=summary.clock_fraction, params=run.model.num_params(),
            extra={"window_step_s": list(per_round.values), "rounds": per_round.n,
                   "telemetry_windows": list(own.windows)})
    del runs, run
    _release(device)
    return out


def _release(device: torch.device) -> None:
    """Free what dead rungs held (on a GPU the allocator's cached blocks too)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def train_pairs(rungs: Sequence[Rung], tokens: np.ndarray, device: torch.device | str,
                rounds: int = 5, steps: int | Mapping[str, int] = 3, warmup: int = 2,
                seed: int = 0, lr: float = 3e-4, profiles: int = 0) -> dict[str, dict[str, Any]]:
    """Time every rung against the rung before it, the two side by side in interleaved rounds.

    A saving of a few per cent between two rungs timed one after the other is lost in the drift
    of a power-capped clock; timed side by side (A, B; B, A; ...) the drift slows both alike and
    the saving taken round by round cancels it. The rungs are built as :func:`train` builds them
    (same weights, same tokens), compiled ones included, two at a time: rung ``i`` is built
    while rung ``i - 1`` is still alive, their pair is timed, then rung ``i - 1`` is freed, so at
    most two rungs hold memory at once (each ``warmup`` untimed steps first, at least three for a
    ``step_graph`` rung: two eager steps and the capture).

    Args:
        rungs: at least two rungs with distinct names, in ladder order.
        tokens: as for :func:`train`.
        device: where to train.
        rounds: timed rounds per pair (>= 1; 5 gives a min-max spread, 8 an IQR).
        steps: steps of each rung a round (>= 1): a count, or ``{name: count}`` by the later rung.
        warmup: untimed steps of each rung when it is built (>= 0).
        seed, lr: as for :func:`train`.
        profiles: after a pair's timed rounds, profile its two rungs' steps in this many
            interleaved rounds (:func:`~perflab.gpt2.breakdown.profile_pair`; 0: none).

    Returns:
        ``{name: {"before": Spread, "after": Spread, "saved": Spread}}`` for every rung but
        the first: the seconds per step of the rung before and of this one, round by round in
        the same rounds, and their difference (before minus after: the saving per step).
        With ``profiles``, ``"profiles"`` too: :func:`~perflab.gpt2.breakdown.profile_pair`'s.

    Raises:
        ValueError: fewer than two rungs, repeated names, ``rounds`` or a pair's ``steps`` < 1
            (or left out), ``warmup`` < 0, or token ids outside a rung's vocabulary.
    """
    rungs = _check_rungs(rungs, 2, rounds, 1, warmup)
    count = steps.get if isinstance(steps, Mapping) else lambda name: steps
    per_pair = {r.name: positive_int(f"steps[{r.name!r}]", count(r.name)) for r in rungs[1:]}
    integer("profiles", profiles, 0)
    device = torch.device(device)
    torch.compiler.reset()

    def build(r: Rung) -> SimpleNamespace:
        run = _prepare(r, tokens, device, seed, lr)
        n = max(warmup, 3) if r.step_graph and device.type == "cuda" else warmup
        for _ in range(n):
            run.one_step()
        return run

    def timed(run, name):                # one round's seconds per step of `run`
        return lambda: seconds_per_call(run.one_step, per_pair[name], device)
    out: dict[str, dict[str, Any]] = {}
    before = build(rungs[0])
    for r in rungs[1:]:
        after = build(r)
        before.one_step(), after.one_step()    # untimed: a graph rung records its graph in it
        pair = interleaved({"before": timed(before, r.name), "after": timed(after, r.name)},
                           rounds=rounds, warmup=0)
        out[r.name] = {**pair, "saved": pair["before"] - pair["after"]}
        if profiles:
            out[r.name]["profiles"] = profile_pair(before.one_step, after.one_step, profiles, device)
        del before
        _release(device)
        before = after
    del before, after
    torch.compiler.reset()               # frees the CUDA-graph trees' memory pool too
    _release(device)
    return out


def losses_agree(a: Sequence[float], b: Sequence[float], rtol: float = 0.02,
                 window: int = 5) -> tuple[bool, float]:
    """Do two loss curves over the same tokens agree? Returns ``(agree, worst)``.

    The curves are smoothed by a running mean over ``window`` steps (single steps are noisy),
    and ``worst`` is the largest relative difference ``|a - b| / b`` of the smoothed curves;
    they agree when ``worst <= rtol``.

    Raises:
        ValueError: curves of different lengths, shorter than ``window``, or non-finite values.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"the curves must be 1-D and of the same length, got {a.shape}, {b.shape}")
    if len(a) < window or window < 1:
        raise ValueError(f"need window >= 1 and at least window={window} steps, got {len(a)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the loss curves hold non-finite values")
    k = np.ones(window) / window
    sa, sb = np.convolve(a, k, "valid"), np.convolve(b, k, "valid")
    worst = float(np.max(np.abs(sa - sb) / np.abs(sb)))
    return worst <= rtol, worst


def token_ids(tokens: str | None, n_tokens: int = 4_000_000, id_range: int = 8192) -> np.ndarray:
    """The token ids a worker trains on: the uint16 file ``tokens`` (memory-mapped), or, when
    None, ``n_tokens`` seeded random ids below ``id_range`` (the same on every rank)."""
    if tokens is not None:
        return np.memmap(tokens, dtype=np.uint16, mode="r")
    return np.random.default_rng(0).integers(0, id_range, n_tokens).astype(np.uint16)


def distributed_task(ctx, rung: dict, steps: int, warmup: int = 2, tokens: str | None = None,
                     n_tokens: int = 4_000_000, id_range: int = 8192,
                     fsdp: bool = False) -> dict:
    """One rank's part of a data-parallel GPT-2 run (task ``perflab.gpt2.multi_gpu:ddp_run``).

    ``rung`` is a :class:`Rung` as a dict; ``tokens`` the path of a uint16 token file (None:
    ``n_tokens`` seeded random ids below ``id_range``, the same on every rank). Each rank trains
    ``rung.batch`` sequences per micro-batch on its own windows; ``fsdp`` shards parameters,
    gradients and optimizer state with FSDP2's ``fully_shard`` on every block and the root
    instead of replicating them with DDP. Returns the rank's :meth:`RunResult.as_dict`
    (tokens/s of this rank; the slowest rank's step time is in ``extra["max_step_s"]``).
    """
    r = rung_from_dict(rung)
    ids = token_ids(tokens, n_tokens, id_range)
    if fsdp:
        wrap = _fsdp_wrapper(ctx)
    else:
        ids_ = [ctx.device.index] if ctx.device.type == "cuda" else None

        def wrap(module):
            return DistributedDataParallel(module, device_ids=ids_)
    res = train(r, ids, steps, ctx.device, warmup=warmup, ddp=wrap)
    res.extra["max_step_s"] = ctx.max_over_ranks(res.step_s)
    res.extra["world_size"] = ctx.world
    # tokens/s of the whole job counts each window once: the union over ranks of the windows
    # their timed steps read (equal to world x this rank's when the stream is sharded)
    every = [None] * ctx.world
    ctx.dist.all_gather_object(every, res.extra["windows"])
    distinct = len(set().union(*map(set, every)))
    res.extra["distinct_windows"] = distinct
    res.extra["job_tokens_per_s"] = distinct * r.seq_len / (steps * res.extra["max_step_s"])
    return res.as_dict()


def _fsdp_wrapper(ctx):
    def wrap(module):
        for block in module.model.blocks:
            fully_shard(block)
        fully_shard(module)
        return module
    return wrap
