"""Data parallelism and sharding under ``torchrun``: manual all-reduce, DDP, ZeRO-1, FSDP2, DCP.

A notebook cannot be several processes, so :func:`launch` starts ``torchrun`` (one or two
"nodes" on this machine) running this module as the worker, with a list of *tasks* (experiments)
batched into one launch; every rank writes its results as JSON into a temporary folder and the
launcher returns them, one dict per rank. A launch that outlives ``timeout_s`` is killed (the
whole process group of every ``torchrun``) and raises :class:`perflab.distributed.torchrun.LaunchError`;
the workers always destroy their process group. The children keep ``NCCL_NVLS_ENABLE=0``.

Tasks (``{"name": ..., "args": {...}}``; see ``TASKS`` and each ``_task_*`` docstring):

* ``collectives``: the six collectives on tiny tensors (inputs and outputs per rank);
* ``sweep``: time of all-reduce / all-gather / reduce-scatter / broadcast / all-to-all against size;
* ``manual_vs_ddp``: the same step by a hand-written gradient all-reduce and by DDP (float64:
  parameters compared), then step times of single-process, manual and DDP training, timed in
  interleaved rounds (:func:`interleaved_rounds`);
* ``buckets``: DDP step time against ``bucket_cap_mb``;
* ``overlap``: a profiled DDP step, summarized by :func:`overlap_from_trace`;
* ``no_sync``: gradient accumulation with ``DDP.no_sync`` against single-process training;
* ``sharding``: bytes per rank and step time of DDP, ZeRO-1, FSDP2 (``fully_shard``);
* ``dcp_save`` / ``dcp_load``: a distributed checkpoint written on one world size, read on another;
* ``train_ckpt``: training that checkpoints and resumes after ``torchrun --max-restarts``;
* ``hang`` / ``die``: one rank stops answering or exits;
* ``gpt2`` / ``gpt2_interleaved``: chapter 10's GPT-2 rung under DDP or FSDP2; under DDP and alone
  on every rank, timed in interleaved rounds.

Bus bandwidth follows nccl-tests (``doc/PERFORMANCE.md``): ``busbw = S / t * factor`` with
factor ``2 (n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all,
``1`` for broadcast and reduce (:func:`bus_factor`). Sharded memory follows ZeRO (Rajbhandari et
al., SC 2020): mixed/fp32 Adam keeps 16 bytes per parameter (4 weight, 4 gradient, 8 moments).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import inspect
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.profiler as tp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch >= 2.6
except ImportError:  # torch 2.4-2.5 kept FSDP2 under its composable-API name
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

from perflab.core.timing import Stopwatch, seconds_per_call, seconds_since, timestamp
from perflab.core.validate import integer, positive, positive_int
from perflab.distributed import torchrun
from perflab.distributed.steps import allreduce_gradients
from perflab.distributed.torchrun import LaunchError
from perflab.gpt2.rungs import rung_from_dict
from perflab.gpt2.train import batches, distributed_task, token_ids
from perflab.gpt2 import model as gpt2_model
from perflab.gpt2 import steps as gpt2_steps

__all__ = ["bus_factor", "COLLECTIVES", "expect_failure", "FAIL_FAST_ENV", "Failure",
           "interleaved_rounds", "launch", "source_of", "load_checkpoint_here",
           "overlap_from_trace", "pick_for", "settled_reading", "static_bytes_formula"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


# ---------------------------------------------------------------------------------------------
# Formulas (pure functions, unit-tested)
# ---------------------------------------------------------------------------------------------

def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth for ``op`` on ``world_size`` ranks.

    ``all_reduce``: ``2 (n-1)/n``; ``all_gather``, ``reduce_scatter``, ``all_to_all``: ``(n-1)/n``;
    ``broadcast``, ``reduce``: 1 (nccl-tests, doc/PERFORMANCE.md).

    Raises:
        ValueError: unknown ``op`` or ``world_size`` < 2.
    """
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")
    integer("world_size", world_size, 2)
    n = world_size
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}.get(op, (n - 1) / n)


def static_bytes_formula(params: int, world_size: int, strategy: str, bytes_per_param: int = 16) -> float:
    """Bytes per rank of weights + gradients + Adam moments for ``params`` fp32 parameters.

    ``ddp``: ``16 P`` (every rank holds everything); ``zero1``: ``8 P + 8 P / N`` (Adam's two
    moments sharded); ``fsdp``: ``16 P / N`` (all three sharded; ZeRO-3, Rajbhandari et al. 2020).
    ``bytes_per_param`` (default 16 = 4 + 4 + 8) scales all three.

    Raises:
        ValueError: unknown ``strategy``, ``params`` < 0 or ``world_size`` < 1.
    """
    if params < 0 or world_size < 1:
        raise ValueError(f"params must be >= 0 and world_size >= 1, got {params}, {world_size}")
    b, n = bytes_per_param, world_size
    if strategy == "ddp":
        return b * params
    if strategy == "zero1":
        return b / 2 * params + b / 2 * params / n
    if strategy == "fsdp":
        return b * params / n
    raise ValueError(f"strategy must be 'ddp', 'zero1' or 'fsdp', got {strategy!r}")


def pick_for(backend: str, cpu, gpu):
    """``gpu`` when the workers will run on GPUs (``backend == "nccl"``), else ``cpu``.

    Unlike :func:`perflab.core.device.pick`, this follows where the *workers* run: a machine with
    one GPU launches gloo processes on its CPU and must use CPU sizes.
    ``PERFLAB_FORCE_CPU_SIZES=1`` forces ``cpu``.

    Raises:
        ValueError: ``backend`` is not ``"nccl"`` or ``"gloo"``.
    """
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if os.environ.get("PERFLAB_FORCE_CPU_SIZES") == "1":
        return cpu
    return gpu if backend == "nccl" else cpu


