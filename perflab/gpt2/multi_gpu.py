"""GPT-2 on several GPUs: chapter 10's rungs as tasks of chapter 8's launcher.

Chapter 10's multi-GPU section launches these with :func:`perflab.distributed.launch.launch` by
their dotted names (``{"name": "perflab.gpt2.multi_gpu:ddp_run", ...}``), so that the launcher
of chapter 8 never imports chapter 10. Each runs on every rank with the worker's context
(``ctx``: device, rank, world size, ``timed``, ``max_over_ranks``).
"""

from __future__ import annotations

import statistics

import torch

from perflab.distributed.data_parallel import rounds_of
from perflab.gpt2 import model as gpt2_model
from perflab.gpt2 import steps as gpt2_steps
from perflab.gpt2.rungs import rung_from_dict
from perflab.gpt2.train import batches, distributed_task, token_ids

__all__ = ["ddp_run", "interleaved"]


def ddp_run(ctx, rung: dict, steps: int, warmup: int = 2, tokens: str | None = None,
            n_tokens: int = 4_000_000, id_range: int = 8192, fsdp: bool = False) -> dict:
    """Chapter 10's GPT-2 rung under DDP (or FSDP2), every rank on its own windows
    (:func:`perflab.gpt2.train.distributed_task`)."""
    return distributed_task(ctx, rung, steps, warmup=warmup, tokens=tokens, n_tokens=n_tokens,
                                   id_range=id_range, fsdp=fsdp)


def interleaved(ctx, rung: dict, steps: int = 10, rounds: int = 4, warmup: int = 2,
                tokens: str | None = None, n_tokens: int = 4_000_000, id_range: int = 8192) -> dict:
    """Chapter 10's GPT-2 rung under DDP and alone on every rank, timed in interleaved rounds.

    Each rank builds the rung twice from the same initial weights with the page's step
    (:mod:`perflab.gpt2.steps`): once wrapped in DDP, once alone (no communication: every GPU
    runs the one-GPU reference at the same time, so both see the same clocks and power), both
    reading this rank's windows. After ``warmup`` steps of each (compilation), the two are timed
    in ``rounds`` alternating rounds of ``steps`` steps (each round's time is the slowest rank's
    mean). Returns ``{"times": {"one GPU": [...], "DDP": [...]}, "median_s",
    "efficiency" (median one-GPU step / median DDP step), "world_size", "tokens_per_step"}``.
    """
    r = rung_from_dict(rung)
    ids = token_ids(tokens, n_tokens, id_range)
    dev_ids = [ctx.device.index] if ctx.device.type == "cuda" else None

    def build(wrap):
        torch.manual_seed(0)
        model = gpt2_model.GPT(r.config()).to(ctx.device)
        net = gpt2_steps.make_net(model, r, wrap)
        opt = gpt2_steps.make_optimizer(model, r)
        stream = batches(ids, r.batch, r.seq_len, rank=ctx.rank, world=ctx.world)
        return gpt2_steps.make_step(net, opt, r, stream, ctx.device)

    ddp = torch.nn.parallel.DistributedDataParallel
    steps_by = {"one GPU": build(None), "DDP": build(lambda m: ddp(m, device_ids=dev_ids))}
    for step in steps_by.values():
        for _ in range(warmup):
            step()
    times = rounds_of(ctx, steps_by, steps, rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"times": times, "median_s": med,
            "efficiency": med["one GPU"] / med["DDP"], "world_size": ctx.world,
            "tokens_per_step": r.tokens_per_step}
