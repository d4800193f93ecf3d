"""How distributed jobs fail, made to happen on purpose (tasks run on every rank).

* ``hang``: one rank never calls a collective the others wait in; a process-group timeout ends
  the wait. Every rank prints the last entry of its **flight recorder** (the ring buffer of the
  collectives it issued) before it waits or sleeps, so the records can be read side by side.
* ``die``: one rank exits at once.
* ``traps``: three disagreements caught inside a job that goes on: tensors of the same bytes
  but different shapes (no check: the collective succeeds), tensors of different sizes under
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (an error naming both sides), and a rank that reaches a
  ``monitored_barrier`` too late (an error naming it).

The settings for a job meant to fail are :data:`FAIL_FAST_ENV`; the lines the ranks print start
with the markers below, read by :mod:`perflab.distributed.launch`.
"""

from __future__ import annotations

import datetime
import json
import os
import time

import torch
import torch.distributed as dist

from perflab.core.timing import timestamp

__all__ = ["ENV_MARKER", "FAIL_FAST_ENV", "RECORD_MARKER", "TASKS", "WAIT_MARKER", "die", "hang",
           "last_record", "traps"]

# Environment for a job that is meant to fail (torch 2.11 meanings, ProcessGroupNCCL.hpp and
# https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html):
# TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the default: on a watchdog error the process is torn down
# without first aborting the communicator (1 aborts it first: a call that can itself wait on
# the hung peer). TORCH_NCCL_DUMP_ON_TIMEOUT=0: no flight-recorder dump, whose wait
# (TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC) can come before the error: the 2 x H200 run of
# 30 November without it ended 80 s after launch with a 10 s timeout.
# TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN=0: no C++ stack symbolized on the way out.
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT=2: torchrun's grace between SIGTERM and SIGKILL for the other
# ranks (torch >= 2.12, also --shutdown-timeout; 30 s fixed before, and unknown variables are
# ignored). TORCH_NCCL_ENABLE_MONITORING=0 turns off the heartbeat-monitor thread, which on a
# watchdog error waits for debug information before it terminates the process
# (pytorch/pytorch#112518, #133028). TORCH_FR_BUFFER_SIZE: entries the flight recorder keeps
# (NCCL and, from torch 2.8, gloo). gloo reads none of the NCCL ones.
FAIL_FAST_ENV = {
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN": "0",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2",
    "TORCH_FR_BUFFER_SIZE": "2000",
}

#: "<marker> <rank> <unix time>": a rank of ``hang`` starts to wait
WAIT_MARKER = "perflab-hang-wait-starts"
#: "<marker> <JSON>": the :data:`FAIL_FAST_ENV` variables as a waiting rank sees them
ENV_MARKER = "perflab-hang-env"
#: "<marker> <JSON>": a rank's last flight-recorder entry on the hung group
RECORD_MARKER = "perflab-flight-record"


def _fr_entries() -> list[dict]:
    """This process's flight-recorder entries (torch's JSON dump), [] where none are kept."""
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return []
    try:
        return json.loads(dump()).get("entries", []) or []
    except (RuntimeError, ValueError, TypeError):
        return []


def last_record(group_name: str) -> dict | None:
    """The last collective this rank issued on the process group named ``group_name``, from
    its flight recorder: ``{"op", "seq", "sizes"}``, or None when it kept no entry for it."""
    mine = [e for e in _fr_entries() if str(group_name) in [str(x) for x in e.get("process_group", [])]]
    if not mine:
        return None
    last = max(mine, key=lambda e: e.get("collective_seq_id", 0))
    return {"op": last.get("profiling_name"), "seq": last.get("collective_seq_id"),
            "sizes": last.get("input_sizes")}


def _print_record(ctx, group) -> None:
    name = dist.distributed_c10d._get_process_group_name(group)
    print(f"{RECORD_MARKER} {json.dumps({'rank': ctx.rank, 'last': last_record(name)})}", flush=True)