def interleaved_rounds(steps: dict[str, Callable[[], object]],
                       time_one: Callable[[Callable[[], object]], float],
                       rounds: int) -> tuple[dict[str, list[float]], list[list[str]]]:
    """Time every step of ``steps`` once per round, the order rotating from round to round.

    Round ``r`` times the steps in the order of ``steps`` rotated left by ``r`` (three steps
    a, b, c: ``a b c``, then ``b c a``, then ``c a b``), each with ``time_one(step)``. When
    ``rounds`` is a multiple of ``len(steps)``, every step runs equally often in every position.
    Why: timed one after the other, the last step runs on a machine the earlier ones have
    changed. On the 2x H200 run, DDP timed last ran on GPUs that the single-rank and manual
    steps had heated toward their 700 W power limit, where the SM clock falls (about 1,980 to
    1,500-1,650 MHz under sustained matrix products), and its scaling efficiency read low.
    Interleaved, every step sees the same mix of machine states, and a step's median round
    compares with another's.

    Args:
        steps: name -> a callable of no arguments (one training step); at least one. The
            order of the dict is round 0's order. Every rank must pass the same names in the
            same order (steps that communicate run in lock-step).
        time_one: seconds for one step (e.g. a warm-up call, then the mean of a few calls).
        rounds: number of rounds (>= 1).

    Returns:
        ``(times, orders)``: ``times[name]`` is the list of that step's seconds, one per round,
        in round order; ``orders[r]`` the names in the order round ``r`` ran them.

    Raises:
        ValueError: no steps, or ``rounds`` is not an integer >= 1.
    """
    if not steps:
        raise ValueError("steps must hold at least one step")
    positive_int("rounds", rounds)
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    orders = []
    for r in range(rounds):
        k = r % len(names)
        order = names[k:] + names[:k]
        for name in order:
            times[name].append(float(time_one(steps[name])))
        orders.append(order)
    return times, orders


