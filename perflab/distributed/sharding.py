"""Sharding measured on every rank: the bytes each rank holds under DDP, ZeRO-1 and FSDP2, and their steps.

Tasks (run by :mod:`perflab.distributed.worker`):

* ``sharding``: for DDP, ZeRO-1 (the page's ``zero1_adam``) and FSDP2 (the page's
  ``shard_fsdp2``, with and without resharding after the forward), the bytes of this rank's
  parameters, gradients and Adam state after one step (counted, and on a GPU read from the
  caching allocator), then the steps of all of them timed in interleaved rounds (or, named in
  ``once``, in one round after them); and Adam's own step over every parameter and over one
  rank's share, for the prediction;
* ``user_optimizer``: a student's optimizer (lab 8) trained on every rank, compared with a
  single process running plain Adam on the whole batch.

The formulas follow ZeRO (Rajbhandari et al., SC 2020): fp32 Adam keeps 16 bytes per parameter
(chapter 8's ``perflab.distributed.costs.static_bytes``).
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Sequence

import torch

from perflab.core.validate import integer
from perflab.distributed.data_parallel import bucket_bytes, ddp, rank0_trace, rounds_of
from perflab.distributed.sharded import shard_fsdp2, zero1_adam
from perflab.distributed.traces import arrival_skew, collective_starts, overlap_from_trace, ranges_from_trace
from perflab.distributed.workloads import (global_batch, make_mlp, mse, nbytes, state_bytes,
                                           timing_batch)
from perflab.speed.workload import fused_on_gpu

__all__ = ["STRATEGIES", "TASKS", "build", "optimizer_settings", "settled_reading", "sharding", "user_optimizer"]

#: the strategies :func:`sharding` compares
STRATEGIES = ("ddp", "zero1", "fsdp", "fsdp_keep")


def settled_reading(read: Callable[[], int], prepare: Callable[[], None] = lambda: None,
                    repeats: int = 3, interval_s: float = 0.25, timeout_s: float = 5.0,
                    sleep: Callable[[float], None] = time.sleep) -> int:
    """A reading of ``read()`` once it has stopped changing: ``repeats`` equal readings in a row.

    Used for ``torch.cuda.memory_allocated``: after a step, tensors that a collective used are
    kept alive by its work object (ProcessGroupNCCL stashes them instead of ``record_stream``)
    until the process group's watchdog thread sees the work complete and drops it, some time
    later; a reading taken at once still counts them, and one taken before a step can count
    the *previous* model's buffers, which are then freed during the step and make the
    difference too small. ``prepare()`` runs before each reading (``gc.collect``, a device
    synchronize, ``empty_cache``).

    Args:
        read: returns an integer (bytes).
        prepare: called before each reading.
        repeats: equal readings in a row that count as settled (>= 1).
        interval_s: seconds slept between readings (>= 0).
        timeout_s: after this many seconds the last reading is returned, settled or not.
        sleep: the sleep function (injected by tests).

    Raises:
        ValueError: ``repeats`` < 1 or a negative ``interval_s`` / ``timeout_s``.
    """
    integer("repeats", repeats, 1)
    if interval_s < 0 or timeout_s < 0:
        raise ValueError(f"interval_s and timeout_s must be >= 0, got {interval_s}, {timeout_s}")
    waited, same, last = 0.0, 0, None
    while True:
        prepare()
        value = read()
        same = same + 1 if value == last else 1
        last = value
        if same >= repeats or waited >= timeout_s:
            return value
        sleep(interval_s)
        waited += interval_s


def build(ctx, name: str, width: int, depth: int, lr: float = 1e-4):
    """``(model, optimizer)`` of strategy ``name`` (:data:`STRATEGIES`) on this rank: a
    ``depth`` x ``width`` stack, DDP with ``gradient_as_bucket_view=True`` (the gradients live in
    DDP's buckets, no second copy) under plain Adam or ZeRO-1, or FSDP2 with Adam.

    Raises:
        ValueError: an unknown strategy.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    model = make_mlp(width, depth, ctx.device)
    if name in ("ddp", "zero1"):
        model = ddp(ctx, model, gradient_as_bucket_view=True)
    else:
        model = shard_fsdp2(model, ctx.device.type, reshard=name == "fsdp")
    # fused on GPUs: the 28 bytes a parameter that the page's GPU model counts and its one-GPU
    # step measures (the foreach Adam moves ~72); None (foreach) on CPUs as before
    fused = fused_on_gpu(ctx.device)
    opt = (zero1_adam(model.parameters(), lr=lr, fused=fused) if name == "zero1"
           else torch.optim.Adam(model.parameters(), lr=lr, fused=fused))
    return model, opt


def _adam_seconds(ctx, params: int, width: int, iters: int) -> float:
    """One Adam step over ``params`` parameters (in tensors of ``width`` x ``width``, gradients
    present), the slowest rank's mean of ``iters``."""
    rows = max(1, params // width)
    w = torch.nn.Parameter(torch.randn(rows, width, device=ctx.device))
    w.grad = torch.randn_like(w)
    opt = torch.optim.Adam([w], lr=1e-4, fused=fused_on_gpu(ctx.device))
    return ctx.timed(opt.step, 2, iters)


def _copy_seconds(ctx, params: int, iters: int) -> float:
    """One copy of ``params`` float32 values into another buffer (``4 params`` bytes read and
    as many written), the slowest rank's mean of ``iters``."""
    src = torch.randn(params, device=ctx.device)
    dst = torch.empty_like(src)
    return ctx.timed(lambda: dst.copy_(src), 2, iters)


def sharding(ctx, width: int = 64, depth: int = 4, batch: int = 32, warmup: int = 2, iters: int = 4,
             rounds: int = 4, strategies: Sequence[str] = STRATEGIES, once: Sequence[str] = (),
             allow_tf32: bool = True) -> dict:
    """Bytes per rank after one Adam step, and step seconds in interleaved rounds, per strategy.

    Returns ``strategies``: ``{name: {"param_bytes", "grad_bytes", "state_bytes",
    "static_bytes"`` (this rank's tensors, counted), ``"allocated_bytes"``, ``"peak_bytes"``
    (CUDA allocator, None on a CPU)``}}``; ``step_rounds_s``: ``{name: [seconds per round]}``
    (each the slowest rank's mean of ``iters`` steps). A strategy named in ``once`` is counted
    like the others, but built, warmed up and timed in one round of its own after the others'
    ``rounds`` interleaved rounds (its list holds that one round): chapter 8 divides only DDP's,
    ZeRO-1's and FSDP's steps round by round, so a strategy it only shows need not pay every
    round's steps (commit df395a8 gives the seconds). ``adam_full_s`` and ``adam_shard_s``
    (Adam's step over every parameter and over ``1/world`` of them);
    ``copy_s`` (one copy of every parameter's 4 bytes: the unit of DDP's and FSDP's copies);
    ``ddp_bucket_bytes``; ``traces``: one DDP, one ZeRO-1 and one FSDP step profiled on rank 0
    (:func:`_traced_step`: how long their collectives, FSDP's hooks and the optimizer took
    inside the step); ``params``.

    ``allocated_bytes`` is the difference of two *settled* readings of
    ``torch.cuda.memory_allocated`` (:func:`settled_reading`): before the model was built and
    after its first step, so that neither another model's nor a collective's stashed buffers
    count; every strategy is measured alone before the timed rounds build them side by side.

    Raises:
        ValueError: ``once`` names a strategy that ``strategies`` does not hold.
    """
    if set(once) - set(strategies):
        raise ValueError(f"once names strategies that are not run: {sorted(set(once) - set(strategies))}")
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    cuda = ctx.device.type == "cuda"
    x, y = timing_batch(ctx.rank, batch, (width,), ctx.device)

    def prepare():
        gc.collect()
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()

    def allocated():
        return settled_reading(lambda: torch.cuda.memory_allocated(ctx.device), prepare)

    def stepper(model, opt):
        def step():
            opt.zero_grad(set_to_none=False)
            mse(model, x, y).backward()
            opt.step()
        return step

    out, params, buckets_ = {}, 0, []
    for name in strategies:
        base = allocated() if cuda else 0
        model, opt = build(ctx, name, width, depth)
        params = sum(p.numel() for p in make_mlp(width, depth, "meta").parameters())
        step = stepper(model, opt)
        if cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        step()
        ctx.sync()
        r = {"param_bytes": sum(nbytes(p) for p in model.parameters()),
             "grad_bytes": sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None),
             "state_bytes": state_bytes(opt)}
        r["static_bytes"] = r["param_bytes"] + r["grad_bytes"] + r["state_bytes"]
        r["allocated_bytes"] = allocated() - base if cuda else None
        r["peak_bytes"] = torch.cuda.max_memory_allocated(ctx.device) - base if cuda else None
        if name == "ddp":
            step()
            buckets_ = bucket_bytes(model)
        out[name] = r
        ctx.barrier()
        del model, opt, step

    def built(names):
        made = {name: stepper(*build(ctx, name, width, depth)) for name in names}
        for fn in made.values():
            for _ in range(warmup):
                fn()
        return made

    steps = built(n for n in strategies if n not in once)
    times = rounds_of(ctx, steps, iters, rounds) if steps else {}
    for name in (n for n in strategies if n in once):   # one round each, after the rounds
        times.update(rounds_of(ctx, built([name]), iters, 1))
    traced = {name: _traced_step(ctx, steps[name]) for name in ("ddp", "zero1", "fsdp") if name in steps}
    del steps
    gc.collect()
    return {"strategies": out, "step_rounds_s": times, "params": params,
            "adam_full_s": _adam_seconds(ctx, params, width, iters),
            "adam_shard_s": _adam_seconds(ctx, params // ctx.world, width, iters),
            "copy_s": _copy_seconds(ctx, params, iters),
            "ddp_bucket_bytes": buckets_, "traces": traced}


def _traced_step(ctx, step: Callable, keep: int = 0) -> dict:
    """One call of ``step`` profiled on rank 0 (every rank runs it): rank 0's
    :func:`perflab.distributed.traces.overlap_from_trace` summary without its intervals
    (``{}`` on the other ranks). ``comm_s`` is the time the step's collectives took *in* the
    step, where they share the rank's cores (a host) or SMs (a GPU) with the computation.

    Added to the summary: ``fsdp`` (:func:`perflab.distributed.traces.ranges_from_trace` of
    ``"FSDP::"``: the time inside FSDP2's hooks, its collectives and copies among them, and each
    range's count and total), ``optimizer_s`` (the optimizer's ``step``) and ``collectives``
    (``{"gloo:<op>": {"count", "seconds"}}``: each gloo collective's events, empty on NCCL),
    and ``arrival`` (:func:`perflab.distributed.traces.arrival_skew` of every rank's gloo
    collectives: every rank profiles the step alike, and each sends rank 0 its collectives'
    starts and ends on the host's clock)."""
    trace = rank0_trace(ctx, step, "sharding_trace", every_rank=True)
    starts = [None] * ctx.world
    ctx.dist.all_gather_object(starts, collective_starts(trace, ends=True))
    if ctx.rank != 0:
        return {}
    summary = overlap_from_trace(trace)
    summary["arrival"] = arrival_skew(starts) if ctx.world > 1 else None
    summary["comm"], summary["compute"] = summary["comm"][:keep], summary["compute"][:keep]
    summary["fsdp"] = ranges_from_trace(trace, "FSDP::")
    summary["optimizer_s"] = ranges_from_trace(trace, "Optimizer.step#")["seconds"]
    summary["collectives"] = ranges_from_trace(trace, "gloo:")["by_name"]
    return summary


def user_optimizer(ctx, fns: Sequence[str], width: int = 32, depth: int = 8, steps: int = 3,
                   lr: float = 1e-3) -> dict:
    """For each function name in ``fns`` (lab 8's ``user_code``), called as ``fn(params)`` to
    build the optimizer of a DDP model trained ``steps`` steps on this rank's slice of each
    global batch: ``{name: {"state_bytes": this rank's optimizer state (float32 model),
    "params": P, "kind": class, "rank_spread": largest difference of a parameter between any
    rank and rank 0, "vs_reference": largest difference (float64 model) from one process
    trained with plain Adam (``lr``) on every global batch, "settings": the optimizer's class
    and first parameter group's hyper-parameters (:func:`optimizer_settings`)}}``.

    Data parallelism keeps one model, and the right one: a sharded optimizer whose shards never
    reach the other ranks lets their copies drift apart (``rank_spread``); one that keeps them
    equal by copying rank 0's parameters, or that steps only part of them, trains the wrong model
    (``vs_reference``, float64 so that only a wrong update, never rounding, moves it)."""
    dev, f64 = ctx.device, torch.float64
    reference = make_mlp(width, depth, dev, dtype=f64)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=lr)
    for s in range(steps):
        ref_opt.zero_grad()
        mse(reference, *global_batch(ctx.world, s, 8, width, f64, None, dev)).backward()
        ref_opt.step()
    right = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])

    def train(name, dtype):
        model = ddp(ctx, make_mlp(width, depth, dev, dtype=dtype))
        opt = getattr(ctx.user, name)(model.parameters())
        for s in range(steps):
            opt.zero_grad()
            mse(model, *global_batch(ctx.world, s, 8, width, dtype, ctx.rank, dev)).backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]), opt

    out = {}
    for name in fns:
        flat, opt = train(name, torch.float32)
        ref = flat.clone()
        ctx.dist.broadcast(ref, src=0)
        exact, _ = train(name, f64)
        out[name] = {"state_bytes": state_bytes(opt), "params": flat.numel(), "kind": type(opt).__name__,
                     "rank_spread": ctx.max_over_ranks(float((flat - ref).abs().max())),
                     "vs_reference": ctx.max_over_ranks(float((exact - right).abs().max())),
                     "settings": optimizer_settings(opt)}
    return out


def optimizer_settings(opt) -> dict:
    """``{"class": the optimizer's class, or that of the one a ZeroRedundancyOptimizer wraps
    ("AdamW"), and lr, weight_decay, eps, betas, amsgrad of its first parameter group where it
    has them}``: what lab 8's check names when the ranks trained another model than Adam's."""
    inner = getattr(opt, "optim", opt)
    groups = getattr(inner, "param_groups", None)
    if not groups:             # not a torch optimizer (a student's own class): nothing to name
        return {}
    out = {"class": type(inner).__name__}
    for key in ("lr", "weight_decay", "eps", "amsgrad"):
        value = groups[0].get(key)
        if isinstance(value, (bool, int, float)):
            out[key] = value
    if isinstance(groups[0].get("betas"), (tuple, list)):
        out["betas"] = [float(b) for b in groups[0]["betas"]]
    return out


TASKS = {"sharding": sharding, "user_optimizer": user_optimizer}
