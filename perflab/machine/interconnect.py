"""Chapter 2's interconnect: how GPUs are linked, and how fast an all-reduce crosses the link.

The topology (``nvidia-smi topo -m``), the bus bandwidth of a collective and its alpha-beta model,
and an all-reduce sweep measured on several processes. A notebook cannot itself be several
processes, so :func:`launch` starts this module as the
worker of ``torchrun`` through the course's one launcher, :func:`perflab.core.torchrun.run`.
Rank 0 writes its results as JSON to a file named by the launcher, which reads it back; when any
worker fails, :class:`perflab.core.torchrun.LaunchError` carries the exit status and the
tail of the workers' output.

Bandwidth of an all-reduce is reported as in NVIDIA's nccl-tests (``doc/PERFORMANCE.md``):

* algorithm bandwidth ``algbw = S / t`` for a buffer of ``S`` bytes reduced in ``t`` seconds;
* bus bandwidth ``busbw = algbw * 2 (n - 1) / n`` on ``n`` ranks: a ring all-reduce sends and
  receives ``2 (n - 1) / n * S`` bytes per rank (Patarasuk and Yuan, JPDC 69(2), 2009), so busbw
  is the per-rank link speed the collective achieved, comparable with a peer-copy bandwidth
  whatever ``n`` is.

Run as a worker (by torchrun only): ``python -m perflab.machine.interconnect --out FILE allreduce
--sizes 1024,1048576 [--backend nccl|gloo] [--target-bytes B]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist

from perflab.core.fits import fit_line
from perflab.core.telemetry import Telemetry
from perflab.core.timing import seconds_per_call
from perflab.core.validate import integer, positive
from perflab.core import torchrun
from perflab.core.torchrun import default_backend

__all__ = [
    "COLLECTIVES",
    "AlphaBeta",
    "AllReducePoint",
    "AllReduceResult",
    "algorithm_bandwidth",
    "bus_factor",
    "allreduce_sweep",
    "alpha_beta",
    "fit_alpha_beta",
    "allreduce_time",
    "bus_bandwidth",
    "gpu_link",
    "launch",
    "topology_text",
    "TWO_GPU_RUN",
    "two_gpu_run",
]


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """``nbytes / seconds``: the buffer size over the collective's time, in bytes/s (nccl-tests' algbw).

    Raises:
        ValueError: ``nbytes`` negative or ``seconds`` not positive.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    positive("seconds", seconds)
    return nbytes / seconds


#: the collectives of ``torch.distributed`` whose bus factor :func:`bus_factor` knows
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth for ``op`` on ``world_size`` ranks.

    ``all_reduce``: ``2 (n-1)/n``; ``all_gather``, ``reduce_scatter``, ``all_to_all``: ``(n-1)/n``;
    ``broadcast``, ``reduce``: 1 (nccl-tests, doc/PERFORMANCE.md): the bytes each rank sends (and
    receives) per byte of the buffer, so that the bus bandwidth compares with a link's speed
    whatever the number of ranks.

    Raises:
        ValueError: unknown ``op`` or ``world_size`` < 2.
    """
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")
    integer("world_size", world_size, 2)
    n = world_size
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}.get(op, (n - 1) / n)


def _check_world(world_size) -> None:
    integer("world_size", world_size, 2)  # an all-reduce on one rank moves no data


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in bytes/s: ``algbw * 2 (n - 1) / n`` (nccl-tests, doc/PERFORMANCE.md).

    Raises:
        ValueError: ``world_size`` < 2, or a bad ``nbytes``/``seconds``.
    """
    _check_world(world_size)
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


def allreduce_time(nbytes: float, busbw: float, world_size: int, latency_s: float = 0.0) -> float:
    """Predicted seconds for an all-reduce of ``nbytes`` on ``world_size`` ranks at bus bandwidth ``busbw``.

    ``latency_s + nbytes * 2 (n - 1) / n / busbw``: the inverse of :func:`bus_bandwidth`, plus a
    fixed start-up cost (the alpha of the alpha-beta model).

    Raises:
        ValueError: ``world_size`` < 2, ``busbw`` not positive, or negative ``nbytes``/``latency_s``.
    """
    _check_world(world_size)
    positive("busbw", busbw)
    if nbytes < 0 or latency_s < 0:
        raise ValueError(f"nbytes and latency_s must be >= 0, got {nbytes}, {latency_s}")
    return latency_s + nbytes * 2 * (world_size - 1) / world_size / busbw