def _union(intervals):
    out = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_from_trace(trace: dict) -> dict:
    """How much communication ran while computation ran, from a Chrome trace (``prof.export_chrome_trace``).

    GPU traces: communication = kernels (``cat == "kernel"``) whose name contains ``nccl``,
    computation = every other kernel. CPU traces (no kernels): communication = ``gloo:*`` events,
    computation = the backward pass's ``autograd::engine::evaluate_function`` ops.

    Returns:
        dict with ``source`` (``"gpu kernels"`` or ``"cpu ops"``), ``comm_s``, ``compute_s``
        (lengths of the unions of the intervals, seconds), ``overlap_s`` (their intersection),
        ``overlap_fraction`` (``overlap_s / comm_s``, None without communication), ``span_s``,
        and ``comm`` / ``compute``: the merged intervals in seconds from the trace's first event.

    Raises:
        ValueError: ``trace`` has no ``traceEvents`` list.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace dict with a 'traceEvents' list")
    timed = [e for e in events if isinstance(e, dict) and "ts" in e and "dur" in e]
    kernels = [e for e in timed if e.get("cat") == "kernel"]
    if kernels:
        source = "gpu kernels"
        comm = [e for e in kernels if "nccl" in e.get("name", "").lower()]
        comp = [e for e in kernels if "nccl" not in e.get("name", "").lower()]
    else:
        source = "cpu ops"  # gloo's collectives are "user_annotation" events named gloo:<op>
        comm = [e for e in timed if e.get("name", "").startswith("gloo:")]
        comp = [e for e in timed if e.get("cat") == "cpu_op"
                and e.get("name", "").startswith("autograd::engine::evaluate_function")]
    everything = comm + comp
    t0 = min((float(e["ts"]) for e in everything), default=0.0)

    def merged(evs):
        return _union([[(float(e["ts"]) - t0) * 1e-6, (float(e["ts"]) + float(e["dur"]) - t0) * 1e-6]
                       for e in evs])

    c, k = merged(comm), merged(comp)
    comm_s, overlap = _length(c), _intersection(c, k)
    span = max((b for _, b in c + k), default=0.0)
    return {"source": source, "comm_s": comm_s, "compute_s": _length(k), "overlap_s": overlap,
            "overlap_fraction": overlap / comm_s if comm_s > 0 else None, "span_s": span,
            "comm": c, "compute": k}


# ---------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------

def source_of(fn) -> str:
    """The source text of ``fn`` (a function defined with ``def``), dedented, or ``fn`` itself
    dedented when it is already source text: what :func:`launch` writes to the module the
    workers import as ``user_code``.

    Raises:
        ValueError: ``fn`` is neither callable nor text, or its source cannot be read (a lambda
            typed at a prompt, a builtin).
    """
    if isinstance(fn, str):
        return textwrap.dedent(fn)
    if not callable(fn):
        raise ValueError(f"user code must be a function or its source text, got {type(fn).__name__}")
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ValueError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({e}); "
                         "define it with 'def' in a notebook cell or a file") from None


def launch(
    tasks: Sequence[dict],
    nproc: int = 2,
    backend: str | None = None,
    timeout_s: float = 120,
    nnodes: int | str = 1,
    max_restarts: int = 0,
    pg_timeout_s: float = 60,
    env: dict | None = None,
    user_code: Sequence = (),
) -> list[dict]:
    """Run ``tasks`` in this module's worker on ``nnodes x nproc`` processes; one result dict per rank.

    ``nnodes == 1``: ``torchrun --standalone --nproc-per-node <nproc>`` (its own free port).
    ``nnodes == 2``: two ``torchrun`` processes on this machine, ``--nnodes 2`` with a c10d
    rendezvous on ``localhost:<free port>``: two "nodes" that find each other exactly as two
    machines would. ``nnodes == "MIN:MAX"`` (an elastic job, e.g. ``"1:2"``): ``MIN``
    ``torchrun`` processes with ``--nnodes=MIN:MAX`` start, as if the other nodes had been lost;
    the rendezvous waits ``last_call_timeout`` (2 s here) for more, then runs the job on the
    ``MIN x nproc`` ranks it has. ``max_restarts`` is torchrun's ``--max-restarts``. ``pg_timeout_s`` is the
    process group's timeout (``init_process_group(timeout=...)``): a collective that waits longer
    raises on gloo, and NCCL's watchdog aborts the process. ``user_code``: functions (or source
    text) written to a module the worker imports (tasks ``user_allreduce``, ``user_optimizer``).

    Each task is ``{"name": <task>, "args": {...}, "key": <optional result key>}``. Returns a list
    indexed by global rank of ``{"rank", "world_size", "node", "local_rank", "restart_count",
    "device", "results": {key: task result}}``.

    Raises:
        ValueError: bad ``nproc``/``nnodes``/backend/task name; ``nccl`` without enough GPUs.
        LaunchError: a worker failed, the launch timed out (all processes are killed), or a rank
            wrote no result; the message holds the command, status and the workers' last lines.
    """
    positive_int("nproc", nproc)
    if not isinstance(nnodes, str):
        integer("nnodes", nnodes, 1, 2)
    positive("pg_timeout_s", pg_timeout_s)
    world = nproc * (int(nnodes.split(":")[0]) if isinstance(nnodes, str) else nnodes)
    backend = torchrun.backend_for(backend, world)
    tasks = [dict(t) for t in tasks]
    for t in tasks:
        if t.get("name") not in TASKS:
            raise ValueError(f"unknown task {t.get('name')!r}; tasks are {sorted(TASKS)}")
    with tempfile.TemporaryDirectory(prefix="perflab-par-") as tmp:
        tmp = Path(tmp)
        spec = {"tasks": tasks, "pg_timeout_s": pg_timeout_s, "scratch": str(tmp / "scratch")}
        if user_code:
            (tmp / "user_code.py").write_text("import torch\nimport torch.distributed as dist\n\n\n"
                                              + "\n\n".join(source_of(f) for f in user_code))
            spec["user_code"] = str(tmp / "user_code.py")
        (tmp / "spec.json").write_text(json.dumps(spec))
        (tmp / "scratch").mkdir()
        worker = ["-m", "perflab.distributed.training", "--backend", backend, "--out-dir", str(tmp),
                  "--spec", str(tmp / "spec.json")]
        done = torchrun.run(worker, tmp, nproc=nproc, nnodes=nnodes, backend=backend,
                            timeout_s=timeout_s, max_restarts=max_restarts, env=env)
        results = []
        for r in range(world):
            path = tmp / f"rank{r}.json"
            if not path.exists():
                raise done.failure(f"the workers exited cleanly but rank {r} wrote no result")
            results.append(json.loads(path.read_text()))
        return results


# Environment for a job that is meant to fail (torch 2.11 meanings, ProcessGroupNCCL.hpp and
# https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html):
# TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the default: on a watchdog error the process is torn down
# without first aborting the communicator (1 aborts it first: a call that can itself wait on
# the hung peer). TORCH_NCCL_DUMP_ON_TIMEOUT=0: no flight-recorder dump, whose wait
# (TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC) can come before the error: the H200 run without it
# ended 80 s after launch with a 10 s timeout.
# TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN=0: no C++ stack symbolized on the way out.
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT=2: torchrun's grace between SIGTERM and SIGKILL for the other
# ranks (torch >= 2.12, also --shutdown-timeout; 30 s fixed before, and unknown variables are
# ignored). With the three above, the 2x H200 run still ended 65 s after its 10 s timeout;
# TORCH_NCCL_ENABLE_MONITORING=0 turns off the heartbeat-monitor thread, which on a watchdog
# error waits for debug information before it terminates the process (pytorch/pytorch#112518,
# #133028): the likely cause of that wait, which chapter 8's next 2-GPU run measures (the
# waiting ranks print the values they ran with, Failure.rank_env). gloo reads none of them.
FAIL_FAST_ENV = {
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN": "0",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2",
}

# printed by the ranks of the hang task when they start to wait: "<marker> <rank> <unix time>",
# and before it "<env marker> <JSON of the FAIL_FAST_ENV variables as the rank sees them>"
_WAIT_MARKER = "perflab-hang-wait-starts"
_ENV_MARKER = "perflab-hang-env"


def _wait_start(output: str) -> float | None:
    """The earliest time (Unix seconds) a rank printed that it started waiting, or None."""
    times = []
    for line in output.splitlines():
        i = line.find(_WAIT_MARKER)
        if i >= 0:
            parts = line[i:].split()
            with contextlib.suppress(IndexError, ValueError):
                times.append(float(parts[2]))
    return min(times) if times else None


def _rank_env(output: str) -> dict | None:
    """The fail-fast variables as the first waiting rank printed them (None: not printed)."""
    for line in output.splitlines():
        i = line.find(_ENV_MARKER)
        if i >= 0:
            with contextlib.suppress(ValueError):
                return json.loads(line[i + len(_ENV_MARKER):])
    return None


@dataclass(frozen=True)
class Failure:
    """A launch that failed as intended.

    Attributes:
        seconds: from the launch to the error, start-up included.
        message: the :class:`LaunchError` message.
        output: the launch's whole output (every rank's lines and torchrun's).
        after_wait_s: seconds from the moment the first rank started waiting in the hung
            collective (task ``hang``) to the end of the job; None for other tasks.
        rank_env: the :data:`FAIL_FAST_ENV` variables as a waiting rank saw them in its own
            environment (``{name: value or None}``, task ``hang``), so a run shows the
            settings it was measured with; None for other tasks.
    """

    seconds: float
    message: str
    output: str = ""
    after_wait_s: float | None = None
    rank_env: dict | None = None

    @property
    def first_error(self) -> str:
        """The ranks' first error line: a Python exception, or NCCL's watchdog timeout (a rank
        that times out in NCCL ends without a Python exception); else the first line of the
        output that mentions a timeout or the watchdog; else the message's first line."""
        parts = self.message.split("--- worker errors ---\n", 1)
        first = (parts[1] if len(parts) > 1 else parts[0]).splitlines()[0]
        if not first.startswith("(no exception line"):
            return first
        for line in (self.output or self.message).splitlines():
            low = line.lower()
            if ("watchdog" in low or "timed out" in low or "timeout" in low) \
                    and "torch.distributed.run" not in line and _ENV_MARKER not in line:
                return line.strip()
        return self.message.splitlines()[0]


def expect_failure(tasks: Sequence[dict], env: dict | None = None, **kwargs) -> Failure:
    """Run :func:`launch` on a job that must fail; return how long the failure took and its message.

    The ranks run with :data:`FAIL_FAST_ENV` (then ``env`` on top), so that an NCCL timeout
    ends the process as soon as the watchdog sees it.

    Raises:
        RuntimeError: the job succeeded.
    """
    clock = Stopwatch().start()
    try:
        launch(tasks, env={**FAIL_FAST_ENV, **(env or {})}, **kwargs)
    except LaunchError as e:
        seconds = clock.elapsed()
        output = getattr(e, "output", "")
        started = _wait_start(output)      # a timestamp() the hung rank printed
        return Failure(seconds, str(e), output,
                       None if started is None else seconds_since(started), _rank_env(output))
    raise RuntimeError(f"the job {[t['name'] for t in tasks]} was expected to fail but succeeded")


# ---------------------------------------------------------------------------------------------
# Lab checks (each proven by tests/test_lab08.py)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The worker (runs under torchrun)
# ---------------------------------------------------------------------------------------------

