"""The notebook side of a launch: start chapter 8's experiments on several ranks and read their results.

A notebook is one process, so :func:`launch` starts ``torchrun`` (one or two "nodes" on this
machine, through :func:`perflab.core.torchrun.run`) running :mod:`perflab.distributed.worker` with
a list of *tasks*; every rank writes its results as JSON into a temporary folder and the launcher
returns them, one dict per rank. A launch that outlives ``timeout_s`` is stopped, every
``torchrun`` and every worker of it (:func:`perflab.core.torchrun.stop`), and raises
:class:`perflab.core.torchrun.LaunchError`.
:func:`expect_failure` runs a job that must fail (a hung rank) and says how long the failure
took and what the ranks printed on the way.

How many ranks: :func:`host_ranks` (NCCL: one per GPU; gloo: 4 processes of 2 threads on a host
of 8 cores or more, else 2 of 1).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from perflab.core import torchrun
from perflab.core.device import gpu_count
from perflab.core.timing import Stopwatch, seconds_since
from perflab.core.torchrun import LaunchError
from perflab.core.validate import integer, positive, positive_int
from perflab.distributed.failures import ENV_MARKER, FAIL_FAST_ENV, RECORD_MARKER, WAIT_MARKER
from perflab.distributed.worker import FINISHED, rank_cpus, task_function

__all__ = ["Failure", "expect_failure", "host_ranks", "launch", "pick_for", "pinned_cores", "source_of"]


def host_ranks(backend: str, cores: int | None = None) -> tuple[int, int | None]:
    """``(ranks, threads per rank)`` for a launch on this machine.

    NCCL: one rank per GPU (threads left to torch). gloo: the ranks compute on the host's CPU
    cores: 4 ranks on a host of 8 cores or more (the smallest count at which the ring's bus
    factor, 1.5, differs from two ranks' 1), each with ``cores // 8`` threads (at least 1), so
    that half the cores stay for the ranks' gloo threads and the notebook; on a smaller host,
    2 ranks of 1 thread.

    Args:
        backend: ``"nccl"`` or ``"gloo"``.
        cores: the host's cores (default: those this process may run on).

    Raises:
        ValueError: an unknown backend or a ``cores`` below 1.
    """
    if backend not in torchrun.BACKENDS:
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    positive_int("cores", cores)
    if backend == "nccl":
        return gpu_count(), None
    return (4, max(1, cores // 8)) if cores >= 8 else (2, 1)


def pinned_cores(nproc: int, threads: int | None) -> int | None:
    """How many cores of its own each of ``nproc`` gloo ranks of a :func:`launch` on this one
    machine is pinned to (:func:`perflab.distributed.worker.rank_cpus` over the cores this
    process may run on, which the workers inherit), or None: too few cores, the ranks share them.

    Raises:
        ValueError: ``nproc`` or ``threads`` below 1.
    """
    positive_int("nproc", nproc)
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = rank_cpus(os.sched_getaffinity(0), 0, nproc, threads)
    return len(cpus) if cpus else None


def pick_for(backend: str, cpu, gpu):
    """``gpu`` when the workers will run on GPUs (``backend == "nccl"``), else ``cpu``.

    Unlike :func:`perflab.core.device.pick`, this follows where the *workers* run: a machine with
    one GPU launches gloo processes on its CPU and must use CPU sizes.
    ``PERFLAB_FORCE_CPU_SIZES=1`` forces ``cpu``.

    Raises:
        ValueError: ``backend`` is not ``"nccl"`` or ``"gloo"``.
    """
    if backend not in torchrun.BACKENDS:
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if os.environ.get("PERFLAB_FORCE_CPU_SIZES") == "1":
        return cpu
    return gpu if backend == "nccl" else cpu


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


def launch(tasks: Sequence[dict], nproc: int = 2, backend: str | None = None, timeout_s: float = 120,
           nnodes: int | str = 1, max_restarts: int = 0, pg_timeout_s: float = 60, env: dict | None = None,
           user_code: Sequence = (), threads: int | None = None,
           split_comm: bool = False) -> list[dict]:
    """Run ``tasks`` in :mod:`perflab.distributed.worker` on ``nnodes x nproc`` processes; one
    result dict per rank.

    ``nnodes == 1``: ``torchrun --standalone --nproc-per-node <nproc>`` (its own free port).
    ``nnodes == 2``: two ``torchrun`` processes on this machine, ``--nnodes 2`` with a c10d
    rendezvous on ``localhost:<free port>``: two "nodes" that find each other exactly as two
    machines would. ``nnodes == "MIN:MAX"`` (an elastic job, e.g. ``"1:2"``): ``MIN``
    ``torchrun`` processes with ``--nnodes=MIN:MAX`` start, as if the other nodes had been lost;
    the rendezvous waits ``last_call_timeout`` (2 s here) for more, then runs the job on the
    ``MIN x nproc`` ranks it has. ``max_restarts`` is torchrun's ``--max-restarts``.
    ``pg_timeout_s`` is the process group's timeout (``init_process_group(timeout=...)``): a
    collective that waits longer raises on gloo, and NCCL's watchdog aborts the process.
    ``user_code``: functions (or source text) written to a module the worker imports (tasks
    ``user_allreduce``, ``user_optimizer``, ``user_sampler``). ``threads``: torch's intra-op
    threads in each rank (None: torch's default, which ``torchrun`` sets to 1).

    Each task is ``{"name": <task>, "args": {...}, "key": <optional result key>}``, ``<task>`` a
    short name of :data:`perflab.distributed.worker.TASK_MODULES` or ``"package.module:function"``.
    Returns a list indexed by global rank of ``{"rank", "world_size", "node", "local_rank",
    "restart_count", "device", "threads", "cpus", "results": {key: task result}, "task_s": {key:
    s}}``. On one node, each gloo rank is pinned to its own slice of the host's cores where
    every slice holds at least twice ``threads`` cores (``"cpus"``, else None:
    :func:`perflab.distributed.worker.rank_cpus`); its compute threads and gloo's share the
    slice. ``split_comm=True`` cuts the slice in two (:func:`perflab.distributed.worker.split_slice`:
    compute on ``"cpus"``, gloo's threads on ``"comm_cpus"``), which two reference runs measured
    slower inside a step (see there), so it is off unless asked for.

    Raises:
        ValueError: bad ``nproc``/``nnodes``/``threads``/backend/task name; ``nccl`` without
            enough GPUs.
        LaunchError: a worker failed, the launch timed out (no process of it survives), or a rank
            wrote no result; the message holds the command, status and the workers' last lines.
            Where a worker failed or the launch timed out, its ``results`` holds, by global
            rank, the record of the tasks that rank finished before (as above), or None.
    """
    positive_int("nproc", nproc)
    if not isinstance(nnodes, str):
        integer("nnodes", nnodes, 1, 2)
    positive("pg_timeout_s", pg_timeout_s)
    if threads is not None:
        positive_int("threads", threads)
    world = nproc * (int(nnodes.split(":")[0]) if isinstance(nnodes, str) else nnodes)
    backend = torchrun.backend_for(backend, world)
    tasks = [dict(t) for t in tasks]
    for t in tasks:
        task_function(t.get("name"))
    with tempfile.TemporaryDirectory(prefix="perflab-par-") as tmp:
        tmp = Path(tmp)
        spec = {"tasks": tasks, "pg_timeout_s": pg_timeout_s, "scratch": str(tmp / "scratch"),
                "threads": threads, "pin": nnodes == 1,   # two "nodes" on one host: unpinned
                "split": bool(split_comm)}
        if user_code:
            (tmp / "user_code.py").write_text("import torch\nimport torch.distributed as dist\n\n\n"
                                              + "\n\n".join(source_of(f) for f in user_code))
            spec["user_code"] = str(tmp / "user_code.py")
        (tmp / "spec.json").write_text(json.dumps(spec))
        (tmp / "scratch").mkdir()
        worker = ["-m", "perflab.distributed.worker", "--backend", backend, "--out-dir", str(tmp),
                  "--spec", str(tmp / "spec.json")]
        if threads is not None:
            env = {"OMP_NUM_THREADS": str(threads), **(env or {})}
        try:
            done = torchrun.run(worker, tmp, nproc=nproc, nnodes=nnodes, backend=backend,
                                timeout_s=timeout_s, max_restarts=max_restarts, env=env)
        except LaunchError as e:     # what each rank finished before it failed, kept
            finished = [json.loads(f.read_text()) if f.exists() else None
                        for f in (tmp / f"rank{r}{FINISHED}" for r in range(world))]
            # the same error (message, output, traceback) with the ranks' results: not
            # chained, so a notebook shows the long message once
            raise LaunchError(str(e), e.output, finished).with_traceback(e.__traceback__) from None
        results = []
        for r in range(world):
            path = tmp / f"rank{r}.json"
            if not path.exists():
                raise done.failure(f"the workers exited cleanly but rank {r} wrote no result")
            results.append(json.loads(path.read_text()))
        return results


def _marked(output: str, marker: str) -> list[str]:
    """The text after ``marker`` on every line of ``output`` that holds it."""
    return [line[line.find(marker) + len(marker):].strip() for line in output.splitlines() if marker in line]


def wait_start(output: str) -> float | None:
    """The earliest time (Unix seconds) a rank printed that it started waiting, or None."""
    times = []
    for text in _marked(output, WAIT_MARKER):
        with contextlib.suppress(IndexError, ValueError):
            times.append(float(text.split()[1]))
    return min(times) if times else None


def rank_env(output: str) -> dict | None:
    """The fail-fast variables as the first waiting rank printed them (None: not printed)."""
    for text in _marked(output, ENV_MARKER):
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return None


def parse_flight_records(output: str) -> tuple[dict[int, dict | None], list[str]]:
    """Every rank's flight record in ``output``, and what could not be read.

    Returns ``(records, dropped)``: ``records`` is ``{rank: its last flight-recorder entry on
    the hung group}`` (``{"op", "seq", "sizes"}``, or None for a rank that printed an empty
    record); ``dropped`` holds one message for each ``RECORD_MARKER`` that was followed by no
    readable record (the text after the marker, cut at 120 characters, and why it failed).
    A record is the JSON object right after the marker; what follows it on the same line
    (another rank's output, a second marker) is read separately, so two ranks' lines run
    together lose neither record.
    """
    found: dict[int, dict | None] = {}
    dropped: list[str] = []
    decoder = json.JSONDecoder()
    for line in output.splitlines():
        for text in line.split(RECORD_MARKER)[1:]:
            text = text.strip()
            try:
                record, _ = decoder.raw_decode(text)
                found[int(record["rank"])] = record["last"]
            except (ValueError, KeyError, TypeError) as e:
                dropped.append(f"a {RECORD_MARKER} line did not parse "
                               f"({type(e).__name__}: {e}): {text[:120]!r}")
    return found, dropped


def flight_records(output: str) -> dict[int, dict | None]:
    """``{rank: its last flight-recorder entry on the hung group}`` as each rank printed it
    (``{"op", "seq", "sizes"}``, or None for a rank that printed an empty record); the records
    of :func:`parse_flight_records`, whose second value says what was dropped."""
    return parse_flight_records(output)[0]


@dataclass(frozen=True)
class Failure:
    """A launch that failed as intended.

    Attributes:
        seconds: from the launch to the error, start-up included.
        message: the :class:`LaunchError` message.
        output: the launch's whole output (every rank's lines and torchrun's).
        after_wait_s: seconds from the moment the first rank started waiting in the hung
            collective (task ``hang``) to the end of the job; None for other tasks.
        rank_env: the :data:`perflab.distributed.failures.FAIL_FAST_ENV` variables as a waiting
            rank saw them in its own environment (``{name: value or None}``, task ``hang``).
        flight_records: :func:`flight_records` of the output (task ``hang``; empty otherwise).
        flight_dropped: a message for each flight-record line that did not parse
            (:func:`parse_flight_records`); empty when none was dropped.
        results: by global rank, the record of the tasks that rank finished before the
            failure, as :func:`launch` returns a rank's (``results``, ``task_s``, ...), or None
            (it finished none): one launch can run experiments and then fail on purpose.
    """

    seconds: float
    message: str
    output: str = ""
    after_wait_s: float | None = None
    rank_env: dict | None = None
    flight_records: dict | None = None
    flight_dropped: tuple[str, ...] = ()
    results: list | None = None

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
                    and "torch.distributed.run" not in line and ENV_MARKER not in line:
                return line.strip()
        return self.message.splitlines()[0]


def expect_failure(tasks: Sequence[dict], env: dict | None = None, **kwargs) -> Failure:
    """Run :func:`launch` on a job that must fail; return how long the failure took, what the
    ranks printed and what their tasks before the failure returned (``Failure.results``).

    The ranks run with :data:`perflab.distributed.failures.FAIL_FAST_ENV` (then ``env`` on
    top), so that an NCCL timeout ends the process as soon as the watchdog sees it.

    Raises:
        RuntimeError: the job succeeded.
    """
    clock = Stopwatch().start()
    try:
        launch(tasks, env={**FAIL_FAST_ENV, **(env or {})}, **kwargs)
    except LaunchError as e:
        seconds = clock.elapsed()
        output = e.output
        started = wait_start(output)      # a timestamp() the hung rank printed
        records, dropped = parse_flight_records(output)
        return Failure(seconds, str(e), output, None if started is None else seconds_since(started),
                       rank_env(output), records, tuple(dropped), e.results)
    raise RuntimeError(f"the job {[t['name'] for t in tasks]} was expected to fail but succeeded")