#: The course's one measurement of an all-reduce between two H200s over NVLink so far (30 November
#: 2026, chapter 8's first edition): the inputs of chapter 8's predictions for GPUs.
TWO_GPU_RUN = Path(__file__).resolve().parent.parent / "data" / "allreduce_2xh200_2026-11-30.json"


def two_gpu_run(path: str | os.PathLike = TWO_GPU_RUN) -> dict:
    """The two-GPU all-reduce figures kept in ``path`` (default :data:`TWO_GPU_RUN`).

    Keys: ``measured`` (UTC start of the run), ``devices``, ``torch``, ``source`` (the notebook
    and commit they come from, and the run record that keeps them, ``runs/*.json``), ``method``
    (how each size was timed), ``smallest_bytes`` and ``smallest_s`` (the smallest message and
    the time of one all-reduce of it, seconds: the start-up alpha and a little), ``largest_bytes``
    and ``largest_busbw`` (the largest message and its all-reduce bus bandwidth, bytes/s),
    ``all_gather_busbw`` and ``reduce_scatter_busbw`` (the same message's, bytes/s),
    ``link_one_way`` (the datasheet's NVLink bandwidth each way, bytes/s) and ``known_defects``
    (what a review found wrong in the page that measured them).

    Raises:
        ValueError: the file is not such a record (its ``schema``).
    """
    data = json.loads(Path(path).read_text())
    if data.get("schema") != "perflab-allreduce-run/1":
        raise ValueError(f"{path} is not an all-reduce run record (schema {data.get('schema')!r})")
    return data


# ---------------------------------------------------------------------------------------------
# Topology
# ---------------------------------------------------------------------------------------------