class _Ctx:
    """What every task gets: torch, dist, device, rank, world size, scratch folder, user module."""

    def __init__(self, torch, dist, device, scratch, user):
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.scratch, self.user = Path(scratch), user

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def barrier(self):
        flag = self.torch.zeros(1, device=self.device)
        self.dist.all_reduce(flag)
        self.sync()

    def max_over_ranks(self, value: float) -> float:
        t = self.torch.tensor([float(value)], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def timed(self, step: Callable, warmup: int, iters: int) -> float:
        """Mean seconds per call of ``step`` over ``iters`` calls, the slowest rank's."""
        for _ in range(warmup):
            step()
        self.barrier()
        return self.max_over_ranks(seconds_per_call(step, iters, self.device))


def _make_model(ctx, width: int, depth: int, seed: int = 0, dtype: str = "float32"):
    torch = ctx.torch
    torch.manual_seed(seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)]
    model = torch.nn.Sequential(*layers).to(dtype=getattr(torch, dtype))
    return model.to(ctx.device)


def _batch(ctx, step: int, batch: int, width: int, dtype, rank: int | None = None, seed: int = 1):
    """Global batch of step ``step`` (``world x batch`` rows), or the slice of ``rank``."""
    torch = ctx.torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(ctx.world * batch, width, generator=g, dtype=torch.float64)
    y = torch.randn(ctx.world * batch, width, generator=g, dtype=torch.float64)
    if rank is not None:
        x, y = x[rank * batch:(rank + 1) * batch], y[rank * batch:(rank + 1) * batch]
    return x.to(ctx.device, dtype), y.to(ctx.device, dtype)


def _timing_batch(ctx, batch: int, width: int, dtype):
    """Random inputs and targets made on the device itself (no host copy of a large batch)."""
    torch = ctx.torch
    torch.manual_seed(1000 + ctx.rank)
    return (torch.randn(batch, width, device=ctx.device, dtype=dtype),
            torch.randn(batch, width, device=ctx.device, dtype=dtype))


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _state_bytes(optimizer) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps the local one
    total = 0
    for state in inner.state.values():
        for v in state.values():
            if hasattr(v, "numel") and v.numel() > 1:  # skip Adam's scalar step counters
                total += _nbytes(v)
    return total


def _max_param_diff(a, b) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _ddp(ctx, model, **kw):
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids, **kw)