def hang(ctx, hang_rank: int = -1, sleep_s: float = 600, timeout_s: float | None = None) -> dict:
    """Rank ``hang_rank`` (default the last) sleeps ``sleep_s`` instead of joining an all-reduce;
    the others wait in it until a timeout ends them: ``timeout_s`` seconds on a process group made
    for the purpose (``dist.new_group(timeout=...)``, after every rank has joined it once, so a
    slow start cannot trip it), or the launch's process-group timeout when ``timeout_s`` is None.
    Every rank prints its flight record of that group (``RECORD_MARKER``) before it waits or
    sleeps; each waiting rank also prints ``ENV_MARKER <JSON>`` (its :data:`FAIL_FAST_ENV`
    variables) and ``WAIT_MARKER <rank> <Unix time>`` as it enters the hung all-reduce."""
    r = hang_rank % ctx.world
    group = None
    if timeout_s is not None:
        group = dist.new_group(ranks=list(range(ctx.world)), timeout=datetime.timedelta(seconds=float(timeout_s)))
    x = torch.ones(4, device=ctx.device)
    dist.all_reduce(x, group=group)  # every rank has joined the group
    ctx.sync()
    if ctx.rank == r:
        _print_record(ctx, group or dist.group.WORLD)
        time.sleep(sleep_s)
    else:
        seen = {k: os.environ.get(k) for k in FAIL_FAST_ENV}
        print(f"{ENV_MARKER} {json.dumps(seen)}", flush=True)
        work = dist.all_reduce(x, group=group, async_op=True)  # issued: the recorder has it
        _print_record(ctx, group or dist.group.WORLD)
        print(f"{WAIT_MARKER} {ctx.rank} {timestamp():.3f}", flush=True)
        work.wait()
        ctx.sync()
        x.sum().item()
    return {"finished": True}


def die(ctx, die_rank: int = -1, status: int = 3) -> dict:
    """Rank ``die_rank`` (default the last) exits at once with ``status``; the others all-reduce."""
    if ctx.rank == die_rank % ctx.world:
        os._exit(status)
    x = torch.ones(4, device=ctx.device)
    dist.all_reduce(x)
    ctx.sync()
    return {"finished": True}


def _caught(fn) -> str | None:
    """None when ``fn()`` ran, else the first line of the error it raised."""
    try:
        fn()
    except RuntimeError as e:  # what torch.distributed raises for all three traps
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def traps(ctx, timeout_s: float = 2.0) -> dict:
    """Three disagreements between ranks, each caught in this task (module docstring).

    ``same_bytes``: rank 0 all-reduces a 2 x 2 tensor, the others 4-vectors (no check on gloo:
    it runs): this rank's ``shape``, ``output`` and ``error`` (None). ``detail``: on a group made
    under ``DebugLevel.DETAIL``, the last rank all-reduces 5 elements, the others 4: ``error``,
    the check's message. ``monitored``: the last rank reaches a ``monitored_barrier`` of
    ``timeout_s`` seconds ``1.5 x timeout_s`` late: ``error``, rank 0's names it (the other
    ranks time out too). The ranks meet on the default group after each trap. The gloo groups
    made here serve NCCL jobs too (a ``monitored_barrier`` needs gloo)."""
    out = {}
    last = ctx.world - 1
    x = torch.ones(2, 2) if ctx.rank == 0 else torch.arange(4.0)
    err = _caught(lambda: dist.all_reduce(x, group=dist.new_group(backend="gloo")))
    out["same_bytes"] = {"shape": list(x.shape), "output": x.flatten().tolist(), "error": err}
    ctx.barrier()
    level = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        checked = dist.new_group(backend="gloo")
    finally:
        dist.set_debug_level(level)
    y = torch.ones(5 if ctx.rank == last else 4)
    out["detail"] = {"error": _caught(lambda: dist.all_reduce(y, group=checked))}
    ctx.barrier()
    monitored = dist.new_group(backend="gloo")
    if ctx.rank == last:
        time.sleep(1.5 * timeout_s)
    out["monitored"] = {"error": _caught(lambda: dist.monitored_barrier(
        group=monitored, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True))}
    ctx.barrier()
    return out


TASKS = {"hang": hang, "die": die, "traps": traps}
