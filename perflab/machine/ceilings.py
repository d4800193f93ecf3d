"""The run's ceilings: one measured value per quantity, shared by every chapter and lab.

(The file format lives in :mod:`perflab.record.ceilings`; this module measures, models and
reads it.)

A roofline needs two ceilings (the matrix-unit rate and the DRAM bandwidth) and a host<->device
chapter needs a third (the PCIe copy rate). Measured separately in every notebook, the "same"
ceiling comes out a little different each time (a different size, a different clock, a card that
has warmed up), and a reader sees two copy bandwidths for one machine. So a run measures its
ceilings **once**, under telemetry (:mod:`perflab.core.telemetry`), writes them to one JSON file, and
every notebook reads that file with :func:`load`.

* ``copy_bandwidth``: bytes/s of ``dst.copy_(src)`` counting read + write, on a tensor far larger
  than the last-level cache (1 GiB on a GPU; on a CPU four times the last-level cache the OS
  reports, at least 64 MiB, at most 256 MiB).
* ``matmul_fp32``, ``matmul_tf32``, ``matmul_bf16``: FLOP/s of an ``n x n @ n x n`` product,
  ``2 n^3`` FLOPs (``n = 8192`` on a GPU; ``matmul_fp32`` with ``n = 1024`` on a CPU, where tf32
  and bf16 are left out).
* ``h2d_pinned``, ``h2d_pageable``: bytes/s of a 256 MiB host-to-device copy from pinned and from
  pageable host memory (GPU only).

The copy and the matrix products on a GPU repeat for at least :data:`HEADLINE_RUN_S` (0.5 s) of
timed repetitions, so their telemetry holds a dozen readings and states the SM clock they ran at,
time-weighted over those repetitions (:attr:`Ceiling.sm_clock_hz`, which :meth:`Ceilings.per_clock`
feeds to the clock model); a window under a second quotes no power (the power reading averages
over a second). Each was measured at some clock, which its telemetry states: the matrix products at the SM clock
they ran at (a sustained run of products reaches the power limit and the clock falls), the copy
at the memory clock, the host-to-device copies at no GPU clock. So a rate that a page measures
in a short burst, at a higher SM clock, can exceed a product's measured rate. What nothing can
exceed are the **roofs** of the clock model, recorded beside the measurements from the GPU's own
facts (SMs, compute capability, maximum SM clock, memory clock and bus width):
:meth:`Ceilings.peak` (FLOP per clock per SM x SMs x a clock, :func:`perflab.machine.datasheets.peak_at`;
at the maximum clock by default) and :meth:`Ceilings.roof` (that peak for a matrix product; the
DRAM peak for the copy). :meth:`Ceilings.compute_roof` gives every page the same compute roof:
the peak at the maximum clock where the clock model knows the device, else (a CPU) the measured
FP32 product. :meth:`Ceilings.ridge` is the roofs' ridge (peak over DRAM peak) and
:meth:`Ceilings.achieved_ridge` the ridge of the rates reached (measured product over measured
copy): each compares like with like.

Beside the ceilings, the file holds the run's **host costs**: the host's per-call cost ``h`` of
a tiny operator on a CPU tensor and on a CUDA tensor, each over interleaved rounds with its
spread (:func:`host_costs`). Every page that needs ``h`` reads it here, so one run quotes one
value (the same run once gave four, 6.5-12.2 µs, measured by four pages).

The file lives at ``$PERFLAB_CEILINGS`` if set, else ``<clone>/.cache/perflab/ceilings.json``
(or ``~/.cache/perflab/ceilings.json`` for an installed package). It records the machine it was
measured on, down to the host and the GPU (:func:`perflab.record.provenance.machine_id`: two
H200 hosts share a device name, a torch and a CPU model string), and the reference run it
belongs to; :func:`load` re-measures when the file belongs to another machine, torch or run.
The reference run (``scripts/execute.py``) measures a fresh file at the start of every run and
keeps it beside the package data (``perflab/data/reference_ceilings.json``), so the book's
numbers and its ceilings come from the same run on the same machine.

Command line: ``python -m perflab.machine.ceilings [--fresh] [--json PATH]`` prints the ceilings.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from perflab.core import nvml
from perflab.core.rounds import Spread, interleaved
from perflab.core.telemetry import measure as _measure
from perflab.core.timing import seconds_per_call
from perflab.machine.caches import beyond_cache_numel
from perflab.machine import datasheets
from perflab.machine.roofline import matmul_cost
from perflab.record.ceilings import (CEILINGS_ENV, REFERENCE_PATH, SCHEMA, default_path,
                                     fingerprint, read, write)
from perflab.record.provenance import environment, machine_id

__all__ = ["CEILINGS_ENV", "HOST_COSTS", "Ceiling", "Ceilings", "NAMES", "REFERENCE_PATH",
           "SCHEMA", "WORK", "default_path", "gpu_facts", "host_costs", "load", "measure_all",
           "sizes", "stale_reason"]

#: The work each ceiling times (:data:`perflab.core.telemetry.WORK`): which clock its sentence states.
WORK = {"copy_bandwidth": "memory", "matmul_fp32": "sm", "matmul_tf32": "sm", "matmul_bf16": "sm",
        "h2d_pinned": "link", "h2d_pageable": "link"}

#: Every ceiling name, its unit and what it is.
NAMES: dict[str, tuple[str, str]] = {
    "copy_bandwidth": ("B/s", "device memory copy, read + write counted"),
    "matmul_fp32": ("FLOP/s", "float32 matrix product, TF32 off"),
    "matmul_tf32": ("FLOP/s", "float32 matrix product on TF32 tensor cores"),
    "matmul_bf16": ("FLOP/s", "bfloat16 matrix product"),
    "h2d_pinned": ("B/s", "host-to-device copy from pinned memory"),
    "h2d_pageable": ("B/s", "host-to-device copy from pageable memory"),
}


@dataclass(frozen=True)
class Ceiling:
    """One measured ceiling.

    Attributes:
        name: a key of :data:`NAMES`.
        value: the rate (unit in :data:`NAMES`: bytes/s or FLOP/s).
        size: what was measured, in words (e.g. ``"8192^3"`` or ``"1.07 GB"``).
        seconds: median seconds of one call.
        telemetry: the :meth:`~perflab.core.telemetry.TelemetrySummary.as_dict` it ran under.
    """

    name: str
    value: float
    size: str
    seconds: float
    telemetry: dict[str, Any]

    @property
    def unit(self) -> str:
        """``"B/s"`` or ``"FLOP/s"``."""
        return NAMES[self.name][0]

    @property
    def sm_clock_hz(self) -> float | None:
        """The SM clock it ran at (Hz): time-weighted over its timed window
        (:attr:`perflab.core.telemetry.TelemetrySummary.sm_clock_mhz`; the median in a file
        written before the weighting); None without GPU telemetry or in a window too short."""
        mhz = self.telemetry.get("sm_clock_mhz") or self.telemetry.get("sm_clock_mhz_median")
        return mhz * 1e6 if mhz and self.telemetry.get("source") == "NVML" else None

    def sentence(self) -> str:
        """``"matmul_bf16 = 712.3 TFLOP/s (8192^3; measured over 0.41 s ..., SM clock ...)"``."""
        if self.unit == "FLOP/s":
            shown = (f"{self.value / 1e12:,.1f} TFLOP/s" if self.value >= 1e12
                     else f"{self.value / 1e9:,.1f} GFLOP/s")
        else:
            shown = f"{self.value / 1e9:,.1f} GB/s"
        tel = self.telemetry.get("sentence", "")
        return f"{self.name} = {shown} ({NAMES[self.name][1]}, {self.size}; {tel})"


@dataclass(frozen=True)
class Ceilings:
    """The run's ceilings, read from (or written to) the ceilings file.

    Attributes:
        machine: the environment they were measured in (:func:`perflab.record.provenance.environment`).
        measured: UTC time of the measurement (ISO 8601).
        items: ``{name: Ceiling}``; a name missing on this machine (e.g. ``matmul_bf16`` on a
            CPU) is absent.
        path: the file they came from or were written to.
    """

    machine: dict[str, Any]
    measured: str
    items: dict[str, Ceiling]
    path: str
    gpu: dict[str, Any] | None = None
    machine_id: dict[str, Any] = field(default_factory=dict)
    run: str | None = None
    host: dict[str, Spread] = field(default_factory=dict)

    def host_cost(self, kind: str) -> Spread | None:
        """The run's per-call host cost ``h`` of a tiny operator (seconds, a Spread over
        rounds): ``kind`` ``"cpu"`` (a CPU tensor: the whole call) or ``"cuda"`` (a CUDA
        tensor, calls back to back: the host's issue cost, which a tiny kernel never exceeds);
        None where it was not measured (a file from before host costs, or no GPU).

        Raises:
            KeyError: ``kind`` is not a key of :data:`HOST_COSTS`.
        """
        if kind not in HOST_COSTS:
            raise KeyError(f"unknown host cost {kind!r}; known: {', '.join(HOST_COSTS)}")
        return self.host.get(kind)

    def peak(self, fmt: str, clock_hz: float | None = None, fma: bool = True) -> float | None:
        """The clock model's peak for number format ``fmt`` on the GPU these ceilings were
        measured on, at ``clock_hz`` (default: its maximum SM clock), in FLOP/s: FLOP per clock
        per SM x SMs x clock (:func:`perflab.machine.datasheets.peak_at`; ``fma=False`` halves it, for
        plain multiplies). None on a CPU or where the course has no per-SM rate.

        Raises:
            ValueError: an unknown format key or a non-positive clock.
        """
        if not self.gpu:
            return None
        clock = clock_hz if clock_hz is not None else self.gpu.get("max_sm_clock_hz")
        if not clock:
            return None
        return datasheets.peak_at(fmt, self.gpu["sm_count"], tuple(self.gpu["compute_capability"]),
                                clock, fma)

    def per_clock(self, name: str) -> float | None:
        """A matrix product's measured rate over the clock model's peak at the SM clock it ran
        at: its efficiency per clock cycle (0..1), None without a GPU clock or a peak.

        Raises:
            KeyError: ``name`` is not a ``matmul_*`` ceiling measured here.
        """
        if not name.startswith("matmul_"):
            raise KeyError(f"per_clock applies to matmul_* ceilings, got {name!r}")
        c = self[name]
        peak = self.peak(name.split("_", 1)[1], c.sm_clock_hz) if c.sm_clock_hz else None
        return c.value / peak if peak else None

    def roof(self, name: str) -> float | None:
        """What no measurement of the kind can exceed: for ``matmul_<fmt>`` the clock model's
        peak at the maximum SM clock, for ``copy_bandwidth`` the DRAM peak (two transfers per
        memory clock over the bus), None where the machine's facts do not say (a CPU).

        Raises:
            KeyError: an unknown name.
        """
        if name not in NAMES:
            raise KeyError(f"unknown ceiling {name!r}; known: {', '.join(NAMES)}")
        if name.startswith("matmul_"):
            return self.peak(name.split("_", 1)[1])
        if name == "copy_bandwidth" and self.gpu:
            return self.gpu.get("memory_peak_bandwidth")
        return None

    def compute_roof(self, fmt: str = "bf16") -> float | None:
        """The compute roof every page draws for ``fmt``: the clock model's peak at the maximum
        SM clock where it is known (a GPU), else the measured ``matmul_<fmt>`` (a CPU: fp32)."""
        peak = self.peak(fmt)
        if peak:
            return peak
        return self.value(f"matmul_{fmt}") if f"matmul_{fmt}" in NAMES else None

    def ridge(self, fmt: str = "bf16") -> float | None:
        """The ridge point of ``fmt`` in FLOP/byte, one definition on both sides: on a GPU
        the **roofs'** ridge, the clock model's peak at the maximum SM clock over the DRAM peak
        (what no kernel can exceed on either side); where the machine's facts give no roofs (a
        CPU), the **achieved** ridge, :meth:`achieved_ridge`. One number per format and
        machine, quoted by every page. (A ridge of a peak over a measured bandwidth mixes two
        definitions: the course once quoted such a hybrid, neither of the two.)"""
        roof = self.peak(fmt)
        dram = self.roof("copy_bandwidth")
        if roof and dram:
            return roof / dram
        return self.achieved_ridge(fmt)

    def achieved_ridge(self, fmt: str = "bf16") -> float | None:
        """The ridge point of the rates this run reached: the measured ``matmul_<fmt>`` over
        the measured copy bandwidth (FLOP/byte), None where either was not measured."""
        rate = self.value(f"matmul_{fmt}") if f"matmul_{fmt}" in NAMES else None
        bw = self.value("copy_bandwidth")
        return rate / bw if rate and bw else None

    def value(self, name: str) -> float | None:
        """The ceiling ``name`` (unit in :data:`NAMES`), None where this machine has none.

        Raises:
            KeyError: ``name`` is not one of :data:`NAMES`.
        """
        if name not in NAMES:
            raise KeyError(f"unknown ceiling {name!r}; known: {', '.join(NAMES)}")
        c = self.items.get(name)
        return None if c is None else c.value

    def __getitem__(self, name: str) -> Ceiling:
        if name not in NAMES:
            raise KeyError(f"unknown ceiling {name!r}; known: {', '.join(NAMES)}")
        if name not in self.items:
            raise KeyError(f"ceiling {name!r} was not measured on this machine "
                           f"({', '.join(self.machine.get('devices', []))})")
        return self.items[name]

    def sentence(self, name: str) -> str:
        """:meth:`Ceiling.sentence` of ``name``, or why it is missing on this machine."""
        if name in self.items:
            return self.items[name].sentence()
        if name not in NAMES:
            raise KeyError(f"unknown ceiling {name!r}; known: {', '.join(NAMES)}")
        return f"{name}: not measured on this machine"

    def as_dict(self) -> dict[str, Any]:
        """The JSON document written to the ceilings file."""
        return {"schema": SCHEMA, "machine": self.machine, "machine_id": self.machine_id,
                "run": self.run, "measured": self.measured, "gpu": self.gpu,
                "ceilings": {k: {"value": c.value, "size": c.size, "seconds": c.seconds,
                                 "telemetry": c.telemetry} for k, c in self.items.items()},
                "host_costs": {k: {"values_s": list(v.values), "median_s": v.median,
                                   "lo_s": v.lo, "hi_s": v.hi, "spread": v.kind}
                               for k, v in self.host.items()}}


def gpu_facts(index: int = 0) -> dict[str, Any] | None:
    """The facts the clock model needs about GPU ``index`` (None without one): ``sm_count``,
    ``compute_capability``, ``max_sm_clock_hz`` (NVML) and ``memory_peak_bandwidth``."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    return {"sm_count": props.multi_processor_count,
            "compute_capability": [props.major, props.minor],
            "max_sm_clock_hz": nvml.max_sm_clock_hz(index),
            "memory_peak_bandwidth": datasheets.memory_peak_bandwidth(index)}


