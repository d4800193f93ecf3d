"""The one ``torchrun`` launcher: a notebook starts several processes and gets their output back.

A notebook is one process, so every multi-process experiment of the course (chapter 2's
all-reduce sweep, chapter 8's data parallelism and sharding, lab 8, chapter 10's GPT-2 under
DDP) starts ``python -m torch.distributed.run ... <worker>`` through :func:`run`: one "node"
(``--standalone``) or two on this machine (``--nnodes 2`` with a c10d rendezvous on a free
localhost port: two nodes that find each other as two machines would). The children's
environment keeps this package importable, ``NCCL_NVLS_ENABLE=0`` (NVLink SHARP multicast stays
off on the course's machines) and every temporary file inside the launch's scratch folder. A
launch that fails or outlives its timeout raises :class:`LaunchError`, whose message names the
command, the exit status, the error lines the ranks printed and the last lines of output.

Whatever ends a launch early (its timeout, a failed node, an exception or an interrupt in the
notebook while it waits), no process of it survives: :func:`stop` sends SIGTERM to each
``torchrun`` still running, which stops its workers and exits (within about a second), gives
it :data:`GRACE_S` seconds, then sends SIGKILL to it and to every process it had started. The
workers need that last step: torch's ``SubprocessHandler`` starts each worker in a session of
its own (``start_new_session=True``), so a signal to ``torchrun``'s process group never reaches
them, and a worker that sleeps or waits out its process group's timeout would outlive a
``torchrun`` killed alone.

The workers are the modules that launch them (``perflab.machine.interconnect``,
``perflab.distributed.worker``): each parses its own arguments, takes its device from
:func:`worker_device` and writes its results as JSON where the launcher told it to. A gloo
launch runs its ranks on the CPU and hides the GPUs from them (``CUDA_VISIBLE_DEVICES=""``): on a
machine with one GPU, a gloo rank that reached for ``cuda:<local rank>`` (rank 1 asking for a
second GPU) failed with "invalid device ordinal"; with the GPUs hidden, no library inside the
rank (FSDP's default device mesh, a checkpoint planner) can reach for one.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from perflab.core.device import gpu_count
from perflab.core.timing import Deadline
from perflab.core.validate import integer, positive, positive_int

__all__ = ["BACKENDS", "GRACE_S", "Launch", "LaunchError", "backend_for", "default_backend", "descendants",
           "free_port", "run", "stop", "worker_device"]

#: the process-group backends a launch may use: NCCL between GPUs, gloo between CPU processes
BACKENDS = ("nccl", "gloo")

#: seconds a ``torchrun`` has, after SIGTERM, to stop its workers before everything is killed
GRACE_S = 10.0


class LaunchError(RuntimeError):
    """A ``torchrun`` launch failed: the message holds the command, exit status and the workers' output.

    ``output`` holds the whole output of the launch (every rank's lines and torchrun's), of
    which the message shows the error lines and the last lines only. ``results`` holds, by
    global rank, what each rank finished before the failure where the launcher could read it
    (:func:`perflab.distributed.launch.launch`: a rank's record, or None), else None.
    """

    def __init__(self, message: str, output: str = "", results: list | None = None) -> None:
        super().__init__(message)
        self.output = output
        self.results = results


def default_backend() -> str:
    """``"nccl"`` when at least two GPUs are visible, else ``"gloo"`` (CPU processes)."""
    return "nccl" if gpu_count() >= 2 else "gloo"


def backend_for(backend: str | None, world: int) -> str:
    """``backend`` (default :func:`default_backend`), checked for ``world`` processes.

    Raises:
        ValueError: an unknown backend, or ``nccl`` with fewer GPUs than processes.
    """
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if backend == "nccl" and gpu_count() < world:
        raise ValueError(f"backend='nccl' with {world} processes needs {world} GPUs; "
                         f"this machine has {gpu_count()}")
    return backend


def worker_device(backend: str, local_rank: int) -> torch.device:
    """The device a rank computes on, chosen from its backend alone: ``cpu`` for gloo (whatever
    GPUs the machine has), ``cuda:<local_rank>`` for NCCL (one GPU per rank of a node).

    Raises:
        ValueError: an unknown backend, a negative ``local_rank``, or NCCL on a rank whose
            ``local_rank`` names no GPU of this process (no CUDA, or fewer GPUs than ranks):
            the message says so, instead of CUDA's "invalid device ordinal" later.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    integer("local_rank", local_rank, 0)
    if backend == "gloo":
        return torch.device("cpu")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank >= have:
        raise ValueError(f"backend='nccl' puts local rank {local_rank} on cuda:{local_rank}, but this "
                         f"process sees {have} GPU(s): launch at most {have} ranks per node, or gloo")
    return torch.device("cuda", local_rank)


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of ``/proc/<pid>/stat``),
    or None when it is gone or there is no ``/proc``: with its pid, a process's identity."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 2:].split()   # the name in parentheses may hold spaces
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every process under ``pid`` (its children, their children...) as ``(pid, start time)``
    pairs read from ``/proc`` (:func:`_started`); ``[]`` where there is no ``/proc`` (not Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            started = _started(child)
            if started is not None:
                found.append((child, started))
            todo.append(child)
    return found


def stop(procs: Sequence[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """End every ``torchrun`` of ``procs`` still running, and every process it started.

    Each was started in a session of its own (:func:`run`). The processes under it are noted,
    then its process group gets SIGTERM: ``torchrun`` forwards it to its workers and exits.
    Whatever is still running after ``grace_s`` seconds gets SIGKILL: the ``torchrun`` (its
    group), then every noted process that is still the same process (same pid and start time,
    so a pid the system has since reused is left alone), each a session leader or not; it
    returns once they are gone (at most 2 s more). Processes that already ended are left as
    they are (their exit status is kept for the caller).

    Raises:
        ValueError: ``grace_s`` is not a positive number.
    """
    positive("grace_s", grace_s)
    running = [p for p in procs if p.poll() is None]
    noted = [d for p in running for d in descendants(p.pid)]
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = Deadline(grace_s)
    for p in running:
        try:
            p.wait(timeout=max(deadline.left_s(), 0.01))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    left = [(pid, started) for pid, started in noted if _started(pid) == started]
    for pid, _ in left:          # workers torchrun did not stop: each in a session of its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(100):         # SIGKILL takes effect at once, the process's end a moment later
        left = [(pid, started) for pid, started in left if _started(pid) == started]
        if not left:
            break
        time.sleep(0.02)


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(extra: dict | None = None, scratch: str | os.PathLike | None = None,
               backend: str | None = None) -> dict:
    """The environment of a ``torchrun`` launch: perflab importable, NVLink multicast off, for a
    gloo launch no GPU visible (its ranks compute on the CPU: module docstring), and, with
    ``scratch``, every temporary file of torchrun and its workers (torchrun's ``torchelastic_*``
    log folders, Inductor's precompiled headers, ``tempfile`` users) inside ``scratch/tmp``, a
    folder of the launch's own scratch directory, removed with it. ``extra`` is applied last."""
    env = dict(os.environ)
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if scratch is not None:
        tmp = Path(scratch) / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on the course's machines
    env.setdefault("OMP_NUM_THREADS", "1")  # silences torchrun's warning; collectives need no BLAS threads
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _tail(text: str, lines: int = 25) -> str:
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


_ERROR_LINE = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?([A-Za-z_.]*(?:Error|Exception)): (.+)$")


# What a rank logs when a collective times out without a Python exception: NCCL's watchdog
# thread ("Watchdog caught collective operation timeout: WorkNCCL(...) ran for 10012
# milliseconds before timing out."), then the c10::DistBackendError it terminates the process
# with. torchrun's own summary ("ChildFailedError", "exitcode", "Signal 6") is left out.
_RANK_ERROR_MARKERS = ("Watchdog caught collective operation timeout", "DistBackendError",
                       "timed out", "Timed out")
_TORCHRUN_LINE = ("ChildFailedError", "torch.distributed.elastic", "exitcode", "traceback :")
# the glog prefix of C++ log lines: "[E1130 23:46:25.123456 12345 ProcessGroupNCCL.cpp:685] "
_GLOG_PREFIX = re.compile(r"\[[EWIF]\d{4} [\d:.]+ \d+ [^\]]+\] ?")


def _worker_errors(text: str) -> str:
    """The error lines the ranks printed, in order, at most five, torchrun's own left out.

    An error line is a Python exception line (``ValueError: ...``, with or without torchrun's
    ``[rank0]:`` prefix) or a line in which a rank reports a collective's timeout (NCCL's
    watchdog, a ``DistBackendError``, gloo's "Timed out waiting ..."); the C++ log prefix
    (severity, time, thread, source line) is dropped. ``what():`` lines repeat the watchdog's
    message and are skipped.
    """
    found = []
    for line in text.splitlines():
        m = _ERROR_LINE.match(line)
        if m:
            keep = "ChildFailedError" not in m.group(1)
        else:
            keep = (any(k in line for k in _RANK_ERROR_MARKERS)
                    and not any(k in line for k in _TORCHRUN_LINE) and "what():" not in line)
        line = _GLOG_PREFIX.sub("", line).strip()
        if keep and line not in found:
            found.append(line)
    return "\n".join(found[:5]) or "(no exception line found in the output)"


def _failure(summary: str, cmd: list[str], output: str) -> LaunchError:
    return LaunchError(f"{summary}: {' '.join(cmd)}\n--- worker errors ---\n{_worker_errors(output)}\n"
                       f"--- last lines of output ---\n{_tail(output)}", output)


@dataclass(frozen=True)
class Launch:
    """A finished launch: the first ``torchrun`` command and the output of every process
    (``[node i]`` headers with two nodes)."""

    cmd: tuple[str, ...]
    output: str

    def failure(self, summary: str) -> LaunchError:
        """A :class:`LaunchError` for this launch, starting with ``summary``."""
        return _failure(summary, list(self.cmd), self.output)


def run(worker: Sequence[str], scratch: str | os.PathLike, nproc: int = 2, nnodes: int | str = 1,
        backend: str | None = None, timeout_s: float = 300, max_restarts: int = 0,
        env: dict | None = None) -> Launch:
    """Run ``python -m torch.distributed.run <options> <worker...>`` on ``nnodes x nproc``
    processes of this machine and wait for all of them.

    Args:
        worker: what torchrun runs, e.g. ``["-m", "perflab.machine.interconnect", "--out",
            path, ...]`` (the worker's own arguments included).
        scratch: an existing folder of the launch (the caller removes it): the processes' logs
            and temporary files go there.
        nproc: processes per node (>= 1).
        nnodes: 1 (``--standalone``) or 2 (two ``torchrun`` on this machine, c10d rendezvous
            on ``localhost:<free port>``; with NCCL each node sees its own GPUs), or an elastic
            ``"MIN:MAX"`` (``1 <= MIN <= MAX <= 2``): MIN ``torchrun`` processes start with
            ``--nnodes=MIN:MAX``, so the job runs on the nodes it has (a node lost and not
            replaced leaves a smaller world, not a hung one).
        backend: checked by :func:`backend_for` (the worker is told which one to use by its
            own arguments).
        timeout_s: seconds before the launch is stopped (> 0): :func:`stop`, then no process
            of it is left.
        max_restarts: torchrun's ``--max-restarts`` (>= 0).
        env: variables added to the children's environment.

    Returns:
        the :class:`Launch` (command and output); the caller reads what the workers wrote.

    Raises:
        ValueError: a bad ``nproc``, ``nnodes``, ``timeout_s``, ``max_restarts`` or backend.
        LaunchError: a process exited with a non-zero status, or the timeout passed (the
            message says which, with the workers' error lines and last lines of output).
    """
    positive_int("nproc", nproc)
    elastic = None
    if isinstance(nnodes, str):
        lo, _, hi = nnodes.partition(":")
        if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi) <= 2):
            raise ValueError(f"an elastic nnodes must be 'MIN:MAX' with 1 <= MIN <= MAX <= 2, "
                             f"got {nnodes!r}")
        nnodes, elastic = int(lo), f"--nnodes={lo}:{hi}"
    integer("nnodes", nnodes, 1, 2)
    positive("timeout_s", timeout_s)
    integer("max_restarts", max_restarts, 0)
    backend = backend_for(backend, nproc * nnodes)
    scratch = Path(scratch)
    base = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}"]
    if nnodes == 1 and elastic is None:
        cmds = [base + ["--standalone", *map(str, worker)]]
    else:
        endpoint, rid = f"localhost:{free_port()}", f"perflab-{uuid.uuid4().hex[:8]}"
        rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rid}"]
        if elastic:  # an elastic job starts once MIN nodes have joined, after a short last call
            rdzv.append("--rdzv-conf=last_call_timeout=2")
        cmds = [base + [elastic or f"--nnodes={nnodes}", *rdzv, *map(str, worker)]
                for _ in range(nnodes)]
    envs = [_child_env(env, scratch=scratch, backend=backend) for _ in cmds]
    if backend == "nccl" and nnodes > 1:  # each "node" sees its own GPUs, as on two machines
        visible = envs[0].get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(gpu_count())]
        for i, e in enumerate(envs):
            e["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * nproc:(i + 1) * nproc])
    logs = [open(scratch / f"node{i}.log", "w+") for i in range(len(cmds))]
    procs = [subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, text=True, env=e,
                              start_new_session=True) for c, e, f in zip(cmds, envs, logs)]
    deadline = Deadline(timeout_s)
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            if deadline.expired():
                failed = f"torchrun timed out after {timeout_s:g} s"
                break
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad:  # one node failed: the other would wait for it until its own timeout
                failed = f"torchrun exited with status {bad[0].returncode}"
                break
            time.sleep(0.05)
    finally:  # a timeout, a failed node, an exception or an interrupt: nothing survives
        stop(procs)
        output = ""
        for i, f in enumerate(logs):
            f.seek(0)
            text = f.read()
            f.close()
            output += (f"[node {i}]\n" if len(logs) > 1 else "") + text
    launch = Launch(tuple(cmds[0]), output)
    if failed is None:
        codes = [p.returncode for p in procs]
        if any(codes):
            failed = f"torchrun exited with status {max(codes, key=abs)}"
    if failed:
        raise launch.failure(failed)
    return launch
