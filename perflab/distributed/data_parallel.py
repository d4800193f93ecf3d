"""Data parallelism measured on every rank: by hand against DDP, its overlap, its buckets, ``no_sync``.

Tasks (``task(ctx, **args) -> dict``, run by :mod:`perflab.distributed.worker`):

* ``manual_vs_ddp``: the page's hand-written gradient all-reduce against DDP (float64:
  parameters compared), then four Adam steps timed in interleaved rounds
  (:func:`perflab.core.rounds.interleaved`): one rank alone, the hand-written version, DDP,
  and DDP on a group of this rank alone (DDP's own cost over the plain step: its hooks, its
  copies into the buckets and back, a collective with no peer), with the backward's own time
  and DDP's buckets for the prediction;
* ``overlap``: DDP steps profiled one by one on rank 0, each summarized by
  :func:`perflab.distributed.traces.overlap_from_trace`;
* ``buckets``: DDP step time against ``bucket_cap_mb`` in interleaved rounds, the buckets DDP
  made, and the backward of the same model without DDP;
* ``no_sync``: accumulation with the page's ``accumulate`` against one process on every
  micro-batch (float64), then syncing every micro-step against ``no_sync``, interleaved;
* ``user_allreduce``: a student's all-reduce (lab 8) against DDP;
* ``user_sampler``: the indices a student's sampler (lab 8) deals each rank, epoch by epoch.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.profiler as tp
from torch.nn.parallel import DistributedDataParallel as DDP

from perflab.core.timing import Stopwatch
from perflab.core.rounds import interleaved
from perflab.distributed.steps import accumulate, allreduce_gradients
from perflab.distributed.traces import arrival_skew, collective_starts, overlap_from_trace
from perflab.distributed.workloads import (global_batch, make_blocks, make_mlp, max_param_diff, mse,
                                           timing_batch)
from perflab.speed.workload import fused_on_gpu

__all__ = ["TASKS", "all_reduce_count", "bucket_bytes", "buckets", "ddp", "diff_from_ddp", "manual_vs_ddp",
           "no_sync", "one_process_group", "overlap", "rank0_trace", "rounds_of", "user_allreduce", "user_sampler"]


#: the two host-cost steps :func:`buckets` times beside its caps (no cap is named so)
FEW_KEY, MANY_KEY = "fewest_buckets", "most_buckets"


def ddp(ctx, model, **kw) -> DDP:
    """``model`` wrapped in DDP on this rank's device (``device_ids`` on a GPU only)."""
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids, **kw)


@contextlib.contextmanager
def one_process_group(device: torch.device):
    """A process group of this one process (NCCL on a GPU, gloo on the CPU; an in-memory
    store, no port), destroyed on leaving: DDP inside it does all its own work (hooks, copies
    into its buckets and back, a collective) with no peer to wait for, which is DDP's own cost
    over a plain step. A notebook that already has a process group keeps it (nothing made).

    Raises:
        RuntimeError: the backend cannot start a group here.
    """
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    kw = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                            rank=0, world_size=1, **kw)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def bucket_bytes(model: DDP) -> list[int]:
    """The bytes of each bucket DDP made, read from DDP itself (after its first steps it
    rebuilds them in the order the gradients became ready)."""
    info = model._get_ddp_logging_data()
    found = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
    return [int(v) for v in found.split(",") if v.strip()]


def _median_over_ranks(ctx, values: Sequence[float]) -> float:
    return ctx.max_over_ranks(statistics.median(values))


def rounds_of(ctx, steps: dict, iters: int, rounds: int) -> dict[str, list[float]]:
    """Every step of ``steps`` timed in ``rounds`` interleaved rounds
    (:func:`perflab.core.rounds.interleaved`: the order rotates from round to round), each time
    the slowest rank's mean of ``iters`` calls after one untimed: ``{name: [seconds per
    round]}``. Every rank must pass the same names in the same order (the steps communicate)."""
    spreads = interleaved({k: (lambda fn=fn: ctx.timed(fn, 1, iters)) for k, fn in steps.items()},
                          rounds=rounds, warmup=0)
    return {k: list(s.values) for k, s in spreads.items()}