def _task_collectives(ctx, n: int = 4) -> dict:
    """The six collectives on tiny float tensors: ``{op: {"input": [...], "output": [...]}}`` for this rank.

    Rank r's input is ``[10 r, 10 r + 1, ...]`` (``n`` elements, ``n`` a multiple of the world
    size for reduce-scatter and all-to-all: rounded up). Root of broadcast and reduce: rank 0.
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


def _task_sweep(ctx, sizes: Sequence[int], ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter"),
                target_bytes: int = 2**28, max_iters: int = 100, rounds: int = 1) -> dict:
    """Time each collective in ``ops`` at each size in ``sizes`` (bytes, nccl-tests' size S).

    S is the buffer all-reduced / broadcast, the all-gather's output, the reduce-scatter's input,
    the all-to-all's buffer. Each size is timed ``rounds`` times (the whole sweep repeated) and
    the fastest round kept: the least disturbed by other work on a shared machine. Returns
    ``{op: [{"nbytes", "seconds", "iters", "algbw", "busbw"}]}``.
    """
    torch, dist, w = ctx.torch, ctx.dist, ctx.world
    best: dict = {}
    for _ in range(max(1, int(rounds))):
        for op in ops:
            for s in sizes:
                numel = max(w, int(s) // 4 // w * w)
                nbytes = numel * 4
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
                iters = max(3, min(max_iters, target_bytes // nbytes))
                t = ctx.timed(fn, warmup=2, iters=iters)
                key = (op, nbytes)
                best[key] = min(best.get(key, float("inf")), t)
                del full, part, src
    out = {}
    for (op, nbytes), t in best.items():
        algbw = nbytes / t
        out.setdefault(op, []).append({"nbytes": nbytes, "seconds": t, "algbw": algbw,
                                       "busbw": algbw * bus_factor(op, w) if w > 1 else None})
    return out


def _manual_allreduce(ctx, model):
    allreduce_gradients(model)        # chapter 8's, from its page


def _diff_from_ddp(ctx, allreduce, width: int, depth: int, steps: int) -> float:
    """Train two copies of a float64 model for ``steps`` SGD steps on every rank, one calling
    ``allreduce(model)`` after ``backward()``, one wrapped in DDP; the largest parameter
    difference between them over all ranks."""
    torch = ctx.torch
    man = _make_model(ctx, width, depth, dtype="float64")
    ddp = _ddp(ctx, _make_model(ctx, width, depth, dtype="float64"))
    o1 = torch.optim.SGD(man.parameters(), lr=0.1)
    o2 = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(steps):
        x, y = _batch(ctx, s, 8, width, torch.float64, ctx.rank)
        o1.zero_grad()
        _loss(man, x, y).backward()
        allreduce(man)
        o1.step()
        o2.zero_grad()
        _loss(ddp, x, y).backward()
        o2.step()
    return ctx.max_over_ranks(_max_param_diff(man, ddp.module))


def _task_manual_vs_ddp(ctx, check_width: int = 16, check_depth: int = 3, check_steps: int = 3,
                        width: int = 64, depth: int = 4, batch: int = 32, warmup: int = 2,
                        iters: int = 5, rounds: int = 3, dtype: str = "float32",
                        allow_tf32: bool = True) -> dict:
    """(1) float64: manual data parallelism (all-reduce then divide each gradient) against DDP
    after ``check_steps`` SGD steps: ``max_param_diff``. (2) step seconds on a ``depth`` x
    ``width`` model with ``batch`` rows per rank, for three steps built side by side:
    ``single`` (each rank alone, no communication), ``manual`` and ``ddp``. Each is warmed up
    ``warmup`` times, then the three are timed in ``rounds`` interleaved rounds
    (:func:`interleaved_rounds`, order rotating; in each round one untimed step, then the
    slowest rank's mean of ``iters`` steps). ``single_rounds_s``, ``manual_rounds_s``,
    ``ddp_rounds_s``: the seconds per round; ``single_s``, ``manual_s``, ``ddp_s``: their
    medians; ``round_orders``: the order of each round. ``allreduce_s``: one all-reduce of all
    gradients as one buffer; ``params``, ``grad_bytes``, ``flops_per_step`` (6 x params x batch
    per rank)."""
    torch = ctx.torch
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    diff = _diff_from_ddp(ctx, lambda m: _manual_allreduce(ctx, m), check_width, check_depth,
                          check_steps)

    dt = getattr(torch, dtype)
    x, y = _timing_batch(ctx, batch, width, dt)
    res = {"max_param_diff": diff, "check_steps": check_steps}

    def make_step(kind):
        model = _make_model(ctx, width, depth, dtype=dtype)
        if kind == "ddp":
            model = _ddp(ctx, model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=False)
            _loss(model, x, y).backward()
            if kind == "manual":
                _manual_allreduce(ctx, model)
            opt.step()

        return step, sum(p.numel() for p in model.parameters())

    steps = {}
    for kind in ("single", "manual", "ddp"):
        steps[kind], params = make_step(kind)
        for _ in range(warmup):
            steps[kind]()
    times, orders = interleaved_rounds(steps, lambda fn: ctx.timed(fn, 1, iters), rounds)
    for kind, ts in times.items():
        res[f"{kind}_rounds_s"] = ts
        res[f"{kind}_s"] = statistics.median(ts)
    res["round_orders"] = orders
    del steps  # the closures hold the three models
    gc.collect()
    flat = torch.zeros(params, dtype=dt, device=ctx.device)
    res["allreduce_s"] = ctx.timed(lambda: ctx.dist.all_reduce(flat), warmup, iters)
    res["params"] = params
    res["grad_bytes"] = params * flat.element_size()
    res["flops_per_step"] = 6 * params * batch
    return res


def _make_blocks(ctx, n_layer: int, n_embd: int, seed: int = 0):
    """A stack of GPT-2 blocks (:class:`perflab.gpt2.model.Block`, attention through SDPA):
    parameters of a real transformer's sizes, for the bucket sweep."""
    torch = ctx.torch
    torch.manual_seed(seed)
    cfg = gpt2_model.GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // 64))
    return torch.nn.Sequential(*[gpt2_model.Block(cfg) for _ in range(n_layer)]).to(ctx.device)


def _task_buckets(ctx, bucket_mbs: Sequence[float], width: int = 64, depth: int = 4, batch: int = 32,
                  warmup: int = 2, iters: int = 5, dtype: str = "float32",
                  blocks: tuple[int, int, int] | None = None) -> dict:
    """DDP step seconds against ``bucket_cap_mb``, and the buckets DDP itself made.

    The model is ``depth`` Linear layers of ``width`` (inputs ``batch x width``), or with
    ``blocks = (n_layer, n_embd, seq_len)`` a stack of GPT-2 blocks (inputs ``batch x seq_len x
    n_embd``): many parameters of a transformer's sizes, so that the caps tried split them into
    different numbers of buckets (DDP never splits a tensor). After the warm-up (DDP rebuilds its
    buckets in the order gradients became ready after the first step) the buckets are read from
    ``DistributedDataParallel._get_ddp_logging_data()``. Returns ``{"step_s": {mb: s},
    "buckets": {mb: number of buckets}, "bucket_bytes": {mb: [bytes per bucket]}, "params",
    "grad_bytes", "largest_param_bytes"}``."""
    torch = ctx.torch
    dt = getattr(torch, dtype)
    if blocks:
        n_layer, n_embd, seq = blocks
        torch.manual_seed(1000 + ctx.rank)
        x = torch.randn(batch, seq, n_embd, device=ctx.device, dtype=dt)
        y = torch.randn(batch, seq, n_embd, device=ctx.device, dtype=dt)
    else:
        x, y = _timing_batch(ctx, batch, width, dt)
    out, counts, sizes = {}, {}, {}
    for mb in bucket_mbs:
        net = (_make_blocks(ctx, *blocks[:2]).to(dt) if blocks
               else _make_model(ctx, width, depth, dtype=dtype))
        largest = max(p.numel() for p in net.parameters()) * torch.finfo(dt).bits // 8
        model = _ddp(ctx, net, bucket_cap_mb=float(mb))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=False)
            _loss(model, x, y).backward()
            opt.step()

        out[str(float(mb))] = ctx.timed(step, max(warmup, 2), iters)
        info = model._get_ddp_logging_data()
        found = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
        sizes[str(float(mb))] = [int(v) for v in found.split(",") if v.strip()]
        counts[str(float(mb))] = len(sizes[str(float(mb))])
        params = sum(p.numel() for p in model.parameters())
        del model, opt, step, net
    return {"step_s": out, "buckets": counts, "bucket_bytes": sizes, "params": params,
            "grad_bytes": params * torch.finfo(dt).bits // 8, "largest_param_bytes": largest}


def _task_overlap(ctx, width: int = 64, depth: int = 4, batch: int = 32, bucket_mb: float = 25.0,
                  steps: int = 3, dtype: str = "float32") -> dict:
    """A DDP step profiled on rank 0 (torch.profiler), summarized by :func:`overlap_from_trace`
    over the last of ``steps`` steps; other ranks return ``{}``."""

    torch = ctx.torch
    dt = getattr(torch, dtype)
    x, y = _timing_batch(ctx, batch, width, dt)
    model = _ddp(ctx, _make_model(ctx, width, depth, dtype=dtype), bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=False)
        _loss(model, x, y).backward()
        opt.step()

    for _ in range(steps - 1):
        step()
    ctx.barrier()
    acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    with tp.profile(activities=acts) if ctx.rank == 0 else contextlib.nullcontext() as prof:
        step()
        ctx.sync()
    if ctx.rank != 0:
        return {}
    path = ctx.scratch / "ddp_trace.json"
    prof.export_chrome_trace(str(path))
    summary = overlap_from_trace(json.loads(path.read_text()))
    path.unlink()
    for k in ("comm", "compute"):  # keep the figure's data small
        summary[k] = summary[k][:400]
    return summary


def _task_no_sync(ctx, width: int = 16, depth: int = 3, batch: int = 4, accum: int = 4,
                  time_width: int = 0, time_depth: int = 4, time_batch: int = 32, iters: int = 3) -> dict:
    """Gradient accumulation over ``accum`` micro-batches with ``DDP.no_sync`` (float64):
    ``rank_spread`` (largest gradient difference between ranks), ``vs_single`` (against one
    process on all ``world x accum`` micro-batches). With ``time_width`` > 0 also the seconds of
    ``accum`` micro-steps with and without ``no_sync``: ``sync_every_s``, ``no_sync_s``."""
    torch = ctx.torch
    ddp = _ddp(ctx, _make_model(ctx, width, depth, dtype="float64"))
    for m in range(accum):
        x, y = _batch(ctx, m, batch, width, torch.float64, ctx.rank)
        with ddp.no_sync() if m < accum - 1 else contextlib.nullcontext():
            (_loss(ddp, x, y) / accum).backward()
    g = torch.cat([p.grad.flatten() for p in ddp.parameters()])
    gathered = [torch.empty_like(g) for _ in range(ctx.world)]
    ctx.dist.all_gather(gathered, g)
    spread = max(float((a - g).abs().max()) for a in gathered)
    single = _make_model(ctx, width, depth, dtype="float64")
    total = 0
    for m in range(accum):
        x, y = _batch(ctx, m, batch, width, torch.float64)
        total = total + _loss(single, x, y)
    (total / accum).backward()
    gs = torch.cat([p.grad.flatten() for p in single.parameters()])
    res = {"rank_spread": ctx.max_over_ranks(spread),
           "vs_single": ctx.max_over_ranks(float((gs - g).abs().max())),
           "grad_norm": float(g.norm()), "accum": accum}
    if time_width:
        model = _ddp(ctx, _make_model(ctx, time_width, time_depth))
        x, y = _timing_batch(ctx, time_batch, time_width, torch.float32)
        for use in (False, True):
            def micro_steps():
                for m in range(accum):
                    with model.no_sync() if use and m < accum - 1 else contextlib.nullcontext():
                        _loss(model, x, y).backward()
            res["no_sync_s" if use else "sync_every_s"] = ctx.timed(micro_steps, 1, iters)
    return res


def _fsdp(ctx, model, reshard: bool = True, bf16: bool = False):
    torch = ctx.torch
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for block in model:
        fully_shard(block, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=mp)
    return model


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
    if repeats < 1 or interval_s < 0 or timeout_s < 0:
        raise ValueError(f"repeats must be >= 1 and interval_s, timeout_s >= 0, got "
                         f"{repeats}, {interval_s}, {timeout_s}")
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


def _task_sharding(ctx, width: int = 64, depth: int = 4, batch: int = 32, warmup: int = 2, iters: int = 4,
                   strategies: Sequence[str] = ("ddp", "zero1", "fsdp", "fsdp_keep", "fsdp_bf16"),
                   allow_tf32: bool = True) -> dict:
    """Bytes per rank after an Adam step and step seconds for each strategy.

    ``ddp`` (``gradient_as_bucket_view=True``: the gradients live in DDP's buckets, no second
    copy), ``zero1`` (DDP + ``ZeroRedundancyOptimizer``), ``fsdp`` (``fully_shard`` per block,
    ``reshard_after_forward=True``), ``fsdp_keep`` (``reshard_after_forward=False``),
    ``fsdp_bf16`` (bf16 parameters in compute, fp32 gradient reduction). For each:
    ``param_bytes``, ``grad_bytes``, ``state_bytes`` (this rank's tensors, counted),
    ``static_bytes`` (their sum), ``allocated_bytes`` / ``peak_bytes`` (CUDA allocator, None on
    CPU), ``released_bytes`` (what the allocator got back when the model and optimizer were
    dropped, None on CPU), ``step_s``; and ``params`` (the model's parameter count).

    ``allocated_bytes`` is read after one step (so gradients and Adam's moments exist; the
    gradients are zeroed in place, never set to None), as the difference of two *settled*
    readings of ``torch.cuda.memory_allocated`` (:func:`settled_reading`): before the model
    was built and after the step, each taken once the collectives' stashed tensors have been
    released, so neither the previous strategy's nor this step's communication buffers count."""

    torch = ctx.torch
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    cuda = ctx.device.type == "cuda"
    x, y = _timing_batch(ctx, batch, width, torch.float32)
    out = {}
    def prepare():
        gc.collect()
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()

    def allocated():
        return settled_reading(lambda: torch.cuda.memory_allocated(ctx.device), prepare)

    for name in strategies:
        gc.collect()
        if cuda:
            base = allocated()
        model = _make_model(ctx, width, depth)
        params = sum(p.numel() for p in model.parameters())
        if name in ("ddp", "zero1"):
            model = _ddp(ctx, model, gradient_as_bucket_view=True)
        elif name.startswith("fsdp"):
            model = _fsdp(ctx, model, reshard=name != "fsdp_keep", bf16=name == "fsdp_bf16")
        else:
            raise ValueError(f"unknown strategy {name!r}")
        if name == "zero1":
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=False)
            _loss(model, x, y).backward()
            opt.step()

        step()
        ctx.sync()
        r = {"param_bytes": sum(_nbytes(p) for p in model.parameters()),
             "grad_bytes": sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None),
             "state_bytes": _state_bytes(opt)}
        r["static_bytes"] = r["param_bytes"] + r["grad_bytes"] + r["state_bytes"]
        if cuda:
            r["allocated_bytes"] = allocated() - base
            torch.cuda.reset_peak_memory_stats(ctx.device)
            step()
            ctx.sync()
            r["peak_bytes"] = torch.cuda.max_memory_allocated(ctx.device) - base
        else:
            r["allocated_bytes"] = r["peak_bytes"] = None
        r["step_s"] = ctx.timed(step, warmup, iters)
        out[name] = r
        if cuda:
            ctx.barrier()
            held = allocated()
        del model, opt, step  # else the next strategy's baseline counts this model
        r["released_bytes"] = held - allocated() if cuda else None
    return {"strategies": out, "params": params}