#: The host costs a run records: a tiny ``x * 2`` per call on a CPU tensor and on a CUDA tensor.
HOST_COSTS = {"cpu": "tiny operator on a CPU tensor, whole call",
              "cuda": "tiny operator on a CUDA tensor, calls back to back (host issue cost)"}


def host_costs(rounds: int = 7, calls: int = 2000) -> dict[str, Spread]:
    """Measure the host's per-call cost ``h`` of a tiny operator, over interleaved rounds.

    Each round times ``calls`` back-to-back calls of ``y = x * 2`` on a one-element tensor per
    device (CPU, and CUDA when present; synchronized around the block, so queued launches count
    once they have run): seconds per call. The rounds alternate the devices
    (:func:`perflab.core.rounds.interleaved`), and the spread says how much the host moved
    during the measurement. What sets ``h`` is the host: Python, the dispatcher, the allocator
    and (CUDA) the launch; a one-element kernel finishes before the next is issued.

    Args:
        rounds: kept rounds (>= 1).
        calls: calls per round and device (>= 1).

    Returns:
        ``{"cpu": Spread, "cuda": Spread}`` (``"cuda"`` only with a GPU), seconds per call.

    Raises:
        ValueError: ``rounds`` or ``calls`` below 1.
    """
    work = {}
    for kind in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        dev = torch.device(kind)
        x = torch.ones(1, device=dev)
        for _ in range(100):           # context, allocator, kernel load: not the host cost
            x * 2
        work[kind] = (lambda x=x, dev=dev:
                      seconds_per_call(lambda: x * 2, calls=calls, device=dev))
    return interleaved(work, rounds=rounds, warmup=1)