def diff_from_ddp(ctx, allreduce: Callable, width: int, depth: int, steps: int) -> float:
    """Train two float64 copies of a model for ``steps`` SGD steps on every rank's slice, one
    calling ``allreduce(model)`` after ``backward()``, one wrapped in DDP; the largest
    parameter difference between them over all ranks."""
    dev, f64 = ctx.device, torch.float64
    man = make_mlp(width, depth, dev, dtype=f64)
    wrapped = ddp(ctx, make_mlp(width, depth, dev, dtype=f64))
    o1 = torch.optim.SGD(man.parameters(), lr=0.1)
    o2 = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for s in range(steps):
        x, y = global_batch(ctx.world, s, 8, width, f64, ctx.rank, dev)
        o1.zero_grad()
        mse(man, x, y).backward()
        allreduce(man)
        o1.step()
        o2.zero_grad()
        mse(wrapped, x, y).backward()
        o2.step()
    return ctx.max_over_ranks(max_param_diff(man, wrapped.module))


def manual_vs_ddp(ctx, check_width: int = 16, check_depth: int = 3, check_steps: int = 3,
                  width: int = 64, depth: int = 4, batch: int = 32, warmup: int = 2, iters: int = 5,
                  rounds: int = 3, allow_tf32: bool = True, bucket_mb: float = 25.0,
                  replay: bool = False) -> dict:
    """(1) ``max_param_diff``: the page's ``allreduce_gradients`` against DDP (float64,
    ``check_steps`` SGD steps). (2) A ``depth`` x ``width`` float32 stack with ``batch`` rows per
    rank, four Adam steps (forward, backward, ``optimizer.step()``) built side by side:
    ``single`` (each rank alone, no communication), ``manual``, ``ddp``, and ``ddp_alone``
    (DDP on a group of this rank alone, ``dist.new_subgroups(1)``: DDP's own cost with nobody
    to wait for), both with buckets of ``bucket_mb`` MiB, warmed up ``warmup`` times, then
    timed in ``rounds`` interleaved rounds (each the slowest rank's mean of ``iters`` steps
    after one untimed).

    Returns ``{kind}_rounds_s`` (seconds per round), ``{kind}_s`` (their median),
    ``backward_s`` (the single step's backward alone, median of every timed
    call, the slowest rank's), ``ddp_bucket_bytes`` (DDP's buckets), ``allreduce_s`` (one
    all-reduce of every gradient as one buffer), ``params``, ``grad_bytes`` and
    ``flops_per_step`` (``6 x params x batch``). With ``replay``, a fifth step in the same
    rounds, ``buckets_alone``: all-reduces of tensors of the sizes of DDP's buckets, issued
    asynchronously one after another as DDP's hooks issue them, then waited for, with no
    backward beside them: what DDP's communication costs these ranks as DDP issues it, without
    the backward on their cores (``buckets_alone_rounds_s``)."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    res = {"max_param_diff": diff_from_ddp(ctx, allreduce_gradients, check_width, check_depth, check_steps),
           "check_steps": check_steps}
    x, y = timing_batch(ctx.rank, batch, (width,), ctx.device)
    backward: list[float] = []
    alone, _ = ctx.dist.new_subgroups(1)   # every rank a group of its own

    def make(kind):
        model = make_mlp(width, depth, ctx.device)
        net = {"ddp": lambda: ddp(ctx, model, bucket_cap_mb=bucket_mb),
               "ddp_alone": lambda: ddp(ctx, model, process_group=alone, bucket_cap_mb=bucket_mb)
               }.get(kind, lambda: model)()
        # fused on GPUs: the Adam (28 bytes a parameter) the page's GPU model counts
        opt = torch.optim.Adam(net.parameters(), lr=1e-4, fused=fused_on_gpu(ctx.device))

        def step():
            opt.zero_grad(set_to_none=False)
            loss = mse(net, x, y)
            if kind == "single":
                with Stopwatch(ctx.device) as sw:
                    loss.backward()
                backward.append(sw.seconds)
            else:
                loss.backward()
            if kind == "manual":
                allreduce_gradients(net)
            opt.step()

        return step, net

    steps, nets = {}, {}
    for kind in ("single", "manual", "ddp", "ddp_alone"):
        steps[kind], nets[kind] = make(kind)
        for _ in range(warmup):
            steps[kind]()
    if replay:
        for _ in range(max(0, 3 - warmup)):   # DDP logs its rebuilt buckets from the third
            steps["ddp"]()
        sent = [torch.zeros(b // 4, device=ctx.device) for b in bucket_bytes(nets["ddp"])]
        if not sent:
            raise RuntimeError("manual_vs_ddp(replay=True): DDP logged no buckets to replay")

        def buckets_alone():
            for w in [ctx.dist.all_reduce(t, async_op=True) for t in sent]:
                w.wait()

        steps["buckets_alone"] = buckets_alone
        for _ in range(warmup):
            buckets_alone()
    backward.clear()
    for kind, ts in rounds_of(ctx, steps, iters, rounds).items():
        res[f"{kind}_rounds_s"] = ts
        res[f"{kind}_s"] = statistics.median(ts)
    res["backward_s"] = _median_over_ranks(ctx, backward)
    res["ddp_bucket_bytes"] = bucket_bytes(nets["ddp"])
    params = sum(p.numel() for p in nets["single"].parameters())
    del steps, nets
    flat = torch.zeros(params, device=ctx.device)
    res["allreduce_s"] = ctx.timed(lambda: ctx.dist.all_reduce(flat), warmup, iters)
    res.update(params=params, grad_bytes=4 * params, flops_per_step=6 * params * batch)
    return res


def overlap(ctx, width: int = 64, depth: int = 4, batch: int = 32, bucket_mb: float = 25.0,
            steps: int = 5, warmup: int = 3, keep: int = 400) -> dict:
    """``steps`` DDP steps profiled one by one on every rank alike (``torch.profiler``, forward
    and backward only: the optimizer's step runs after each trace), each rank's trace summarized
    by :func:`perflab.distributed.traces.overlap_from_trace`, with ``backward_s`` added on CPU
    ranks (the span of the backward's operators). Returns, on rank 0, ``{"steps": [for each
    step, the summary of the rank that waited longest after its backward (its ``exposed_s``),
    with "rank" and "exposed_by_rank"], "bucket_bytes": DDP's buckets}`` (``"steps"`` empty on
    the other ranks); the intervals of each summary are cut to ``keep``. Profiling every rank
    slows them alike: a profiler on rank 0 alone would make the others wait for it.

    The rank that waited longest is the one whose backward ended earliest: its collectives
    cannot end before the last rank's buckets arrive (review of run 439fc20, finding 4). So
    each step's summary also holds, on the host's clock shared by the ranks' traces,
    ``lag_s`` (the latest backward's end among the ranks minus this rank's),
    ``latest_backward_s`` (that latest rank's backward) and ``arrival``
    (:func:`perflab.distributed.traces.arrival_skew` of every rank's gloo collectives; a count
    of 0 on NCCL, whose collectives are kernels)."""
    x, y = timing_batch(ctx.rank, batch, (width,), ctx.device)
    model = ddp(ctx, make_mlp(width, depth, ctx.device), bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(warmup):
        opt.zero_grad(set_to_none=False)
        mse(model, x, y).backward()
        opt.step()
    summaries = []
    for k in range(steps):
        opt.zero_grad(set_to_none=False)
        trace = rank0_trace(ctx, lambda: mse(model, x, y).backward(), f"ddp_trace_{k}",
                            every_rank=True)
        s = overlap_from_trace(trace)
        if s["source"] == "cpu ops" and s["compute"]:
            s["backward_s"] = s["compute"][-1][1] - s["compute"][0][0]
        s["comm"], s["compute"], s["rank"] = s["comm"][:keep], s["compute"][:keep], ctx.rank
        s["starts"] = collective_starts(trace, ends=True)
        every = [None] * ctx.world
        ctx.dist.all_gather_object(every, s)
        if ctx.rank == 0:
            slowest = dict(max(every, key=lambda r: r["exposed_s"]))
            ends = [r["t0_host_s"] + r["compute_end_s"] for r in every]
            latest = every[max(range(ctx.world), key=ends.__getitem__)]
            slowest.update(exposed_by_rank=[r["exposed_s"] for r in every],
                           lag_s=max(ends) - ends[slowest["rank"]],
                           latest_backward_s=latest.get("backward_s"),
                           arrival=arrival_skew([r.pop("starts") for r in every])
                           if ctx.world > 1 else None)
            slowest.pop("starts", None)
            summaries.append(slowest)
        opt.step()
    return {"steps": summaries, "bucket_bytes": bucket_bytes(model)}


def buckets(ctx, bucket_mbs: Sequence[float], blocks: Sequence[int] = (2, 64, 16), batch: int = 2,
            warmup: int = 2, iters: int = 2, rounds: int = 3, launch_cost: bool = False) -> dict:
    """DDP step seconds against ``bucket_cap_mb`` (MiB) on a stack of transformer blocks
    (``blocks = (layers, width, sequence length)``, :func:`perflab.distributed.workloads.make_blocks`),
    every cap a DDP model of its own built side by side from one seed, warmed up (DDP rebuilds its
    buckets after the first step, and reports them from the third), then timed in ``rounds``
    interleaved rounds.

    Returns ``step_rounds_s`` (``{cap: [seconds per round]}``, caps as text), ``bucket_bytes``
    (``{cap: [bytes of each bucket DDP made]}``), ``backward_s`` (the backward of the same model
    without DDP, median of ``rounds x iters`` timings, the slowest rank's), ``tensor_bytes``
    (every parameter's bytes, in reverse order of registration), ``grad_bytes``,
    ``largest_param_bytes`` and ``params``; with ``launch_cost``, what one more bucket costs
    gloo beside the backward, timed in the same rounds without DDP: ``launch_rounds_s`` (per
    round, the backward of the same model without DDP with async all-reduces of the sizes of
    the buckets of the cap with the most buckets in flight, minus the same with the sizes of the
    cap with the fewest, the same bytes, over the difference of their counts, ``launches``:
    ``[most, fewest]``): the per-bucket term of the start-up model, paid on the cores the
    backward computes on, with its copies and hooks left out (DDP's own).

    Raises:
        ValueError: ``launch_cost`` with caps that all make the same number of buckets (the
            difference would time nothing)."""
    n_layer, width, seq = blocks
    x, y = timing_batch(ctx.rank, batch, (seq, width), ctx.device)
    steps, nets = {}, {}
    for mb in bucket_mbs:
        key = str(float(mb))
        net = ddp(ctx, make_blocks(n_layer, width, ctx.device), bucket_cap_mb=float(mb))
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)

        def step(net=net, opt=opt):
            opt.zero_grad(set_to_none=False)
            mse(net, x, y).backward()
            opt.step()

        steps[key], nets[key] = step, net
        for _ in range(max(warmup, 3 if launch_cost else 2)):  # its log: rebuilt at the third
            step()
    plain = make_blocks(n_layer, width, ctx.device)
    counts = {k: len(bucket_bytes(n)) for k, n in nets.items()}
    many, few = max(counts, key=counts.get), min(counts, key=counts.get)
    if launch_cost and counts[many] == counts[few]:
        raise ValueError(f"buckets: launch_cost needs two caps that make different numbers of "
                         f"buckets, and bucket_mbs={list(bucket_mbs)} all made {counts[many]}")
    # the buckets of the caps with the most and the fewest, as plain tensors of their sizes
    sent = {k: [torch.zeros(b // 4, device=ctx.device) for b in bucket_bytes(nets[k])]
            for k in ((many, few) if launch_cost else ())}

    def plain_step(tensors: list) -> None:
        pending = [ctx.dist.all_reduce(t, async_op=True) for t in tensors]
        mse(plain, x, y).backward()
        for w in pending:
            w.wait()
        plain.zero_grad(set_to_none=False)

    if launch_cost:
        steps[FEW_KEY] = lambda: plain_step(sent[few])
        steps[MANY_KEY] = lambda: plain_step(sent[many])
    times = rounds_of(ctx, steps, iters, rounds)
    extra = counts[many] - counts[few]
    launch_rounds = [(m - f) / extra for m, f in zip(times.pop(MANY_KEY, []),
                                                     times.pop(FEW_KEY, []))]
    backward = []
    for _ in range(warmup + rounds * iters):
        loss = mse(plain, x, y)
        with Stopwatch(ctx.device) as sw:
            loss.backward()
        backward.append(sw.seconds)
        plain.zero_grad(set_to_none=False)
    tensors = [p.numel() * p.element_size() for p in plain.parameters()]
    launch = {"launch_rounds_s": launch_rounds, "launches": [counts[many], counts[few]]}
    return {**(launch if launch_cost else {}), "step_rounds_s": times,
            "bucket_bytes": {k: bucket_bytes(n) for k, n in nets.items()},
            "backward_s": _median_over_ranks(ctx, backward[warmup:]), "tensor_bytes": tensors[::-1],
            "grad_bytes": sum(tensors), "largest_param_bytes": max(tensors),
            "params": sum(p.numel() for p in plain.parameters())}


def no_sync(ctx, width: int = 16, depth: int = 3, batch: int = 4, accum: int = 4, time_width: int = 0,
            time_depth: int = 4, time_batch: int = 32, warmup: int = 1, iters: int = 2,
            rounds: int = 3, bucket_mb: float = 25.0) -> dict:
    """Accumulation over ``accum`` micro-batches with the page's ``accumulate`` (float64):
    ``rank_spread`` (largest gradient difference between ranks), ``vs_single`` (against one
    process on all ``world x accum`` micro-batches). With ``time_width`` > 0 also ``accum``
    micro-steps of a float32 model (DDP's buckets of ``bucket_mb`` MiB) synced after every
    micro-batch against ``no_sync``, and the same ``accum`` micro-steps of a plain copy of the
    model (no DDP: what a micro-step costs with nothing to sync, the prediction's other term),
    timed in the same interleaved rounds: ``sync_every_rounds_s``, ``no_sync_rounds_s``,
    ``plain_rounds_s``; and one call of the first two
    traced on rank 0, its all-reduces counted (:func:`all_reduce_count`): ``all_reduces``
    (``{"sync_every": n, "no_sync": n}``, ``None`` on the other ranks), with ``buckets``, the
    number of DDP's buckets (each sync all-reduces every bucket once)."""
    dev, f64 = ctx.device, torch.float64
    wrapped = ddp(ctx, make_mlp(width, depth, dev, dtype=f64))
    micro = [global_batch(ctx.world, m, batch, width, f64, ctx.rank, dev) for m in range(accum)]
    accumulate(wrapped, micro, mse)
    g = torch.cat([p.grad.flatten() for p in wrapped.parameters()])
    gathered = [torch.empty_like(g) for _ in range(ctx.world)]
    ctx.dist.all_gather(gathered, g)
    spread = max(float((a - g).abs().max()) for a in gathered)
    single = make_mlp(width, depth, dev, dtype=f64)
    total = sum(mse(single, *global_batch(ctx.world, m, batch, width, f64, None, dev)) for m in range(accum))
    (total / accum).backward()
    gs = torch.cat([p.grad.flatten() for p in single.parameters()])
    res = {"rank_spread": ctx.max_over_ranks(spread), "vs_single": ctx.max_over_ranks(float((gs - g).abs().max())),
           "accum": accum}
    if time_width:
        model = ddp(ctx, make_mlp(time_width, time_depth, dev), bucket_cap_mb=bucket_mb)
        plain = make_mlp(time_width, time_depth, dev)
        batches = [timing_batch(ctx.rank, time_batch, (time_width,), dev)] * accum

        def micro_steps(net):
            for x, y in batches:
                (mse(net, x, y) / accum).backward()

        steps = {"sync_every": lambda: micro_steps(model),
                 "no_sync": lambda: accumulate(model, batches, mse),
                 "plain": lambda: micro_steps(plain)}
        for fn in steps.values():
            for _ in range(warmup):
                fn()
        res.update({f"{k}_rounds_s": v for k, v in rounds_of(ctx, steps, iters, rounds).items()})
        res["all_reduces"] = {k: all_reduce_count(ctx, steps[k]) for k in ("sync_every", "no_sync")}
        res["buckets"] = len(bucket_bytes(model))
    return res


def rank0_trace(ctx, fn: Callable[[], None], name: str, every_rank: bool = False) -> dict | None:
    """One call of ``fn`` on every rank after a barrier, profiled with ``torch.profiler`` on rank
    0 only (CPU activity, and CUDA's on a GPU) up to ``ctx.sync()``: rank 0's Chrome trace as a
    dict (written to ``ctx.scratch / f"{name}.json"`` and removed), ``None`` on the other ranks.
    ``every_rank``: every rank profiles its call alike and gets its own trace."""
    acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    mine = every_rank or ctx.rank == 0
    ctx.barrier()
    with tp.profile(activities=acts) if mine else contextlib.nullcontext() as prof:
        fn()
        ctx.sync()
    if not mine:
        return None
    path = ctx.scratch / f"{name}_rank{ctx.rank}.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    path.unlink()
    return trace


def all_reduce_count(ctx, fn: Callable[[], None]) -> int | None:
    """How many all-reduces one call of ``fn`` ran, counted in a ``torch.profiler`` trace of it
    on rank 0 (every rank calls ``fn``, :func:`rank0_trace`): gloo's ``gloo:all_reduce`` events,
    or NCCL's all-reduce kernels. ``None`` on the other ranks."""
    trace = rank0_trace(ctx, fn, "all_reduce_count")
    if trace is None:
        return None
    ops = overlap_from_trace(trace)["comm_ops"]
    return sum(v for k, v in ops.items() if "allreduce" in k.lower().replace("_", ""))


def user_allreduce(ctx, fns: Sequence[str], width: int = 16, depth: int = 3, steps: int = 3) -> dict:
    """For each function name in ``fns`` (from the launch's ``user_code``), called as
    ``fn(model)`` after ``backward()``: ``{name: largest parameter difference from DDP}`` after
    ``steps`` SGD steps (float64). A function that raises fails the launch. ``ReduceOp.AVG``
    works on NCCL and, from PyTorch 2.8, on gloo: nothing is patched."""
    return {name: diff_from_ddp(ctx, getattr(ctx.user, name), width, depth, steps) for name in fns}


def user_sampler(ctx, fns: Sequence[str], n: int = 64, epochs: int = 2) -> dict:
    """For each function name in ``fns`` (lab 8's ``user_code``), called on every rank as
    ``fn(n, rank, world, epoch)`` for the indices of a dataset of ``n`` samples that this rank
    reads in ``epoch``: ``{name: {"per_rank": [[indices of rank r in epoch e for r] for e]}}``,
    gathered from every rank (``all_gather_object``), so the check sees what each rank read."""
    out = {}
    for name in fns:
        fn = getattr(ctx.user, name)
        epochs_seen = []
        for epoch in range(epochs):
            mine = [int(i) for i in fn(n, ctx.rank, ctx.world, epoch)]
            every = [None] * ctx.world
            ctx.dist.all_gather_object(every, mine)
            epochs_seen.append(every)
        out[name] = {"per_rank": epochs_seen, "n": n}
    return out


TASKS = {"manual_vs_ddp": manual_vs_ddp, "overlap": overlap, "buckets": buckets, "no_sync": no_sync,
         "user_allreduce": user_allreduce, "user_sampler": user_sampler}
