"""Where a roofline's machines come from: the vendors' datasheets, chapter 1's reference run, or
this machine measured now.

* :func:`datasheet_machines`: the vendor peaks in :data:`perflab.machine.datasheets.DATASHEETS`;
* :func:`reference_machine`: chapter 1's reference run (its glued, measured ceilings);
* :func:`measure_machine`: this machine, measured now (copy bandwidth and a sweep of square
  matrix products, whose intensity grows with their size), under telemetry.

Each is a :class:`perflab.machine.explorer.Machine`, which the
:class:`~perflab.machine.explorer.RooflineExplorer` draws. Units: FLOP/byte, FLOP/s, bytes/s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from perflab.core.device import cpu_name, device as default_device
from perflab.core.formats import check as _check_precision
from perflab.core.progress import progress as show_progress
from perflab.core.telemetry import MIN_SAMPLES, Telemetry
from perflab.core.validate import integers, positive, positive_int
from perflab.machine import roofline
from perflab.machine.datasheets import DATASHEETS
from perflab.machine.explorer import PRECISIONS, Machine, MeasuredPoint, matmul_intensity

__all__ = ["datasheet_machines", "measure_machine", "reference_machine"]


def datasheet_machines() -> list[Machine]:
    """One :class:`Machine` per entry of :data:`perflab.machine.datasheets.DATASHEETS` (dense peaks, HBM
    bandwidth), named ``"<device> (datasheet)"``, with the datasheet as ``source``."""
    out = []
    for name, sheet in DATASHEETS.items():
        peaks = {p: sheet[f"{p}_flops"] for p in PRECISIONS if f"{p}_flops" in sheet}
        out.append(Machine(f"{name} (datasheet)", sheet["memory_bandwidth"], peaks, sheet["source"]))
    return out


def reference_machine(glued: Mapping[str, Any], run: Mapping[str, Any] | None = None) -> Machine | None:
    """Chapter 1's reference run as a :class:`Machine` with measured roofs, or None without them.

    Args:
        glued: values glued by chapter 1 (:func:`perflab.record.provenance.read_glued`):
            ``copy_bandwidth_TBps`` (the memory roof) and ``matmul_tflops_<precision>`` for
            ``fp32``/``tf32``/``bf16`` (compute roofs); ``roofline_knee_repeat`` (optional) places
            the measured knee of the ``x*2`` sweep at ``repeat / 8`` FLOP/byte, and
            ``roofline_compute_plateau_tflops`` (optional) is that sweep's compute plateau.
        run: that notebook's ``reference_run`` metadata, for the device name.

    Returns None when ``copy_bandwidth_TBps`` or every matmul rate is missing.
    """
    bw = glued.get("copy_bandwidth_TBps")
    peaks = {p: glued[f"matmul_tflops_{p}"] * 1e12 for p in ("fp32", "tf32", "bf16")
             if isinstance(glued.get(f"matmul_tflops_{p}"), (int, float)) and glued[f"matmul_tflops_{p}"] > 0}
    if not isinstance(bw, (int, float)) or bw <= 0 or not peaks:
        return None
    devices = list((run or {}).get("devices") or [])
    device = devices[0] if devices else "reference device"
    when = ((run or {}).get("started") or "")[:10]
    knee = glued.get("roofline_knee_repeat")
    knee_intensity = knee / 8.0 if isinstance(knee, (int, float)) and knee > 0 else None
    plateau = glued.get("roofline_compute_plateau_tflops")
    knee_rate = plateau * 1e12 if isinstance(plateau, (int, float)) and plateau > 0 else None
    return Machine(f"{device} (chapter 1, measured)", bw * 1e12, peaks,
                   f"chapter 1's reference run{' of ' + when if when else ''}: copy bandwidth and "
                   f"matrix-product rates measured on {device}",
                   knee_intensity=knee_intensity, knee_rate=knee_rate)


def _clock_in(samples: Sequence[Mapping[str, Any]], windows: Sequence[tuple[float, float]]
              ) -> float | None:
    """The median SM clock (Hz) of the telemetry ``samples`` (each with ``t`` and
    ``sm_clock_mhz``) that fall inside ``windows``; None with fewer than
    :data:`perflab.core.telemetry.MIN_SAMPLES` of them (too short to read a clock)."""
    clocks = [s["sm_clock_mhz"] for s in samples if s.get("sm_clock_mhz") is not None
              and any(lo <= s["t"] <= hi for lo, hi in windows)]
    return float(np.median(clocks)) * 1e6 if len(clocks) >= MIN_SAMPLES else None


def measure_machine(
    device=None,
    sizes: Sequence[int] = (64, 128, 256, 512, 1024),
    precisions: Sequence[str] | None = None,
    copy_numel: int = 2**24,
    progress: bool = False,
    bandwidth: float | None = None,
    peaks: Mapping[str, float] | None = None,
) -> Machine:
    """Measure this machine: copy bandwidth, then square matrix products of each size.

    The memory roof is :func:`perflab.machine.roofline.copy_bandwidth` (bytes read + written) unless
    ``bandwidth`` is given (the run's ceilings: :mod:`perflab.machine.ceilings`). For each precision and
    size ``n``, :func:`perflab.machine.roofline.matmul_rate` times an ``n x n`` product (FLOPs
    ``2 n^3``); each becomes a :class:`MeasuredPoint` at :func:`matmul_intensity`. The products
    run under :class:`perflab.core.telemetry.Telemetry`, whose sentence (SM clock, power) becomes the
    machine's ``clock``; on a GPU each point also keeps the median SM clock of its own timed
    windows (``sm_clock_hz``), so a product's rate can be set against the peak at its clock.
    The machine is named "(this run's roofs)" when ``peaks`` are given, "(measured now)"
    otherwise. A precision's compute roof is ``peaks[precision]`` when given (the run's
    roofs: :meth:`perflab.machine.ceilings.Ceilings.compute_roof`, the clock model's peak at the maximum
    clock), else its best measured rate, a lower bound of the true peak.

    Args:
        device: a torch device (default :func:`perflab.core.device.device`).
        sizes: matrix sizes, each a positive integer.
        precisions: keys of :data:`PRECISIONS` to measure; default ``fp32`` on a CPU and
            ``fp32``, ``tf32``, ``bf16`` on a CUDA device. ``tf32`` needs CUDA; ``fp8`` is not
            measured here.
        copy_numel: float32 elements of the copied tensor (make it dwarf the last-level cache).
        progress: show a tqdm progress bar.
        bandwidth: the memory roof in bytes/s if already measured (then no copy is timed).
        peaks: compute roofs in FLOP/s per precision (each measured precision needs one).

    Raises:
        ValueError: empty or non-positive ``sizes``, an unknown or unmeasurable precision, a
            non-positive ``copy_numel`` or ``bandwidth``.
    """
    dev = torch.device(device) if device is not None else default_device()
    sizes = list(sizes)
    integers("sizes", sizes)
    if precisions is None:
        precisions = ["fp32", "tf32", "bf16"] if dev.type == "cuda" else ["fp32"]
    for p in precisions:
        _check_precision(p)
        if p == "fp8" or (p == "tf32" and dev.type != "cuda"):
            raise ValueError(f"precisions: {p!r} cannot be measured on {dev.type} by this function")
    positive_int("copy_numel", copy_numel)

    if bandwidth is None:
        bandwidth = roofline.copy_bandwidth(dev, copy_numel)
    bandwidth = positive("bandwidth", bandwidth)
    if peaks is not None:
        missing = [p for p in precisions if not peaks.get(p)]
        if missing:
            raise ValueError(f"peaks has no roof for {missing}")
    jobs = [(p, n) for p in precisions for n in sizes]
    jobs = show_progress(jobs, "matrix products", progress)
    rates, spans = [], []
    with Telemetry(device=dev) as tel:
        for p, n in jobs:
            first = len(tel.windows)         # the timed windows this product opens
            rates.append((p, n, roofline.matmul_rate(dev, n, p)))
            spans.append((first, len(tel.windows)))
    points = []
    on_gpu = tel.summary().source == "NVML"
    for (p, n, rate), (a, b) in zip(rates, spans):
        clock = _clock_in(tel.samples, tel.windows[a:b]) if on_gpu else None
        points.append(MeasuredPoint(f"matmul n={n}", p, matmul_intensity(n, p), rate,
                                    2.0 * n**3 / rate, n, clock))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu: {cpu_name()}"
    if peaks is None:
        roofs = {p: max(pt.flops_per_s for pt in points if pt.precision == p) for p in precisions}
        source = "measured in this session: copy bandwidth and the best matrix-product rate per precision"
        label = f"{name} (measured now)"
    else:
        roofs = {p: float(peaks[p]) for p in precisions}
        source = "the run's roofs, given: a memory roof and compute roofs per precision"
        label = f"{name} (this run's roofs)"
    return Machine(label, bandwidth, roofs, source, points=tuple(points),
                   clock=tel.summary().sentence())