def _fingerprint(machine: dict[str, Any], ident: dict[str, Any]) -> tuple:
    return fingerprint(machine) + (ident.get("host_id"), tuple(ident.get("gpu_ids") or ()))


def stale_reason(doc: dict[str, Any] | None, run: str | None = None) -> str | None:
    """Why the ceilings document ``doc`` (:func:`perflab.record.ceilings.read`) cannot serve
    this machine (and reference run ``run``), in words; None when it can.

    A document serves when it was measured on this host, these GPUs (by UUID) and this torch,
    and, when ``run`` is given, in that reference run.
    """
    if doc is None:
        return "no readable ceilings file"
    ident = doc.get("machine_id") or {}
    if not ident:
        return "the file does not say which host and GPU measured it"
    if _fingerprint(doc.get("machine", {}), ident) != _fingerprint(environment(), machine_id()):
        return (f"the file comes from another machine (host {ident.get('host_id')}, "
                f"{', '.join(doc.get('machine', {}).get('devices', []))}, torch "
                f"{doc.get('machine', {}).get('torch')})")
    if run is not None and doc.get("run") != run:
        return f"the file belongs to run {doc.get('run')!r}, not to this run {run!r}"
    return None


#: Seconds of timed repetitions for a ceiling whose clock its pages quote (the copy and the
#: matrix products): several sampling intervals, so the telemetry reads the clock the work ran
#: at, time-weighted, not a reading or two at its edges (a 0.09 s copy once read "121 W").
HEADLINE_RUN_S = 0.5


