"""The figures of chapter 2's links: host <-> device copies (2.2) and an all-reduce swept over
message sizes on several GPUs (the several-GPUs page). Plotting only: the measurements are
:mod:`perflab.machine.transfer`'s and :mod:`perflab.machine.interconnect`'s; kept apart from
them so that the torchrun workers that import ``interconnect`` do not import matplotlib.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from perflab.machine import interconnect
from perflab.machine.transfer import TransferPoint


def plot_copy_rates(points: Sequence[TransferPoint], pcie_Bps: float | None = None):
    """Draw chapter 2.2's host <-> device figure: GB/s against bytes per copy (log 2 axis) for
    the four copies of :func:`host_device_sweep` (``points``), D2H as open squares so that they
    show where they lie on H2D's curve, and the PCIe link's theoretical rate per direction
    (``pcie_Bps``, bytes/s, from :func:`pcie_bandwidth`) as a dotted line when given. Returns
    the matplotlib Figure, not yet shown (:func:`perflab.record.plotting.finish` shows it).

    Raises:
        ValueError: empty ``points``.
    """
    points = list(points)
    if not points:
        raise ValueError("points must not be empty (host_device_sweep's result)")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for attr, style in (("h2d_pinned", "o-"), ("h2d_pageable", "o--"),
                        ("d2h_pinned", "s-"), ("d2h_pageable", "s--")):
        d2h = attr.startswith("d2h")
        ax.plot([p.nbytes for p in points], [getattr(p, attr) / 1e9 for p in points],
                style, label=attr.replace("_", " "), ms=7 if d2h else 4,
                mfc="none" if d2h else None)
    if pcie_Bps:
        ax.axhline(pcie_Bps / 1e9, color="k", ls=":", lw=1,
                   label="PCIe, per direction (theory)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="bytes per copy", ylabel="GB/s", title="host <-> device copies")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_allreduce_busbw(result: "interconnect.AllReduceResult", fit: "interconnect.AlphaBeta",
                         link_bw: float | None = None, alpha_s: float = 10e-6,
                         peer_Bps: float | None = None):
    """Draw the several-GPUs page's all-reduce figure: bus bandwidth (GB/s, log) against the
    message size per rank (bytes, log 2) of ``result`` (:func:`interconnect.allreduce_sweep`),
    the alpha-beta ``fit`` (:func:`interconnect.alpha_beta`) as a dashed line, and when
    ``link_bw`` (bytes/s per direction) is given, chapter 2's prediction over that link with
    latency ``alpha_s`` (seconds) on 2 ranks, with ``peer_Bps`` (the measured peer copy,
    bytes/s) as a line when given. Returns the matplotlib Figure, not yet shown
    (:func:`perflab.record.plotting.finish` shows it).

    Raises:
        ValueError: a result without points.
    """
    if not result.points:
        raise ValueError("result has no points (allreduce_sweep's result)")
    xs = [p.nbytes for p in result.points]
    n = result.world_size
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [p.busbw / 1e9 for p in result.points], "o-",
            label=f"all-reduce busbw ({result.backend})")
    ax.plot(xs, [interconnect.bus_bandwidth(s, fit.seconds(s, n), n) / 1e9 for s in xs],
            "k--", lw=1, label="alpha-beta fit")
    if link_bw:
        ax.plot(xs, [interconnect.bus_bandwidth(s, interconnect.allreduce_time(
            s, link_bw, 2, alpha_s), 2) / 1e9 for s in xs], "C3:",
            label="predicted (chapter 2)")
        if peer_Bps:
            ax.axhline(peer_Bps / 1e9, color="C2", ls="--", lw=1, label="peer copy, measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="message size (bytes per rank)", ylabel="busbw (GB/s)",
           title=f"all-reduce on {n} ranks ({result.backend})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