def topology_text() -> str | None:
    """The output of ``nvidia-smi topo -m`` (the GPU/NIC/CPU connection matrix), or None when
    ``nvidia-smi`` is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def gpu_link(text: str, src: int = 0, dst: int = 1) -> str | None:
    """The link type between GPU ``src`` and GPU ``dst`` in ``nvidia-smi topo -m`` output.

    E.g. ``"NV18"`` (18 bonded NVLinks), ``"PIX"``/``"PXB"`` (PCIe switches), ``"PHB"`` (PCIe host
    bridge), ``"NODE"``/``"SYS"`` (across host bridges or CPU sockets). None if not found.
    """
    rows = {}
    header = None
    # nvidia-smi underlines the header row with terminal escape codes ("\x1b[4mGPU0 ..."), seen on
    # the H200 reference machine: strip them before matching
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if header is None and cells[0].startswith("GPU0"):
            header = cells
            continue
        if header is not None and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            rows[int(cells[0][3:])] = cells[1:]
    if header is None or src not in rows:
        return None
    column = f"GPU{dst}"
    if column not in header:
        return None
    cells = rows[src]
    i = header.index(column)
    return cells[i] if i < len(cells) else None


def launch(
    task_args: Sequence[str],
    nproc: int = 2,
    backend: str | None = None,
    timeout_s: float = 300,
    env: dict | None = None,
) -> dict:
    """Run this module's worker on ``nproc`` processes under torchrun; return rank 0's JSON result.

    The worker is ``-m perflab.machine.interconnect --backend <backend> --out <tmp.json>
    <task_args...>``, started by :func:`perflab.core.torchrun.run` (``--standalone``).
    ``backend`` defaults to :func:`~perflab.core.torchrun.default_backend`. ``env`` adds
    variables to the children's environment.

    Raises:
        ValueError: ``nproc`` < 2 or an unknown backend; ``nccl`` with fewer GPUs than processes.
        LaunchError: a worker failed or the launch timed out (the message carries the exit status
            and the last lines the workers printed), or rank 0 wrote no result.
    """
    integer("nproc", nproc, 2)
    backend = torchrun.backend_for(backend, nproc)
    with tempfile.TemporaryDirectory(prefix="perflab-dist-") as tmp:
        out = Path(tmp) / "result.json"
        worker = ["-m", "perflab.machine.interconnect", "--backend", backend, "--out", str(out),
                  *map(str, task_args)]
        done = torchrun.run(worker, tmp, nproc=nproc, backend=backend, timeout_s=timeout_s, env=env)
        if not out.exists():
            raise done.failure(f"the workers exited cleanly but rank 0 wrote no result to {out}")
        return json.loads(out.read_text())


@dataclass(frozen=True)
class AllReducePoint:
    """One message size of an all-reduce sweep.

    Attributes:
        nbytes: buffer size per rank in bytes (float32 elements x 4).
        seconds: time of one all-reduce (the slowest rank's mean over ``iters``).
        iters: timed repetitions.
        algbw: ``nbytes / seconds`` (bytes/s).
        busbw: ``algbw * 2 (n - 1) / n`` (bytes/s).
    """

    nbytes: int
    seconds: float
    iters: int
    algbw: float
    busbw: float


@dataclass(frozen=True)
class AllReduceResult:
    """An all-reduce sweep: ``backend``, ``world_size``, ``device`` kind, ``points``, ``versions``,
    ``timer`` (``"cuda events"`` on GPUs, ``"perf_counter"`` on CPU processes) and ``telemetry``
    (rank 0's :meth:`perflab.core.telemetry.TelemetrySummary.as_dict` over the timed part of the
    sweep: its GPU's clocks and power, or its CPU's clock; empty from a worker that sent none)."""

    backend: str
    world_size: int
    device: str
    points: tuple[AllReducePoint, ...]
    versions: dict
    timer: str = "perf_counter"
    telemetry: dict = field(default_factory=dict)

    @property
    def peak_busbw(self) -> float:
        """The largest bus bandwidth of the sweep, bytes/s."""
        return max(p.busbw for p in self.points)


def allreduce_sweep(
    sizes: Sequence[int],
    nproc: int = 2,
    backend: str | None = None,
    target_bytes: int | None = None,
    timeout_s: float = 300,
) -> AllReduceResult:
    """All-reduce (sum) of float32 buffers of each size in ``sizes`` (bytes) across ``nproc`` processes.

    NCCL on GPUs (one per process) or gloo on CPU processes (see :func:`launch`). Every size is
    first reduced twice (connections, buffers and each protocol set up before anything is timed),
    then each size is warmed up up to 5 more times (``min(5, target_bytes // size)``, at least
    once) and timed over ``max(5, min(200, target_bytes // size))`` back-to-back repetitions after
    a barrier, three times (once where three would move more than ``4 x target_bytes``); a point
    is the median of those runs, of the slowest rank. On GPUs the repetitions are bracketed by CUDA events on the
    stream the collectives wait on (device time, not the host's); on CPU processes by the host clock
    (:func:`perflab.core.timing.seconds_per_call`). Rank 0 runs the timed part (not the launch, nor the set-up) under a
    :class:`perflab.core.telemetry.Telemetry` sampler of its own device: ``result.telemetry``.
    ``target_bytes`` default: 4 GiB for NCCL, 256 MiB for gloo. The
    workers check that the reduction is correct.

    Raises:
        ValueError: empty ``sizes`` or a size that is not a positive multiple of 4 bytes.
        LaunchError: see :func:`launch`.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 4 or s % 4 for s in sizes):
        raise ValueError(f"sizes must be positive multiples of 4 bytes, got {sizes}")
    backend = backend or default_backend()
    if target_bytes is None:
        target_bytes = 4 * 2**30 if backend == "nccl" else 256 * 2**20
    raw = launch(["allreduce", "--sizes", ",".join(map(str, sizes)), "--target-bytes", str(target_bytes)],
                 nproc=nproc, backend=backend, timeout_s=timeout_s)
    n = raw["world_size"]
    points = tuple(AllReducePoint(p["nbytes"], p["seconds"], p["iters"], algorithm_bandwidth(p["nbytes"], p["seconds"]),
                                  bus_bandwidth(p["nbytes"], p["seconds"], n)) for p in raw["points"])
    return AllReduceResult(raw["backend"], n, raw["device"], points, raw.get("versions", {}),
                           raw.get("timer", "perf_counter"), raw.get("telemetry", {}))


@dataclass(frozen=True)
class AlphaBeta:
    """The latency-bandwidth (alpha-beta) model of an all-reduce sweep.

    ``t(S) = alpha + S * 2 (n - 1) / n / busbw`` for a buffer of ``S`` bytes on ``n`` ranks.

    Attributes:
        alpha_s: the fixed cost of one all-reduce (latency), seconds: the intercept.
        busbw: the bus bandwidth the large messages approach, bytes/s: the inverse slope.
        rms_relative: RMS of the relative residuals ``(model - t) / t`` over the sweep.
        points: how many sizes were fitted.
    """

    alpha_s: float
    busbw: float
    rms_relative: float
    points: int

    def seconds(self, nbytes: float, world_size: int) -> float:
        """The model's time for ``nbytes`` on ``world_size`` ranks (:func:`allreduce_time`)."""
        return allreduce_time(nbytes, self.busbw, world_size, max(self.alpha_s, 0.0))

    @property
    def half_bandwidth_bytes(self) -> float:
        """The message size at which the model reaches half of ``busbw``: ``alpha x busbw``
        bytes of bus traffic (for ``n = 2``, bytes per rank)."""
        return self.alpha_s * self.busbw


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], world_size: int,
                   op: str = "all_reduce") -> AlphaBeta:
    """Fit ``t = alpha + S x factor / busbw`` to a sweep of collective ``op`` (message sizes
    ``nbytes``, times ``seconds``) on ``world_size`` ranks, ``factor`` its :func:`bus_factor`:
    :func:`perflab.core.fits.fit_line` on relative residuals, so the small messages, which set
    alpha, weigh as much as the large ones, which set the bandwidth.

    Raises:
        ValueError: fewer than 2 sizes, an unknown ``op``, ``world_size`` < 2, or times that do
            not grow with size.
    """
    factor = bus_factor(op, world_size)
    fit = fit_line([s * factor for s in nbytes], list(seconds), relative=True)
    if fit.slope <= 0:
        raise ValueError(f"{op} time does not grow with message size: no bandwidth to fit")
    return AlphaBeta(fit.fixed, 1.0 / fit.slope, fit.rms_relative, fit.points)


def alpha_beta(result: AllReduceResult) -> AlphaBeta:
    """:func:`fit_alpha_beta` of an all-reduce sweep.

    Raises:
        ValueError: fewer than 2 sizes, or times that do not grow with size.
    """
    return fit_alpha_beta([p.nbytes for p in result.points], [p.seconds for p in result.points],
                          result.world_size)


# ---------------------------------------------------------------------------------------------
# The worker (runs under torchrun)
# ---------------------------------------------------------------------------------------------

def _worker_allreduce(args, dist, torch) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torchrun.worker_device(args.backend, int(os.environ.get("LOCAL_RANK", rank)))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    flag = torch.zeros(1, device=device)

    def barrier():  # an all-reduce of one element works on every backend without extra arguments
        dist.all_reduce(flag)
        sync()

    sizes = [int(s) for s in args.sizes.split(",")]
    for nbytes in sizes:  # every size once before any timing: connections, buffers, protocols
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        del x
    sync()

    def timed(x, iters: int) -> float:
        barrier()
        # on a GPU, device time of the back-to-back collectives (CUDA events)
        return seconds_per_call(lambda: dist.all_reduce(x), iters, device, events=True)

    # rank 0 states the clock the timed part ran at: its GPU's (NVML), or the CPU's read
    # every 0.5 s (parsing /proc/cpuinfo holds the GIL the timing loop needs)
    sampler = (Telemetry(index=device.index or 0, device=device,
                         interval_s=0.02 if device.type == "cuda" else 0.5)
               if rank == 0 else contextlib.nullcontext())
    points = []
    with sampler:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            for _ in range(max(1, min(5, args.target_bytes // nbytes))):
                dist.all_reduce(x)
            iters = max(5, min(200, args.target_bytes // nbytes))
            # three timed runs (their median) unless that would move over 4x target_bytes
            repeats = 3 if 3 * iters * nbytes <= 4 * args.target_bytes else 1
            runs = sorted(timed(x, iters) for _ in range(repeats))
            elapsed = torch.tensor([runs[len(runs) // 2]], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            x.fill_(rank + 1)
            dist.all_reduce(x)
            expected = world * (world + 1) / 2
            if not torch.all(x == expected):
                raise RuntimeError(f"all-reduce of {nbytes} bytes gave {x[0].item()} on rank {rank}, expected {expected}")
            points.append({"nbytes": nbytes, "seconds": float(elapsed.item()), "iters": int(iters)})
            del x
    versions = {"torch": torch.__version__}
    if args.backend == "nccl":
        v = torch.cuda.nccl.version()  # a tuple such as (2, 27, 3); an int in old releases
        versions["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {"backend": args.backend, "world_size": world, "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "points": points, "versions": versions,
            "timer": "cuda events" if device.type == "cuda" else "perf_counter",
            "telemetry": sampler.summary().as_dict() if rank == 0 else {}}


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="perflab.machine.interconnect worker (launched by torchrun)")
    parser.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    parser.add_argument("--out", required=True, help="where rank 0 writes its JSON result")
    sub = parser.add_subparsers(dest="task", required=True)
    ar = sub.add_parser("allreduce")
    ar.add_argument("--sizes", required=True, help="comma-separated buffer sizes in bytes")
    ar.add_argument("--target-bytes", type=int, default=2**28)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("this worker runs under torchrun; call perflab.machine.interconnect.launch() instead")
    if args.backend == "nccl":
        device = torchrun.worker_device("nccl", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        result = _worker_allreduce(args, dist, torch)
        if dist.get_rank() == 0:
            tmp = Path(args.out).with_suffix(".partial")
            tmp.write_text(json.dumps(result))
            tmp.replace(args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