def _one(name: str, fn, work: float, size: str, device: torch.device,
         min_run_time_s: float = 0.2) -> Ceiling:
    m = _measure(fn, device, min_run_time_s=min_run_time_s, work=WORK[name])
    return Ceiling(name=name, value=m.rate(work), size=size, seconds=m.seconds,
                   telemetry=m.telemetry.as_dict())


def _matmul(name: str, n: int, dtype: torch.dtype, tf32: bool, dev: torch.device) -> Ceiling:
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        return _one(name, lambda: a @ b, matmul_cost(n, n, n, dtype).flops, f"{n}^3", dev,
                    HEADLINE_RUN_S if dev.type == "cuda" else 0.2)
    finally:
        torch.set_float32_matmul_precision(before)


def sizes(device: torch.device | str, quick: bool = False) -> dict[str, int]:
    """The problem sizes :func:`measure_all` times on ``device``, the one place they are set.

    ``{"copy_numel": float32 elements of the copy's source (the destination is as large),
    "matmul_n": n of the n x n @ n x n product}``. A CPU's copy must stream from DRAM, not from
    its last-level cache: four times the cache the OS reports
    (:func:`perflab.machine.caches.beyond_cache_numel`), never less than 2^24 elements (2^22
    ``quick``) nor, from the cache, more than 2^26; a GPU's is 2^28 (2^26 ``quick``). The product
    is 8192 (4096 ``quick``) on a GPU, 1024 (512 ``quick``) on a CPU.

    Raises:
        RuntimeError: ``device`` is not a device string torch knows.
    """
    gpu = torch.device(device).type == "cuda"
    if gpu:
        return {"copy_numel": 2**26 if quick else 2**28, "matmul_n": 4096 if quick else 8192}
    return {"copy_numel": max(2**22 if quick else 2**24, beyond_cache_numel(4.0, maximum=2**26)),
            "matmul_n": 512 if quick else 1024}


