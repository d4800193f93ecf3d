"""The process side of a launch: what every rank runs under ``torchrun``.

``python -m perflab.distributed.worker --backend gloo --out-dir DIR --spec SPEC`` is started by
:func:`perflab.distributed.launch.launch` on every rank. The rank takes its device from its
backend alone (:func:`perflab.core.torchrun.worker_device`: the CPU for gloo, ``cuda:<local
rank>`` for NCCL), joins the process group, runs the tasks of the spec in order, writes its
results as JSON (``rank<r>.json``) and always destroys its process group.

A task is a function ``task(ctx, **args) -> dict`` of JSON values. Chapter 8's tasks are named
by their short names (:data:`TASK_MODULES`); any other module's task by ``"package.module:function"``
(chapter 10's GPT-2 tasks: ``"perflab.gpt2.multi_gpu:ddp_run"``), imported by the worker when a
spec names it, so this package never imports a later chapter's. Chapter 8's task modules are
imported the same way, only those whose tasks the spec names: a launch of collectives and DDP
steps loads neither ZeRO's optimizer nor FSDP2 nor DCP. A rank that finished every task leaves
without the interpreter's teardown (:func:`leave`).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn

import torch
import torch.distributed as dist

from perflab.core import torchrun
from perflab.core.timing import Stopwatch, seconds_per_call, timestamp

__all__ = ["Ctx", "FINISHED", "TASK_MODULES", "leave", "pin_new_threads", "pin_rank", "rank_cpus",
           "split_slice", "task_function"]

#: chapter 8's tasks by short name: the module whose ``TASKS`` holds each, imported when a spec
#: names one of its tasks. Importing all five costs every rank the CPU time of modules that a
#: launch of collectives and DDP steps never uses: ``torch.distributed.optim`` (ZeRO-1) and
#: FSDP2's and DCP's (commit 4137841 gives the seconds)
_TASK_HOMES = {"perflab.distributed.bandwidth": ("collectives", "ring", "sweep"),
               "perflab.distributed.data_parallel": ("manual_vs_ddp", "overlap", "buckets", "no_sync",
                                                     "user_allreduce", "user_sampler"),
               "perflab.distributed.sharding": ("sharding", "user_optimizer"),
               "perflab.distributed.checkpoints": ("dcp_save", "dcp_load", "train_ckpt"),
               "perflab.distributed.failures": ("hang", "die", "traps")}
TASK_MODULES: dict[str, str] = {task: home for home, tasks in _TASK_HOMES.items() for task in tasks}


def task_function(name: str) -> Callable:
    """The task called ``name``: a short name of :data:`TASK_MODULES` (its module imported now,
    if it was not), or ``"package.module:function"``.

    Raises:
        ValueError: an unknown short name, a malformed dotted name, or a module without that
            function (the module is imported to find out).
    """
    if not isinstance(name, str):
        raise ValueError(f"a task name must be a string, got {name!r}")
    if ":" not in name:
        if name not in TASK_MODULES:
            raise ValueError(f"unknown task {name!r}; tasks are {sorted(TASK_MODULES)} or "
                             "'module:function'")
        return importlib.import_module(TASK_MODULES[name]).TASKS[name]
    module, _, fn = name.partition(":")
    if not module or not fn.isidentifier():
        raise ValueError(f"a task outside chapter 8 is named 'package.module:function', got {name!r}")
    found = getattr(importlib.import_module(module), fn, None)
    if not callable(found):
        raise ValueError(f"unknown task {name!r}: {module} has no function {fn!r}")
    return found


class Ctx:
    """What every task gets: ``torch``, ``dist``, its ``device``, ``rank``, ``world`` size, a
    ``scratch`` folder shared by the ranks of the launch, and ``user`` (the module made of the
    launch's ``user_code``, or None)."""

    def __init__(self, device: torch.device, scratch: str | os.PathLike, user=None):
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.scratch, self.user = Path(scratch), user

    def sync(self) -> None:
        """Wait for this rank's device (a no-op on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """All ranks meet: an all-reduce of one element (works on every backend), then a sync."""
        flag = torch.zeros(1, device=self.device)
        dist.all_reduce(flag)
        self.sync()

    def max_over_ranks(self, value: float) -> float:
        """The largest of every rank's ``value``."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def timed(self, step: Callable, warmup: int, iters: int) -> float:
        """Mean seconds per call of ``step`` over ``iters`` calls after ``warmup`` calls and a
        barrier: the slowest rank's (a step of data parallelism lasts as long as its slowest rank)."""
        for _ in range(warmup):
            step()
        self.barrier()
        return self.max_over_ranks(seconds_per_call(step, iters, self.device))


#: the file ending of a rank's record of the tasks it has finished so far (``rank<r>`` before it)
FINISHED = ".finished.json"


def _write_json(path: Path, value) -> None:
    """Write ``value`` as JSON to ``path`` whole or not at all (a reader never sees half)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def _user_module(path: str | None):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("perflab_user_code", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _store(timeout: datetime.timedelta):
    """The rendezvous store of this attempt. torchrun keeps its key-value store across
    ``--max-restarts``: a restarted group that used the same keys would read the dead attempt's
    addresses (gloo: "connectFullMesh failed ... Connection refused"), so every attempt gets its
    own key prefix. The store waits for late ranks (imports on a busy machine) at least 5 minutes,
    whatever the collectives' timeout."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_store,
                          timeout=max(timeout, datetime.timedelta(minutes=5)))
    return dist.PrefixStore(f"perflab-attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def rank_cpus(allowed, local_rank: int, local_world: int, threads: int | None) -> list[int] | None:
    """The cores a gloo rank computes on: the ``local_rank``-th of ``local_world`` equal,
    disjoint slices of the ``allowed`` cores (in order), when each slice holds at least twice
    ``threads`` (None: 1) cores, room for the rank's compute threads and as many for gloo's
    transport threads; else None, and the ranks share the host's cores (a laptop, CI's two).

    Pinned, the ranks no longer take cores from each other: a collective of one rank is not
    slowed by another rank's products landing on its core. Unpinned, 4 ranks made chapter 8's
    DDP overlap a property of the scheduler: two reference runs of 6 December disagreed on it
    (``overlap_range`` in ``runs/2026-12-06c-ad96832.json`` and
    ``runs/2026-12-06d-d911c2d.json``).

    Raises:
        ValueError: ``local_rank`` outside ``[0, local_world)``, or ``threads`` below 1.
    """
    cores = sorted(int(c) for c in allowed)
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local_rank must be in [0, {local_world}), got {local_rank}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    share = len(cores) // local_world
    if share < 2 * (threads or 1):
        return None
    return cores[local_rank * share:(local_rank + 1) * share]


def pin_rank(cpus) -> list[int] | None:
    """Pin this process, every thread it has (``/proc/self/task``) and every thread it starts
    later (gloo's, the intra-op pool's) to ``cpus``; returns them, or None when ``cpus`` is None
    or the system refuses (the rank then runs unpinned)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, cpus)
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:       # a thread that ended since the listing
                pass
    except OSError:
        return None
    return sorted(cpus)


def split_slice(cpus, threads: int | None) -> tuple[list[int], list[int]] | None:
    """A rank's slice of cores (:func:`rank_cpus`) cut in two: its first ``threads`` (None: 1)
    cores for the rank's compute threads, the rest for gloo's threads, so that a collective
    never waits for a core that the backward holds, as NCCL's kernels on a GPU run on SMs of
    their own. None when ``cpus`` is None or holds no core beyond the compute threads'.

    Why it exists: with the whole slice shared by the compute threads and gloo's threads, the
    all-reduces inside chapter 8's DDP step took about twice their time alone
    (``comm_in_step_text`` against ``comm_alone_text`` in ``runs/2026-12-07-86e0c7a.json``).

    Why it is off by default (:func:`perflab.distributed.launch.launch`'s ``split_comm``): the
    two reference runs that split the slice, recorded in ``runs/2026-12-07b-07ca410.json`` and
    ``runs/2026-12-07c-f96650c.json`` (one H100 host each, 16 cores; compare them with the
    shared slice's ``runs/2026-12-07-86e0c7a.json`` through ``scripts/compare_runs.py``),
    measured every collective *inside* a step slower than the shared slice had, while the same
    collectives alone kept their speed (``allreduce_busbw_text``): DDP's all-reduces against
    their time alone (``ddp_comm_ratio``), FSDP's collectives (``comm_in_step_ratio``), the
    ranks' arrival skew at FSDP's collectives and the overlap (``overlap_median``). Cut in two,
    a rank's compute has exactly its threads' cores and gloo's threads never run on them:
    every hand-off between the two (a bucket handed to gloo, a finished collective waking the
    step) crosses to a core that was idle. That this hand-off is the cost is a hypothesis, not
    measured.

    Raises:
        ValueError: ``threads`` below 1.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if not cpus:
        return None
    cores, n = sorted(int(c) for c in cpus), threads or 1
    if len(cores) <= n:
        return None
    return cores[:n], cores[n:]


def pin_new_threads(before, cpus) -> list[int]:
    """Pin the threads of this process that are not in ``before`` (thread ids, as listed in
    ``/proc/self/task`` earlier) to ``cpus``; returns their ids (those that ended meanwhile
    left out). Called after ``init_process_group``: the new threads are gloo's. A group made
    later (``new_group``, ``new_subgroups``) starts its threads from the calling thread, on the
    compute cores: DDP alone's one-rank groups and the ring's subgroups run there."""
    done = []
    for tid in sorted(set(os.listdir("/proc/self/task")) - {str(t) for t in before}):
        try:
            os.sched_setaffinity(int(tid), cpus)
            done.append(int(tid))
        except OSError:           # a thread that ended since the listing
            pass
    return done


def main(argv: list[str] | None = None) -> int:
    """The worker's entry point (module docstring); 0 when every task ran."""
    parser = argparse.ArgumentParser(description="perflab.distributed.worker (launched by torchrun)")
    parser.add_argument("--backend", choices=list(torchrun.BACKENDS), required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("this worker runs under torchrun; call perflab.distributed.launch.launch() instead")
    spec = json.loads(Path(args.spec).read_text())
    cpus, halves, comm_threads = None, None, []
    if args.backend == "gloo" and spec.get("pin") and hasattr(os, "sched_getaffinity"):
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        cpus = rank_cpus(os.sched_getaffinity(0), int(os.environ["LOCAL_RANK"]), local,
                         spec.get("threads"))
        # split (asked for only): compute on the slice's first cores (the intra-op pool,
        # started later by this thread, inherits them); gloo's threads, started by
        # init_process_group, on the rest. Else both share the slice.
        halves = split_slice(cpus, spec.get("threads")) if spec.get("split") else None
        cpus = pin_rank(halves[0] if halves else cpus)
        if cpus is None:
            halves = None
    before = set(os.listdir("/proc/self/task")) if halves else set()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    timeout = datetime.timedelta(seconds=float(spec.get("pg_timeout_s", 60)))
    user = _user_module(spec.get("user_code"))
    functions = [task_function(task["name"]) for task in spec["tasks"]]   # their modules imported
    started = timestamp()   # what the notebook reads as the end of the rank's imports
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torchrun.worker_device(args.backend, int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=_store(timeout), rank=rank, world_size=world,
                                device_id=device, timeout=timeout)
    else:
        dist.init_process_group("gloo", store=_store(timeout), rank=rank, world_size=world, timeout=timeout)
        if halves:
            comm_threads = pin_new_threads(before, halves[1])
    try:
        ctx = Ctx(device, spec["scratch"], user)
        results, task_s = {}, {}
        record = {"rank": ctx.rank, "world_size": ctx.world, "local_rank": int(os.environ["LOCAL_RANK"]),
                  "node": int(os.environ.get("GROUP_RANK", 0)),
                  "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "threads": torch.get_num_threads(), "cpus": cpus,
                  "comm_cpus": halves[1] if halves else None, "comm_threads": len(comm_threads),
                  "torch": torch.__version__,
                  "results": results, "task_s": task_s, "started": started}
        if device.type == "cuda":
            v = torch.cuda.nccl.version()
            record["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        out = Path(args.out_dir)
        for task, fn in zip(spec["tasks"], functions):
            key = task.get("key", task["name"])
            with Stopwatch() as clock:
                results[key] = fn(ctx, **task.get("args", {}))
            task_s[key] = clock.seconds
            # the tasks done so far: what a launch that fails later (a task that hangs on
            # purpose) still returns (perflab.distributed.launch.FINISHED)
            _write_json(out / f"rank{ctx.rank}{FINISHED}", record)
        _write_json(out / f"rank{ctx.rank}.json", record)
    finally:
        dist.destroy_process_group()
    return 0


def leave(code: int) -> NoReturn:
    """End this process with exit status ``code`` once its work is done and written: flush its
    output, run the exit handlers that Python and the libraries registered (:mod:`atexit`:
    logging's, torch's compile workers', ``weakref.finalize``'s temporary folders), then
    ``os._exit``, which skips the interpreter's teardown of every module and object.

    Why: with torch and the ``torch._dynamo`` that DDP and every optimizer import on first use
    loaded, that teardown costs a rank CPU time while torchrun and the notebook wait for it to
    exit (commit de5fd30 gives the seconds). A rank whose task raised never comes here: it
    exits as Python does, with its traceback."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()      # CPython's own exit handlers, run as at a normal exit
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
