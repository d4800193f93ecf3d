"""The machine report card: every ceiling of chapter 2 measured on this machine, on one page.

    python -m perflab.machine.report [--json PATH] [--quick] [--reference PATH] [--disk-dir DIR] [--no-progress]

On any machine (CPU only, one GPU, several GPUs) it measures host memory bandwidth (one thread and
all), the cache hierarchy, CPU matmul, disk reads (cold and warm), and where present the GPU's
memory bandwidth, L2 (copies replayed from a CUDA graph), matmul rates per number format, host <->
device copies, peer copies and an all-reduce (NCCL on two GPUs, else gloo between two CPU
processes; latency and bus bandwidth fitted to the whole sweep), each with the functions chapter 2
uses. It prints one page, writes the results as JSON, and divides each figure by the same figure
of the reference run (``perflab/data/reference_report.json``, written on the course's GPU
machine). Whatever it cannot measure (no GPU, no NVML, one GPU) is one line under "notes"; a
measurement that fails is one line under "failures" and makes the exit status 1. ``--quick``
shrinks every problem (for tests and laptops); a full card takes under two minutes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from perflab.core import formats, nvml
from perflab.core.device import cpu_name, gpu_count
from perflab.core.timing import Stopwatch
from perflab.machine import interconnect
from perflab.machine import (caches, cpu, datasheets, disk, gpu, replay, roofline, transfer,
                             workingset)
from perflab.machine.caches import format_bytes
from perflab.record.provenance import environment, short_devices

__all__ = [
    "REFERENCE_PATH",
    "SCHEMA",
    "Card",
    "L2_METHOD",
    "LATENCY_METHOD",
    "Metric",
    "load_reference",
    "main",
    "measure",
    "ratios",
    "render",
]

SCHEMA = "perflab-report/1"
#: The methods of chapter 2 the card shares, named in the ``context`` of the metrics they give.
L2_METHOD = "CUDA-graph x * 2, start-up out"
LATENCY_METHOD = "alpha-beta fit"
#: Where the course keeps the reference run's card (written on the GPU machine).
REFERENCE_PATH = Path(__file__).resolve().parent.parent / "data" / "reference_report.json"


@dataclass
class Metric:
    """One measured figure.

    Attributes:
        name: stable snake_case key (the same names as the chapter's glued values where they overlap).
        section: "CPU", "disk", "GPU", "host<->GPU", "multi-GPU" or "collective".
        label: what was measured, in words.
        value: the figure, in ``unit``.
        unit: e.g. ``"GB/s"``, ``"TFLOP/s"``.
        datasheet: the published or theoretical ceiling in the same unit, or None.
        source: where ``datasheet`` comes from.
        context: what must match for a ratio with the reference to mean anything (the
            collective's backend, the method: :data:`L2_METHOD`, :data:`LATENCY_METHOD`);
            ratios are omitted when it differs.
    """

    name: str
    section: str
    label: str
    value: float
    unit: str
    datasheet: float | None = None
    source: str | None = None
    context: str | None = None


class Card:
    """Accumulates metrics, notes (what was not measured and why), failures and curves."""

    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.curves: dict[str, Any] = {}
        self.machine: list[str] = []

    def add(self, name: str, section: str, label: str, value: float, unit: str, datasheet: float | None = None,
            source: str | None = None, context: str | None = None) -> None:
        """Record a metric (``value`` must be a finite number).

        Raises:
            ValueError: ``value`` is not finite.
        """
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r} is {value}: the measurement failed")
        self.metrics[name] = Metric(name, section, label, value, unit, datasheet, source, context)

    def note(self, text: str) -> None:
        """One line saying what was not measured, and why."""
        self.notes.append(text)


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

def _sizes(quick: bool) -> dict:
    # the full card's L2 sweep (from 4 MiB, 3 sizes per octave, 5 rounds), its matrix products
    # (n = 8192) and NCCL sweep (4 KiB .. 1 GiB, x4 apart) are chapter 2's, so that its rows
    # compare with the chapter's glued values. The quick card keeps the chapter's sizes (on the
    # reference GPU host) where a rate depends on them and they cost seconds: the host copy
    # (512 MiB: 128 MiB sits inside a large server's L3), the host matrix product (2048^3) and
    # the host<->device copies (256 MiB: the pageable rate depends strongly on size); its GPU
    # copy is smaller but, like the chapter's, far past the L2, and its GPU matrix product
    # (4096^3) is compared with the chapter's 4096^3 row
    if quick:
        return dict(cpu_copy=512 * 2**20, cpu_n=2048, cache_hi=256 * 2**20, cache_per_octave=1, disk=32 * 2**20,
                    disk_reads=500, gpu_copy=256 * 2**20, l2_hi=512 * 2**20, l2_per_octave=2, l2_rounds=3,
                    gpu_n=(4096,),
                    hd=256 * 2**20, p2p=256 * 2**20, gloo=[4096, 2**20, 2**24], nccl=[4096, 2**20, 2**26])
    return dict(cpu_copy=512 * 2**20, cpu_n=2048, cache_hi=512 * 2**20, cache_per_octave=2, disk=256 * 2**20,
                disk_reads=2000, gpu_copy=2**30, l2_hi=2**30, l2_per_octave=3, l2_rounds=5, gpu_n=(8192,),
                hd=256 * 2**20,
                p2p=2**30, gloo=[4096, 65536, 2**20, 2**24, 2**26], nccl=[2**k for k in range(12, 31, 2)])


def _cpu_memory(card: Card, s: dict) -> None:
    all_threads = torch.get_num_threads()
    bw_all = cpu.memory_bandwidth(s["cpu_copy"])
    bw_one = cpu.memory_bandwidth(s["cpu_copy"], num_threads=1)
    card.add("cpu_memory_bandwidth_GBps", "CPU", f"copy bandwidth, {all_threads} threads", bw_all / 1e9, "GB/s")
    card.add("cpu_memory_bandwidth_1thread_GBps", "CPU", "copy bandwidth, 1 thread", bw_one / 1e9, "GB/s")


def _cpu_matmul(card: Card, s: dict) -> None:
    (threads, rate), = cpu.matmul_thread_scaling(s["cpu_n"], [torch.get_num_threads()])
    estimate = None
    try:
        estimate = cpu.peak_flops_estimate(cores=threads) / 1e9
    except RuntimeError:
        card.note("the OS reports no CPU clock: no SIMD peak estimate for the CPU matmul")
    card.add("cpu_matmul_gflops_fp32", "CPU", f"fp32 matmul {s['cpu_n']}^3, {threads} threads", rate / 1e9,
             "GFLOP/s", estimate, "estimate: lanes x 2 FMA units x 2 x clock x threads" if estimate else None)


def _cpu_caches(card: Card, s: dict) -> None:
    sizes = caches.geometric_sizes(16 * 2**10, s["cache_hi"], per_octave=s["cache_per_octave"])
    with cpu.threads(1):
        points = workingset.working_set_sweep(sizes, passes=1 if s["cache_per_octave"] == 1 else 2)
    card.curves["cpu_cache"] = {"nbytes": [p.nbytes for p in points], "bytes_per_s": [p.bytes_per_s for p in points]}
    steps = caches.find_steps([p.nbytes for p in points], [p.bytes_per_s for p in points])
    levels = [c for c in cpu.cache_levels() if c.kind != "Instruction"]
    llc = caches.largest_step(steps)
    card.add("cpu_l1_read_GBps", "CPU", "read, 1 thread, smallest sets",
             max(p.bytes_per_s for p in points[:3]) / 1e9, "GB/s")
    if llc is None:
        card.note("the CPU bandwidth curve shows no clear step: no cache size read back")
    else:
        # compare the largest fall with the reported level nearest in size (on a VM the shared
        # L3 often leaves no step for one thread, and the largest fall is the L2's)
        level = min(levels, key=lambda c: abs(c.size_bytes.bit_length() - int(llc.capacity_bytes).bit_length()),
                    default=None)
        card.add("cpu_llc_from_curve_MiB", "CPU", f"cache, largest fall ({level.name if level else '?'})",
                 llc.capacity_bytes / 2**20, "MiB", level.size_bytes / 2**20 if level else None,
                 f"OS: {level.name} {caches.format_bytes(level.size_bytes)}" if level else None)
    if not levels:
        card.note("the OS reports no cache sizes (no /sys/devices/system/cpu/cpu0/cache)")


def _disk(card: Card, s: dict, directory: str | None) -> None:
    r = disk.measure(s["disk"], directory, count=s["disk_reads"])
    card.add("disk_seq_cold_GBps", "disk", f"sequential read, cold ({r.fstype})",
             r.seq_cold_Bps / 1e9, "GB/s")
    card.add("disk_seq_warm_GBps", "disk", "sequential read, warm (page cache)", r.seq_warm_Bps / 1e9, "GB/s")
    card.add("disk_rand_cold_iops", "disk", f"random {r.block // 1024} KiB reads, cold, QD 1",
             r.rand_cold_iops, "IOPS")
    if not r.cache_dropped:
        card.note(f"the OS ignored the request to drop the test file's pages ({r.fstype} at {r.mount}): "
                  "cold disk figures are page-cache figures")


def _sheet_name() -> str:
    """Short name of the datasheet behind GPU 0's figures (perflab.machine.datasheets.DATASHEETS cites it in full)."""
    return f"{torch.cuda.get_device_name(0)} datasheet"


def _gpu_info(card: Card) -> None:
    n = torch.cuda.device_count()
    p = gpu.properties(0)
    card.machine.append(f"GPU: {n} x {p['name']} (compute capability {p['compute_capability']}, {p['sm_count']} SMs, "
                        f"L2 {format_bytes(p['l2_bytes'] or 0)}, {p['memory_bytes'] / 1e9:.0f} GB)")
    r = nvml.readings(0)
    if r is None:
        card.note("NVML unavailable (nvidia-ml-py or the driver library missing): clocks, power and PCIe link not read")
        return
    fmt = lambda v, scale, unit: "?" if v is None else f"{v / scale:.0f} {unit}"  # noqa: E731
    card.machine.append(
        f"GPU 0 now: SM clock {fmt(r['sm_clock_hz'], 1e6, 'MHz')} (max {fmt(r['sm_clock_max_hz'], 1e6, 'MHz')}), "
        f"memory clock {fmt(r['mem_clock_hz'], 1e6, 'MHz')}, power {fmt(r['power_w'], 1, 'W')} of "
        f"{fmt(r['power_limit_w'], 1, 'W')}, {fmt(r['temperature_c'], 1, 'C')}, PCIe gen {r['pcie_gen']} "
        f"x{r['pcie_width']} (max gen {r['pcie_gen_max']} x{r['pcie_width_max']}), NVLinks active: {r['nvlinks_active']}")
    card.curves["gpu_nvml"] = r


def _gpu_memory(card: Card, s: dict) -> None:
    dev = torch.device("cuda", 0)
    sheet = datasheets.datasheet() or {}
    bw = roofline.copy_bandwidth(dev, s["gpu_copy"] // 4)
    ds = sheet.get("memory_bandwidth")
    card.add("gpu_copy_bandwidth_TBps", "GPU", f"HBM copy, {s['gpu_copy'] >> 20} MiB, read+write",
             bw / 1e12, "TB/s", ds / 1e12 if ds else None, _sheet_name() if ds else None)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    if not l2:
        card.note("torch reports no L2 size for this GPU: no L2 / HBM ratio and no L2 read back")
        return
    _l2(card, s, dev, l2)


def _l2(card: Card, s: dict, dev: torch.device, l2_bytes: int) -> None:
    """Chapter 2's L2 measurement (:mod:`perflab.machine.replay`, taught on its GPU page): ``x * 2``
    from one buffer into another, replayed from CUDA graphs in interleaved rounds, with the
    kernel's start-up measured on an 8 KiB working set and taken out
    (:class:`perflab.machine.caches.ReplayCurve`). The L2's level is the median over the sizes
    that fit in one L2 partition, HBM's over the sizes four times the L2 and more. The stored
    curve ``gpu_l2`` has the start-up taken out (sizes whose bytes take less than the start-up
    left out); ``gpu_l2_raw`` is bytes / time per call."""
    sizes = caches.geometric_sizes(4 * 2**20, max(s["l2_hi"], 8 * l2_bytes), per_octave=s["l2_per_octave"])
    times = replay.replay_sweep(sizes, dev, rounds=s["l2_rounds"])
    sweep = caches.ReplayCurve({n: times[n] for n in sizes}, times[8192])
    points = sweep.curve()
    card.curves["gpu_l2"] = {"nbytes": [p.nbytes for p in points], "bytes_per_s": [p.bytes_per_s for p in points],
                             "method": "x * 2 replayed from CUDA graphs, the kernel's start-up taken out",
                             "startup_s": sweep.startup.median}
    raw = sweep.raw()
    card.curves["gpu_l2_raw"] = {"nbytes": [p.nbytes for p in raw], "bytes_per_s": [p.bytes_per_s for p in raw]}
    try:
        ratio = sweep.level(l2_bytes / 8, l2_bytes / 2) / sweep.level(4 * l2_bytes)
    except ValueError as err:           # no counted size in a range: a sweep too short
        card.note(f"no L2 / HBM ratio: {err}")
    else:
        # the context names the method: a card that read the L2 another way is not compared
        card.add("l2_bandwidth_ratio", "GPU", "copy, in L2 / from HBM (graph)", ratio.median, "x",
                 context=L2_METHOD)
    step = caches.largest_step(caches.find_steps([p.nbytes for p in points],
                                                 [p.bytes_per_s for p in points])) if len(points) >= 3 else None
    if step is None:
        card.note("the GPU bandwidth curve shows no clear step: no L2 size read back")
    else:
        card.add("gpu_l2_from_curve_MiB", "GPU", "L2 size, from the curve", step.capacity_bytes / 2**20, "MiB",
                 l2_bytes / 2**20, "torch: L2_cache_size", context=L2_METHOD)


def _gpu_matmul(card: Card, s: dict) -> None:
    dev = torch.device("cuda", 0)
    sheet = datasheets.datasheet() or {}
    n_main = s["gpu_n"][0]
    rates, errors = gpu.matmul_rates(dev, n_main)
    for kind, rate in rates.items():   # every format at one size: no "best of" a lucky clock
        ds = sheet.get(formats.datasheet_key(kind))
        card.add(f"matmul_tflops_{kind}", "GPU", f"{kind} matmul, n = {n_main}", rate / 1e12, "TFLOP/s",
                 ds / 1e12 if ds else None, _sheet_name() if ds else None)
    for kind, message in errors.items():
        card.note(f"{kind} matmul failed on this GPU and torch build: {message}")
    if not sheet:
        card.note(f"no datasheet figures for {torch.cuda.get_device_name(0)} in perflab.machine.datasheets.DATASHEETS")


def _host_device(card: Card, s: dict) -> None:
    r = nvml.readings(0) or {}
    theory, source = None, None
    if r.get("pcie_gen_max") in transfer.PCIE_GT_PER_S and r.get("pcie_width_max"):
        theory = transfer.pcie_bandwidth(r["pcie_gen_max"], r["pcie_width_max"]) / 1e9
        source = f"PCIe gen {r['pcie_gen_max']} x{r['pcie_width_max']}, per direction"
    (p,) = transfer.host_device_sweep([s["hd"]])
    size = f"{s['hd'] >> 20} MiB"
    for name, value, label in (("h2d_pinned_GBps", p.h2d_pinned, f"host->GPU, pinned, {size}"),
                               ("h2d_pageable_GBps", p.h2d_pageable, f"host->GPU, pageable, {size}"),
                               ("d2h_pinned_GBps", p.d2h_pinned, f"GPU->host, pinned, {size}"),
                               ("d2h_pageable_GBps", p.d2h_pageable, f"GPU->host, pageable, {size}")):
        card.add(name, "host<->GPU", label, value / 1e9, "GB/s", theory, source)


def _nvlink_theory() -> tuple[float | None, str | None, str | None]:
    text = interconnect.topology_text()
    link = interconnect.gpu_link(text, 0, 1) if text else None
    sheet = datasheets.datasheet() or {}
    if link and link.startswith("NV") and sheet.get("nvlink_bandwidth"):
        return sheet["nvlink_bandwidth"] / 2 / 1e9, f"{_sheet_name()}: NVLink total / 2", link
    return None, None, link


def _peer(card: Card, s: dict) -> None:
    theory, source, link = _nvlink_theory()
    if not transfer.peer_access(0, 1):
        card.note(f"GPU 0 cannot access GPU 1 directly (link {link}): the copy goes through host memory")
    bw = transfer.peer_copy_bandwidth(s["p2p"], 0, 1)
    card.add("p2p_bandwidth_GBps", "multi-GPU", f"GPU0->GPU1, {s['p2p'] >> 20} MiB, {link or '?'}",
             bw / 1e9, "GB/s", theory, source)


def _allreduce(card: Card, s: dict) -> None:
    """Chapter 2's all-reduce: the sweep (:func:`perflab.machine.interconnect.allreduce_sweep`) and its
    latency and bus bandwidth from the alpha-beta fit of the whole sweep
    (:func:`perflab.machine.interconnect.alpha_beta`), not from one size (the smallest carried set-up cost)."""
    backend = "nccl" if gpu_count() >= 2 else "gloo"
    result = interconnect.allreduce_sweep(s[backend], nproc=2, backend=backend)
    fit = interconnect.alpha_beta(result)
    card.curves["allreduce"] = {
        "backend": backend, "timer": result.timer, "nbytes": [p.nbytes for p in result.points],
        "seconds": [p.seconds for p in result.points], "busbw": [p.busbw for p in result.points],
        "alpha_s": fit.alpha_s, "fit_busbw": fit.busbw, "fit_rms": fit.rms_relative}
    theory, source = (None, None)
    if backend == "nccl":
        theory, source, _ = _nvlink_theory()
    best = max(result.points, key=lambda p: p.busbw)
    card.add("allreduce_busbw_GBps", "collective", f"all-reduce busbw, {backend}, {format_bytes(best.nbytes)}",
             best.busbw / 1e9, "GB/s", theory, source, context=backend)
    card.add("allreduce_fit_busbw_GBps", "collective", f"all-reduce busbw (a-b fit), {backend}",
             fit.busbw / 1e9, "GB/s", theory, source, context=backend)
    if fit.alpha_s > 0:
        # context: the backend and the method (a latency read off the smallest size is another figure)
        card.add("allreduce_latency_us", "collective", f"all-reduce latency (a-b fit), {backend}",
                 fit.alpha_s * 1e6, "us", context=f"{backend}, {LATENCY_METHOD}")
    else:
        card.note(f"the alpha-beta fit of the all-reduce sweep put the latency at {fit.alpha_s * 1e6:.1f} us "
                  f"(RMS residual {fit.rms_relative:.0%}): no latency reported")
    if fit.rms_relative > 0.15:
        card.note(f"the alpha-beta model misses the all-reduce times by {fit.rms_relative:.0%} (RMS): its latency "
                  "and bus bandwidth are averages over the sweep")


def measure(quick: bool = False, progress: bool = True, disk_dir: str | None = None) -> dict:
    """Measure the report card on this machine; return it as a JSON-ready dict.

    Keys: ``schema``, ``created`` (UTC, ISO 8601), ``quick``, ``seconds`` (wall time),
    ``environment`` (:func:`perflab.record.provenance.environment` plus cores and threads), ``machine``
    (lines describing the hardware), ``metrics`` (name -> :class:`Metric` as a dict), ``notes``,
    ``failures`` (``"<step>: <ErrorClass>: <message>"``) and ``curves`` (the raw sweeps).
    A step that raises is recorded under ``failures`` and the others still run.
    """
    clock = Stopwatch().start()
    s = _sizes(quick)
    card = Card()
    card.machine.append(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs; torch uses {torch.get_num_threads()} threads)")
    gpus = gpu_count()
    steps: list[tuple[str, Callable[[], None]]] = [
        ("CPU memory bandwidth", lambda: _cpu_memory(card, s)),
        ("CPU matmul", lambda: _cpu_matmul(card, s)),
        ("CPU caches", lambda: _cpu_caches(card, s)),
        ("disk", lambda: _disk(card, s, disk_dir)),
    ]
    if gpus:
        steps += [
            ("GPU facts", lambda: _gpu_info(card)),
            ("GPU memory and L2", lambda: _gpu_memory(card, s)),
            ("GPU matmul", lambda: _gpu_matmul(card, s)),
            ("host<->GPU copies", lambda: _host_device(card, s)),
        ]
    else:
        card.machine.append("GPU: none (torch sees no CUDA device)")
        card.note("no CUDA GPU: GPU memory, L2, matmul and host<->GPU copy ceilings not measured")
    if gpus >= 2:
        steps.append(("peer copy", lambda: _peer(card, s)))
    else:
        card.note(f"{'one GPU' if gpus == 1 else 'no GPU'}: no peer copy; the all-reduce runs between 2 CPU "
                  "processes (gloo), so it is not comparable with an NCCL reference")
    steps.append(("all-reduce", lambda: _allreduce(card, s)))
    bar = tqdm(steps, desc="report card", disable=not progress, leave=False, file=sys.stderr)
    for name, fn in bar:
        bar.set_postfix_str(name)
        try:
            fn()
        except Exception as err:  # recorded as a failure line, printed, and the exit status says so
            message = str(err).strip().splitlines()[0] if str(err).strip() else ""
            card.failures.append(f"{name}: {type(err).__name__}: {message}")
    env = environment()
    env.update(cores=os.cpu_count(), torch_threads=torch.get_num_threads(), gpus=gpus)
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": quick,
        "seconds": round(clock.elapsed(), 1),
        "environment": env,
        "machine": card.machine,
        "metrics": {k: asdict(m) for k, m in card.metrics.items()},
        "notes": card.notes,
        "failures": card.failures,
        "curves": card.curves,
    }


# ---------------------------------------------------------------------------------------------
# Reference, ratios and the page
# ---------------------------------------------------------------------------------------------

def load_reference(path: str | os.PathLike | None = None) -> tuple[dict | None, str]:
    """The reference card and one line describing it (or saying why there is none).

    Default ``path``: :data:`REFERENCE_PATH`. A missing, unreadable or foreign file returns
    ``(None, "<reason>")``; it is not an error, since a fresh checkout may not have one yet.
    """
    p = Path(path) if path is not None else REFERENCE_PATH
    shown = "perflab/data/reference_report.json" if path is None else str(p)
    if not p.exists():
        return None, f"no reference card at {shown}: ratios omitted"
    try:
        ref = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        return None, f"reference card {shown} unreadable ({type(err).__name__}): ratios omitted"
    if ref.get("schema") != SCHEMA:
        return None, f"reference card {shown} has schema {ref.get('schema')!r}, not {SCHEMA!r}: ratios omitted"
    devices = ref.get("environment", {}).get("devices", ["?"])
    return ref, f"reference: {short_devices(devices)}, {ref.get('created', '?')[:10]} ({p.name})"


def ratios(card: dict, reference: dict | None) -> dict[str, float]:
    """``{name: this machine / reference}`` for every metric both cards hold with the same context."""
    if not reference:
        return {}
    out = {}
    for name, m in card.get("metrics", {}).items():
        r = reference.get("metrics", {}).get(name)
        if r and r.get("value") and r.get("context") == m.get("context"):
            out[name] = m["value"] / r["value"]
    return out


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    if v == 0:
        return "0"
    mag = abs(v)
    return f"{v:.3g}" if mag < 1000 else f"{v:,.0f}"


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, 79, initial_indent=indent, subsequent_indent=indent + "  ") or [""]


def render(card: dict, reference: dict | None = None, reference_line: str = "") -> str:
    """The card as one plain-text page, 79 columns wide: header, a table by section, notes, failures.

    Columns: measurement, value and unit, the fraction of the datasheet, theoretical or
    OS-reported figure ("of spec"), the reference run's value, and this machine / reference.
    """
    env = card.get("environment", {})
    title = "Machine report card" + (" (quick: small problems)" if card.get("quick") else "")
    when = card.get("created", "?").replace("T", " ").replace("Z", " UTC")
    lines = [f"{title} · {when} · {card.get('seconds', '?')} s"]
    lines += _wrap(f"torch {env.get('torch', '?')} · Python {env.get('python', '?')} · "
                   f"CUDA {env.get('cuda') or '—'} · driver {env.get('driver') or '—'}")
    for text in card.get("machine", []):
        lines += _wrap(text)
    lines.append(reference_line or "reference: none given")  # one line, however long
    lines.append("")
    rat = ratios(card, reference)
    head = f"{'measurement':36s} {'value':>8s} {'unit':7s} {'of spec':>7s} {'ref.':>8s} {'ratio':>5s}"
    lines += [head, "─" * len(head)]
    section = None
    for name, m in card.get("metrics", {}).items():
        if m["section"] != section:
            section = m["section"]
            lines.append(f"[{section}]")
        of_spec = f"{m['value'] / m['datasheet']:.0%}" if m.get("datasheet") else "—"
        ref = (reference or {}).get("metrics", {}).get(name)
        ref_value = _num(ref["value"]) if ref and ref.get("context") == m.get("context") else "—"
        ratio = f"{rat[name]:.2f}" if name in rat else "—"
        lines.append(f" {m['label'][:35]:35s} {_num(m['value']):>8s} {m['unit']:7s} {of_spec:>7s} "
                     f"{ref_value:>8s} {ratio:>5s}")
    sources = sorted({m["source"] for m in card.get("metrics", {}).values() if m.get("source")})
    if sources:
        lines.append("")
        lines += _wrap("spec = datasheet, theoretical or OS-reported figure: " + "; ".join(sources))
    if card.get("notes"):
        lines += ["", "notes:"]
        for n in card["notes"]:
            lines += _wrap(f"- {n}", "  ")
    if card.get("failures"):
        lines += ["", "FAILURES (measurements that raised):"]
        for f in card["failures"]:
            lines += _wrap(f"! {f}", "  ")
    return "\n".join(lines)


def output_problem(path: str | os.PathLike) -> str | None:
    """Why the card cannot be written to ``path`` (one phrase), or None when it can.

    Checked before anything is measured: ``path`` must not be a directory, its folder must
    already exist (nothing is created), and both must be writable.
    """
    out = Path(path)
    if str(path) == "" or out.name in ("", ".", ".."):
        return "not a file name"
    if out.is_dir():
        return "is a directory"
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        return f"folder {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a folder"
    if out.exists() and not os.access(out, os.W_OK):
        return "is not writable"
    if not out.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"folder {parent} is not writable"
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line: measure, print the page, write the JSON; exit 1 if a measurement failed,
    2 (one line on stderr, before measuring) if the JSON cannot be written where asked."""
    parser = argparse.ArgumentParser(prog="python -m perflab.machine.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="perflab-report.json", help="where to write the card (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small problems: seconds, not minutes")
    parser.add_argument("--reference", default=None, help=f"reference card (default: {REFERENCE_PATH})")
    parser.add_argument("--disk-dir", default=None, help="folder for the disk test file (default: the temp dir)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    problem = output_problem(args.json)
    if problem:
        print(f"python -m perflab.machine.report: --json {args.json}: {problem}; nothing measured", file=sys.stderr)
        return 2
    command = "python -m perflab.machine.report" + ("" if argv is None and len(sys.argv) <= 1 else " " + " ".join(
        sys.argv[1:] if argv is None else argv))
    print(f"$ {command}", flush=True)
    card = measure(quick=args.quick, progress=not args.no_progress, disk_dir=args.disk_dir)
    card["command"] = command
    reference, line = load_reference(args.reference)
    print(render(card, reference, line))
    out = Path(args.json)
    try:
        out.write_text(json.dumps(card, indent=1))
    except OSError as err:  # the folder changed while measuring: still one line
        print(f"python -m perflab.machine.report: --json {args.json}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(f"\nJSON written to {out}")
    return 1 if card["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
