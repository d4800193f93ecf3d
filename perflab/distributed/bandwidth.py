"""What each collective computes, and how long it takes against message size (tasks run on every rank).

* ``collectives``: the six collectives of ``torch.distributed`` on tiny tensors, every rank's
  input and output;
* ``sweep``: the time of each collective at each message size, nccl-tests' way: ``S`` is the
  buffer all-reduced or broadcast, the all-gather's output, the reduce-scatter's input; the bus
  bandwidth is ``S / t`` times :func:`perflab.machine.interconnect.bus_factor`;
* ``ring``: one all-reduce timed on the first 2, 3, 4... ranks of the launch (subgroups) in
  interleaved rounds, so that the bus factor shows in one launch, with its spread.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from perflab.core.timing import seconds_per_call
from perflab.core.validate import integer
from perflab.machine.interconnect import bus_factor

__all__ = ["TASKS", "collectives", "ring", "sweep"]


def collectives(ctx, n: int = 4) -> dict:
    """The six collectives on tiny float tensors: ``{op: {"input": [...], "output": [...]}}`` for this rank.

    Rank r's input is ``[10 r, 10 r + 1, ...]`` (``n`` elements, rounded up to a multiple of the
    world size for reduce-scatter and all-to-all). Root of broadcast and reduce: rank 0.
    """
    torch, dist, w, r = ctx.torch, ctx.dist, ctx.world, ctx.rank
    n = -(-n // w) * w

    def mine():
        return torch.arange(n, dtype=torch.float32, device=ctx.device) + 10 * r

    out = {}
    x = mine()
    dist.broadcast(x, src=0)
    out["broadcast"] = (mine(), x)
    x = mine()
    dist.reduce(x, dst=0)  # only rank 0's buffer is defined afterwards
    out["reduce"] = (mine(), x if r == 0 else None)
    x = mine()
    dist.all_reduce(x)
    out["all_reduce"] = (mine(), x)
    y = torch.empty(n // w, device=ctx.device)
    dist.reduce_scatter_tensor(y, mine())
    out["reduce_scatter"] = (mine(), y)
    y = torch.empty(n * w, device=ctx.device)
    dist.all_gather_into_tensor(y, mine())
    out["all_gather"] = (mine(), y)
    y = torch.empty(n, device=ctx.device)
    dist.all_to_all_single(y, mine())
    out["all_to_all"] = (mine(), y)
    return {k: {"input": a.tolist(), "output": None if b is None else b.tolist()} for k, (a, b) in out.items()}


def sweep(ctx, sizes: Sequence[int], ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter"),
          target_bytes: int = 2**28, max_iters: int = 100, rounds: int = 1) -> dict:
    """Time each collective in ``ops`` at each size in ``sizes`` (bytes, nccl-tests' ``S``).

    Each size is timed ``rounds`` times (the whole sweep repeated), each time as the slowest
    rank's mean of ``max(3, min(max_iters, target_bytes // S))`` calls; ``seconds`` is the
    fastest round (the least disturbed by other work on a shared machine) and ``rounds_s`` every
    round's. Returns ``{op: [{"nbytes", "seconds", "rounds_s", "algbw", "busbw"}]}``.
    """
    torch, dist, w = ctx.torch, ctx.dist, ctx.world
    times: dict = {}
    for _ in range(max(1, int(rounds))):
        for op in ops:
            for s in sizes:
                numel = max(w, int(s) // 4 // w * w)
                full = torch.ones(numel, device=ctx.device)
                part = torch.ones(numel // w, device=ctx.device)
                src = torch.ones(numel, device=ctx.device) if op == "all_to_all" else None
                fn = {"all_reduce": lambda: dist.all_reduce(full),
                      "broadcast": lambda: dist.broadcast(full, src=0),
                      "reduce": lambda: dist.reduce(full, dst=0),
                      "all_gather": lambda: dist.all_gather_into_tensor(full, part),
                      "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
                      "all_to_all": lambda: dist.all_to_all_single(full, src),
                      }[op]
                iters = max(3, min(max_iters, target_bytes // (numel * 4)))
                times.setdefault((op, numel * 4), []).append(ctx.timed(fn, warmup=2, iters=iters))
                del full, part, src
    out: dict = {}
    for (op, nbytes), ts in times.items():
        algbw = nbytes / min(ts)
        out.setdefault(op, []).append({"nbytes": nbytes, "seconds": min(ts), "rounds_s": ts, "algbw": algbw,
                                       "busbw": algbw * bus_factor(op, w) if w > 1 else None})
    return out


def ring(ctx, nbytes: int = 2**22, sizes: Sequence[int] = (2, 3, 4), rounds: int = 5,
         iters: int = 10) -> dict:
    """The same all-reduce of ``nbytes`` on the first ``n`` ranks of the launch, for each ``n`` in
    ``sizes`` (a subgroup each; the other ranks wait on the default group meanwhile), timed in
    ``rounds`` interleaved rounds: every round times every ``n`` once, in an order that rotates
    from round to round (:func:`perflab.core.rounds.interleaved`'s rule), so that a drift of the
    host slows every ``n`` alike. Each timing is the slowest rank's mean of ``iters`` calls after
    two untimed. Returns on rank 0 ``{str(n): {"nbytes", "rounds_s" (one time per round, in
    round order), "seconds" (their median), "algbw", "busbw" (of the median)}}``.

    Raises:
        ValueError: a size above the launch's world size or below 2, or ``rounds`` below 1.
    """
    torch, dist = ctx.torch, ctx.dist
    sizes = [int(n) for n in sizes]
    if not all(2 <= n <= ctx.world for n in sizes):
        raise ValueError(f"sizes must lie between 2 and the world size {ctx.world}, got {sizes}")
    integer("rounds", rounds, 1)
    groups = {n: dist.new_group(list(range(n))) for n in sizes}   # every rank makes every group
    x = torch.ones(int(nbytes) // 4, device=ctx.device)
    flag = torch.zeros(1, device=ctx.device)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
            if ctx.rank < n:
                group = groups[n]
                for _ in range(2):
                    dist.all_reduce(x, group=group)
                dist.all_reduce(flag, group=group)
                ctx.sync()
                t = torch.tensor([seconds_per_call(lambda: dist.all_reduce(x, group=group), iters,
                                                   ctx.device)], dtype=torch.float64, device=ctx.device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                times[n].append(float(t.item()))
            ctx.barrier()
    out = {}
    for n, ts in times.items():
        if ctx.rank < n:
            med = statistics.median(ts)
            out[str(n)] = {"nbytes": x.numel() * 4, "rounds_s": ts, "seconds": med,
                           "algbw": x.numel() * 4 / med,
                           "busbw": x.numel() * 4 / med * bus_factor("all_reduce", n)}
    return out


TASKS = {"collectives": collectives, "ring": ring, "sweep": sweep}