def measure_all(device: torch.device | str | None = None, quick: bool = False) -> dict[str, Ceiling]:
    """Measure every ceiling this machine has (see the module docstring for sizes).

    Args:
        device: a CUDA device (default: ``cuda`` when present) or ``"cpu"``.
        quick: smaller problems (a few seconds on a CPU); reference runs use ``quick=False``.

    Returns:
        ``{name: Ceiling}``.
    """
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    out: dict[str, Ceiling] = {}
    gpu = dev.type == "cuda"
    size = sizes(dev, quick)
    src = torch.randn(size["copy_numel"], device=dev)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    out["copy_bandwidth"] = _one("copy_bandwidth", lambda: dst.copy_(src), nbytes,
                                 f"{src.numel() * 4 / 1e9:.2f} GB float32", dev,
                                 HEADLINE_RUN_S if gpu else 0.2)
    del src, dst
    n = size["matmul_n"]
    if gpu:
        out["matmul_fp32"] = _matmul("matmul_fp32", n, torch.float32, False, dev)
        out["matmul_tf32"] = _matmul("matmul_tf32", n, torch.float32, True, dev)
        out["matmul_bf16"] = _matmul("matmul_bf16", n, torch.bfloat16, False, dev)
        host_bytes = 2**28 if not quick else 2**25
        gpu_buf = torch.empty(host_bytes, dtype=torch.uint8, device=dev)
        for name, pinned in (("h2d_pinned", True), ("h2d_pageable", False)):
            host = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=pinned)
            host.fill_(1)
            out[name] = _one(name, lambda h=host: gpu_buf.copy_(h, non_blocking=False),
                             host_bytes, f"{host_bytes / 1e6:.0f} MB", dev)
        torch.cuda.empty_cache()
    else:
        out["matmul_fp32"] = _matmul("matmul_fp32", n, torch.float32, False, dev)
    return out


