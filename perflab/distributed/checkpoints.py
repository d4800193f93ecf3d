"""Checkpoints of a distributed job: sharded (DCP) across world sizes, and a restart after a crash.

Tasks (run by :mod:`perflab.distributed.worker`):

* ``dcp_save``: an FSDP2 model (one Adam step taken) saved with the page's ``save_sharded``
  (``torch.distributed.checkpoint``); rank 0 also writes the full tensors beside it;
* ``dcp_load``: the checkpoint loaded with the page's ``load_sharded`` into an FSDP2 model on
  this launch's world size, which may differ from the one that saved it;
* ``train_ckpt``: DDP training that checkpoints every few steps, crashes one rank on the first
  attempt and resumes after ``torchrun --max-restarts``.

:func:`load_checkpoint_here` reads a ``dcp_save`` checkpoint in the notebook's own process (no
process group): DCP reassembles the shards into whole tensors.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from perflab.distributed.data_parallel import ddp
from perflab.distributed.sharded import load_sharded, save_sharded, shard_fsdp2
from perflab.distributed.workloads import global_batch, local, make_mlp, max_param_diff, mse

__all__ = ["TASKS", "dcp_load", "dcp_save", "load_checkpoint_here", "train_ckpt"]


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _shards(model) -> dict:
    return {k: list(local(v).shape) for k, v in get_model_state_dict(model).items()}


def dcp_save(ctx, width: int = 32, depth: int = 3, path: str | None = None) -> dict:
    """An FSDP2 model (seed 5, one Adam step taken) saved to ``path`` (default: the launch's
    scratch folder); rank 0 also writes the full tensors beside it (``reference.pt``) for the
    loads to compare with. Returns ``path``, the checkpoint's ``files`` and this rank's
    ``shards`` (their shapes)."""
    model = shard_fsdp2(make_mlp(width, depth, ctx.device, seed=5), ctx.device.type)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = global_batch(ctx.world, 0, 4, width, torch.float32, ctx.rank, ctx.device)
    mse(model, x, y).backward()
    opt.step()
    path = Path(path or ctx.scratch / "dcp")
    full = {k: _full(v).detach().cpu() for k, v in get_model_state_dict(model).items()}
    save_sharded(model, str(path))
    if ctx.rank == 0:
        torch.save(full, path / "reference.pt")
    ctx.barrier()
    return {"path": str(path), "files": sorted(p.name for p in path.iterdir()), "shards": _shards(model)}


def dcp_load(ctx, path: str, width: int = 32, depth: int = 3) -> dict:
    """Load the checkpoint at ``path`` into a freshly initialized (seed 99) FSDP2 model on this
    launch's world size: ``max_diff`` against the saved full tensors (0 when resharding
    worked), and this rank's ``shards``."""
    model = shard_fsdp2(make_mlp(width, depth, ctx.device, seed=99), ctx.device.type)
    load_sharded(model, path)
    ref = torch.load(Path(path) / "reference.pt")
    now = get_model_state_dict(model)
    diff = max(float((_full(now[k]).detach().cpu() - ref[k]).abs().max()) for k in ref)
    return {"max_diff": ctx.max_over_ranks(diff), "shards": _shards(model)}


def load_checkpoint_here(path: str | os.PathLike, width: int = 32, depth: int = 3) -> dict:
    """Read a checkpoint written by the ``dcp_save`` task into a plain model in *this* process
    (world size 1, no process group): DCP reassembles the shards into whole tensors.

    Returns:
        ``{"max_diff": largest difference from the saved full tensors (0.0 when exact),
        "shapes": {name: shape}}``.

    Raises:
        FileNotFoundError: ``path`` holds no checkpoint (no ``.metadata`` file).
    """
    path = Path(path)
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"no distributed checkpoint (.metadata) in {path}")
    model = make_mlp(width, depth, "cpu", seed=99)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # DCP warns that it runs without a process group: that is the point here
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    ref = torch.load(path / "reference.pt")
    now = model.state_dict()
    return {"max_diff": max(float((now[k] - ref[k]).abs().max()) for k in ref),
            "shapes": {k: list(v.shape) for k, v in now.items()}}


def train_ckpt(ctx, steps: int = 6, every: int = 2, fail_at: int = 3, width: int = 8, depth: int = 2,
               batch: int = 4, path: str | None = None) -> dict:
    """DDP training (float64, SGD with momentum) that saves a checkpoint every ``every`` steps
    (rank 0, ``torch.save``, atomic rename) and resumes from it on start. On the first attempt
    (``TORCHELASTIC_RESTART_COUNT == 0``) the last rank exits with status 1 before step
    ``fail_at`` (``fail_at < 0``: never). Returns ``restart_count``, ``resumed_from`` (the step
    loaded, or 0), ``losses`` (this attempt), ``steps`` and ``vs_single``: the largest parameter
    difference from one process trained on the same global batches without interruption."""
    dev, f64 = ctx.device, torch.float64
    path = Path(path or ctx.scratch / "train_ckpt.pt")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = ddp(ctx, make_mlp(width, depth, dev, dtype=f64))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if path.exists():
        ck = torch.load(path, map_location=dev)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
    losses = []
    for s in range(start, steps):
        if restart == 0 and s == fail_at and ctx.rank == ctx.world - 1:
            os._exit(1)  # a crash: no clean-up, no goodbye to the other ranks
        x, y = global_batch(ctx.world, s, batch, width, f64, ctx.rank, dev)
        opt.zero_grad()
        loss = mse(model, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if (s + 1) % every == 0:
            if ctx.rank == 0:
                tmp = path.with_suffix(".partial")
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": s + 1}, tmp)
                tmp.replace(path)
            ctx.barrier()
    single = make_mlp(width, depth, dev, dtype=f64)
    o = torch.optim.SGD(single.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        x, y = global_batch(ctx.world, s, batch, width, f64, None, dev)
        o.zero_grad()
        mse(single, x, y).backward()
        o.step()
    return {"restart_count": restart, "resumed_from": start, "losses": losses, "steps": steps,
            "vs_single": ctx.max_over_ranks(max_param_diff(single, model.module))}


TASKS = {"dcp_save": dcp_save, "dcp_load": dcp_load, "train_ckpt": train_ckpt}