def _checksum_state(ctx, model) -> dict:
    return {k: _full(v).double().sum().item() for k, v in model.state_dict().items()}


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _task_dcp_save(ctx, width: int = 32, depth: int = 3, path: str | None = None) -> dict:
    """An FSDP2 model (one Adam step taken) saved with ``torch.distributed.checkpoint`` to ``path``
    (default: the launch's scratch folder); rank 0 also writes the full tensors beside it
    (``reference.pt``) for the load to compare with. Returns this rank's shard shapes."""

    torch = ctx.torch
    model = _fsdp(ctx, _make_model(ctx, width, depth, seed=5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = _batch(ctx, 0, 4, width, torch.float32, ctx.rank)
    _loss(model, x, y).backward()
    opt.step()
    path = Path(path or ctx.scratch / "dcp")
    sd = get_model_state_dict(model)
    full = {k: _full(v).detach().cpu() for k, v in sd.items()}
    dcp.save({"model": sd}, checkpoint_id=str(path))
    if ctx.rank == 0:
        torch.save(full, path / "reference.pt")
    ctx.barrier()
    files = sorted(p.name for p in path.iterdir())
    return {"path": str(path), "files": files,
            "shards": {k: list(_local(v).shape) for k, v in sd.items()}}


def _task_dcp_load(ctx, path: str, width: int = 32, depth: int = 3) -> dict:
    """Load the checkpoint at ``path`` into a freshly initialized FSDP2 model on this launch's world
    size: ``max_diff`` against the saved full tensors (0 when resharding worked), this rank's
    ``shards``."""

    torch = ctx.torch
    model = _fsdp(ctx, _make_model(ctx, width, depth, seed=99))
    sd = get_model_state_dict(model)
    state = {"model": sd}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    ref = torch.load(Path(path) / "reference.pt")
    now = get_model_state_dict(model)
    diff = max(float((_full(now[k]).detach().cpu() - ref[k]).abs().max()) for k in ref)
    return {"max_diff": ctx.max_over_ranks(diff),
            "shards": {k: list(_local(v).shape) for k, v in now.items()}}


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

    class _One:  # what _make_model needs from a task context
        device = torch.device("cpu")

    _One.torch = torch
    model = _make_model(_One, width, depth, seed=99)
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


def _task_train_ckpt(ctx, steps: int = 6, every: int = 2, fail_at: int = 3, width: int = 8,
                     depth: int = 2, batch: int = 4, path: str | None = None) -> dict:
    """DDP training (float64, SGD with momentum) that saves a checkpoint every ``every`` steps
    (rank 0, ``torch.save``, atomic rename) and resumes from it on start. On the first attempt
    (``TORCHELASTIC_RESTART_COUNT == 0``) the last rank exits with status 1 before step
    ``fail_at`` (``fail_at < 0``: never). Returns ``restart_count``, ``resumed_from`` (the step
    loaded, or 0), ``losses`` (this attempt), and ``vs_single``: the largest parameter difference
    from one process trained on the same global batches without interruption."""
    torch = ctx.torch
    path = Path(path or ctx.scratch / "train_ckpt.pt")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = _ddp(ctx, _make_model(ctx, width, depth, dtype="float64"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if path.exists():
        ck = torch.load(path, map_location=ctx.device)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = ck["step"]
    losses = []
    for s in range(start, steps):
        if restart == 0 and s == fail_at and ctx.rank == ctx.world - 1:
            os._exit(1)  # a crash: no clean-up, no goodbye to the other ranks
        x, y = _batch(ctx, s, batch, width, torch.float64, ctx.rank)
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if (s + 1) % every == 0:
            if ctx.rank == 0:
                tmp = path.with_suffix(".partial")
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": s + 1}, tmp)
                tmp.replace(path)
            ctx.barrier()
    single = _make_model(ctx, width, depth, dtype="float64")
    o = torch.optim.SGD(single.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        x, y = _batch(ctx, s, batch, width, torch.float64)
        o.zero_grad()
        _loss(single, x, y).backward()
        o.step()
    return {"restart_count": restart, "resumed_from": start, "losses": losses, "steps": steps,
            "vs_single": ctx.max_over_ranks(_max_param_diff(single, model.module))}


def _task_hang(ctx, hang_rank: int = -1, sleep_s: float = 600, timeout_s: float | None = None) -> dict:
    """Rank ``hang_rank`` (default the last) sleeps ``sleep_s`` instead of joining an all-reduce;
    the others wait in it until a timeout ends them: ``timeout_s`` seconds on a process group made
    for the purpose (``dist.new_group(timeout=...)``, after every rank has joined, so a slow
    start cannot trip it), or the launch's process-group timeout when ``timeout_s`` is None.
    Each waiting rank prints ``perflab-hang-env <JSON>`` (the :data:`FAIL_FAST_ENV` variables
    in its environment) and ``perflab-hang-wait-starts <rank> <Unix time>`` as it enters the
    hung all-reduce (both read by :func:`expect_failure`)."""

    r = hang_rank % ctx.world
    group = None
    if timeout_s is not None:
        group = ctx.dist.new_group(ranks=list(range(ctx.world)),
                                   timeout=datetime.timedelta(seconds=float(timeout_s)))
    x = ctx.torch.ones(4, device=ctx.device)
    ctx.dist.all_reduce(x, group=group)  # every rank has joined the group
    ctx.sync()
    if ctx.rank == r:
        time.sleep(sleep_s)
    else:
        seen = {k: os.environ.get(k) for k in FAIL_FAST_ENV}
        print(f"{_ENV_MARKER} {json.dumps(seen)}", flush=True)
        print(f"{_WAIT_MARKER} {ctx.rank} {timestamp():.3f}", flush=True)
        ctx.dist.all_reduce(x, group=group)
        ctx.sync()
        x.sum().item()
    return {"finished": True}


def _task_die(ctx, die_rank: int = -1, status: int = 3) -> dict:
    """Rank ``die_rank`` (default the last) exits at once with ``status``; the others all-reduce."""
    if ctx.rank == die_rank % ctx.world:
        os._exit(status)
    x = ctx.torch.ones(4, device=ctx.device)
    ctx.dist.all_reduce(x)
    ctx.sync()
    return {"finished": True}


def _task_user_allreduce(ctx, fns: Sequence[str], width: int = 16, depth: int = 3, steps: int = 3) -> dict:
    """For each function name in ``fns`` (from the launch's ``user_code``), called as
    ``fn(model)`` after ``backward()``: ``{name: largest parameter difference from DDP}`` after
    ``steps`` SGD steps (float64). A function that raises fails the launch.

    gloo has no ``ReduceOp.AVG`` (NCCL has): on gloo, an ``all_reduce`` asked for the average is
    run as a sum divided by the world size, so the right answer written for NCCL passes on a CPU
    too (:func:`_gloo_average`)."""
    out = {}
    with _gloo_average(ctx):
        for name in fns:
            out[name] = _diff_from_ddp(ctx, getattr(ctx.user, name), width, depth, steps)
    return out


class _Done:
    """The handle of an already finished collective (``wait()`` returns at once)."""

    def wait(self, *args, **kwargs):
        return True


@contextlib.contextmanager
def _gloo_average(ctx):
    """On gloo, ``dist.all_reduce(t, op=ReduceOp.AVG)`` becomes a sum and a division in place
    while the block runs; elsewhere nothing changes."""
    dist = ctx.dist
    if dist.get_backend() != "gloo":
        yield
        return
    original = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if op == dist.ReduceOp.AVG:
            work = original(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
            if work is not None:
                work.wait()
            tensor /= dist.get_world_size(group)
            return _Done() if async_op else None
        return original(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = original


def _task_user_optimizer(ctx, fns: Sequence[str], width: int = 32, depth: int = 8,
                         steps: int = 3) -> dict:
    """For each function name in ``fns``, called as ``fn(params)`` to build the optimizer of a DDP
    model, trained ``steps`` steps on this rank's batches: ``{name: {"state_bytes": this rank's
    optimizer state, "params": P, "kind": class, "rank_spread": largest difference of a
    parameter between any rank and rank 0}}``. Data parallelism keeps one model: a sharded
    optimizer that updates each rank's shard and never sends it to the others lets the ranks'
    copies drift apart, and ``rank_spread`` shows it."""
    torch = ctx.torch
    out = {}
    for name in fns:
        model = _ddp(ctx, _make_model(ctx, width, depth))
        opt = getattr(ctx.user, name)(model.parameters())
        for s in range(steps):
            x, y = _batch(ctx, s, 8, width, torch.float32, ctx.rank)
            opt.zero_grad()
            _loss(model, x, y).backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        ref = flat.clone()
        ctx.dist.broadcast(ref, src=0)
        spread = ctx.max_over_ranks(float((flat - ref).abs().max()))
        out[name] = {"state_bytes": _state_bytes(opt),
                     "params": sum(p.numel() for p in model.parameters()),
                     "kind": type(opt).__name__, "rank_spread": spread}
    return out


def _task_gpt2(ctx, rung: dict, steps: int, warmup: int = 2, tokens: str | None = None,
               n_tokens: int = 4_000_000, id_range: int = 8192, fsdp: bool = False) -> dict:
    """Chapter 10's GPT-2 rung under DDP (or FSDP2), every rank on its own windows."""
    return distributed_task(ctx, rung, steps, warmup=warmup, tokens=tokens,
                            n_tokens=n_tokens, id_range=id_range, fsdp=fsdp)


def _task_gpt2_interleaved(ctx, rung: dict, steps: int = 10, rounds: int = 4, warmup: int = 2,
                           tokens: str | None = None, n_tokens: int = 4_000_000,
                           id_range: int = 8192) -> dict:
    """Chapter 10's GPT-2 rung under DDP and alone on every rank, timed in interleaved rounds.

    Each rank builds the rung twice from the same initial weights with the page's step
    (:mod:`perflab.gpt2.steps`): once wrapped in DDP, once alone (no communication: every GPU
    runs the one-GPU reference at the same time, so both see the same clocks and power), both
    reading this rank's windows. After ``warmup`` steps of each (compilation), the two are timed
    in ``rounds`` alternating rounds of ``steps`` steps (:func:`interleaved_rounds`; each
    round's time is the slowest rank's mean). Returns ``{"times": {"one GPU": [...], "DDP":
    [...]}, "orders", "median_s", "efficiency" (median one-GPU step / median DDP step),
    "world_size", "tokens_per_step"}``.
    """
    torch, r = ctx.torch, rung_from_dict(rung)
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
    times, orders = interleaved_rounds(steps_by, lambda fn: ctx.timed(fn, 1, steps), rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"times": times, "orders": orders, "median_s": med,
            "efficiency": med["one GPU"] / med["DDP"], "world_size": ctx.world,
            "tokens_per_step": r.tokens_per_step}


TASKS = {
    "gpt2": _task_gpt2, "gpt2_interleaved": _task_gpt2_interleaved,
    "collectives": _task_collectives, "sweep": _task_sweep, "manual_vs_ddp": _task_manual_vs_ddp,
    "buckets": _task_buckets, "overlap": _task_overlap, "no_sync": _task_no_sync,
    "sharding": _task_sharding, "dcp_save": _task_dcp_save, "dcp_load": _task_dcp_load,
    "train_ckpt": _task_train_ckpt, "hang": _task_hang, "die": _task_die,
    "user_allreduce": _task_user_allreduce, "user_optimizer": _task_user_optimizer,
}


_STARTED = timestamp()


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="perflab.distributed.training worker (launched by torchrun)")
    parser.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("this worker runs under torchrun; call perflab.distributed.training.launch() instead")
    spec = json.loads(Path(args.spec).read_text())
    timeout = datetime.timedelta(seconds=float(spec.get("pg_timeout_s", 60)))
    user = None
    if spec.get("user_code"):
        mod_spec = importlib.util.spec_from_file_location("perflab_user_code", spec["user_code"])
        user = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(user)
    # torchrun keeps its key-value store across --max-restarts: a restarted group that used the
    # same keys would read the dead attempt's addresses (gloo: "connectFullMesh failed ...
    # Connection refused"), so every attempt gets its own key prefix
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # the store waits for late ranks (imports on a busy machine): never shorter than 5 minutes,
    # whatever the collectives' timeout
    store_timeout = max(timeout, datetime.timedelta(minutes=5))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_store, timeout=store_timeout)
    store = dist.PrefixStore(f"perflab-attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    if args.backend == "nccl":
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device,
                                timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        ctx = _Ctx(torch, dist, device, spec["scratch"], user)
        results, task_s = {}, {}
        for task in spec["tasks"]:
            key = task.get("key", task["name"])
            with Stopwatch() as task_clock:
                results[key] = TASKS[task["name"]](ctx, **task.get("args", {}))
            task_s[key] = task_clock.seconds
        record = {"rank": ctx.rank, "world_size": ctx.world, "local_rank": int(os.environ["LOCAL_RANK"]),
                  "node": int(os.environ.get("GROUP_RANK", 0)),
                  "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "torch": torch.__version__, "results": results, "task_s": task_s,
                  "started": _STARTED}
        if device.type == "cuda":
            v = torch.cuda.nccl.version()
            record["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        tmp = Path(args.out_dir) / f"rank{ctx.rank}.partial"
        tmp.write_text(json.dumps(record))
        tmp.replace(Path(args.out_dir) / f"rank{ctx.rank}.json")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