def _from_doc(doc: dict[str, Any], path: Path) -> Ceilings:
    items = {k: Ceiling(name=k, value=float(v["value"]), size=v["size"],
                        seconds=float(v["seconds"]), telemetry=v.get("telemetry", {}))
             for k, v in doc.get("ceilings", {}).items() if k in NAMES}
    facts = doc.get("gpu")
    if facts is None and doc.get("machine", {}).get("cuda") and torch.cuda.is_available():
        facts = gpu_facts()   # a file written before the facts were recorded, read on its GPU
    host = {k: Spread(tuple(v["values_s"])) for k, v in (doc.get("host_costs") or {}).items()
            if k in HOST_COSTS and v.get("values_s")}
    return Ceilings(machine=doc.get("machine", {}), measured=doc.get("measured", ""),
                    items=items, path=str(path), gpu=facts,
                    machine_id=doc.get("machine_id") or {}, run=doc.get("run"), host=host)


def load(path: str | os.PathLike | None = None, fresh: bool = False,
         quick: bool | None = None, run: str | None = None) -> Ceilings:
    """The run's ceilings: read from the ceilings file, measured (and written) when needed.

    The file is re-measured when it is missing, unreadable, of another schema, from another
    host, GPU or torch version (:func:`stale_reason`), from another reference run than ``run``,
    or when ``fresh`` is true.

    Args:
        path: the ceilings file (default :func:`perflab.record.ceilings.default_path`).
        fresh: measure again even if a matching file exists.
        quick: smaller problems when measuring (default: full size; on a CPU a 512^3
            product reached a quarter of a 1024^3 one, too small to stand in for a roof).
        run: the reference run the file must belong to (None: any run on this machine).

    Raises:
        OSError: the file cannot be written (the message names the path).
    """
    p = Path(path) if path is not None else default_path()
    if not fresh:
        doc = read(p)
        if stale_reason(doc, run) is None:
            return _from_doc(doc, p)
    items = measure_all(quick=bool(quick))
    result = Ceilings(machine=environment(), measured=_dt.datetime.now(_dt.timezone.utc)
                      .strftime("%Y-%m-%dT%H:%M:%SZ"), items=items, path=str(p),
                      gpu=gpu_facts(), machine_id=machine_id(), run=run,
                      host=host_costs(rounds=3 if quick else 7))
    write(p, result.as_dict())
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m perflab.machine.ceilings [--fresh] [--json PATH]``: measure or read, then print."""
    ap = argparse.ArgumentParser(prog="python -m perflab.machine.ceilings", description=__doc__.split("\n")[0])
    ap.add_argument("--fresh", action="store_true", help="measure again even if a file exists")
    ap.add_argument("--json", metavar="PATH", help=f"ceilings file (default {default_path()})")
    args = ap.parse_args(argv)
    target = Path(args.json) if args.json else default_path()
    if target.is_dir():
        print(f"--json {target}: is a directory; give a file path", file=sys.stderr)
        return 2
    try:
        c = load(target, fresh=args.fresh)
    except OSError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"ceilings of {', '.join(c.machine.get('devices', []))} "
          f"(torch {c.machine.get('torch')}), measured {c.measured}, file {c.path}")
    for name in c.items:
        print("  " + c.sentence(name))
    for kind, h in c.host.items():
        print(f"  host cost h ({HOST_COSTS[kind]}) = {h.median * 1e6:.2f} µs per call "
              f"({h.lo * 1e6:.2f}-{h.hi * 1e6:.2f}, {h.kind})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
