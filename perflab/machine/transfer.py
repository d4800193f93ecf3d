"""Copies between host memory and GPU memory, and between GPUs.

* Host <-> device copies cross the PCIe link. The GPU's copy engines read and write host memory
  by DMA, which requires the pages to stay put: *pinned* (page-locked) memory. From ordinary
  *pageable* memory the CUDA driver first copies each chunk into a pinned staging buffer, so a
  pageable copy costs an extra host-side memcpy (CUDA C++ Best Practices Guide, "Pinned Memory").
* ``non_blocking=True`` lets ``Tensor.to``/``copy_`` return before the copy finishes only when the
  host side is pinned; it never makes a copy on the current stream overlap with kernels on that
  same stream (PyTorch tutorial "A guide on good usage of non_blocking and pin_memory()").
  Chapter 2 measures it on its page (:mod:`perflab.machine.nonblocking`), and times the copies
  there too (:mod:`perflab.machine.copies`); this module repeats them in rounds beside their
  staging inputs and judges the pageable model.
* Peer copies go GPU to GPU over NVLink (or PCIe) without touching host memory.

Bandwidths are bytes/s counting the bytes transferred once (not read + write). Timing:
:func:`perflab.core.timing.benchmark` for host <-> device, CUDA events for peer copies.
"""

from __future__ import annotations

import ctypes
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import torch

from perflab.core.device import gpu_count, has_gpu
from perflab.core.progress import progress as show_progress
from perflab.core.timing import Stopwatch, event_timer
from perflab.core.validate import (integer, integers, number, one_of, positive,
                                   positive_int)
from perflab.machine import cpu
# chapter 2's copies, taught on its page: the rounds below repeat them
from perflab.machine.copies import TransferPoint, host_device_sweep

__all__ = [
    "PCIE_GT_PER_S",
    "PageableRounds",
    "STAGING_COPIES",
    "band_position",
    "describe_positions",
    "median_points",
    "model_verdict",
    "pageable_prediction",
    "pageable_rounds",
    "pcie_bandwidth",
    "peer_access",
    "peer_copy_bandwidth",
    "peer_copy_sweep",
    "staging_copy_bandwidth",
    "staging_rates",
]

#: Per-lane signalling rate (GT/s) and line-code efficiency by PCIe generation, from the PCI-SIG
#: base specifications: 8b/10b encoding up to 2.0, 128b/130b from 3.0 to 5.0.
PCIE_GT_PER_S: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
}


def pcie_bandwidth(generation: int, width: int) -> float:
    """Theoretical PCIe bandwidth per direction in bytes/s: ``GT/s x lanes x encoding / 8``.

    Gen5 x16: 32 GT/s x 16 x 128/130 / 8 = 63.0 GB/s each way. Real DMA reaches less (packet
    headers and flow control take their share).

    Raises:
        ValueError: a generation not in :data:`PCIE_GT_PER_S` or a width that is not 1-32 lanes.
    """
    one_of("generation", generation, sorted(PCIE_GT_PER_S))
    integer("width", width, 1, 32)
    rate, efficiency = PCIE_GT_PER_S[generation]
    return rate * 1e9 * width * efficiency / 8


def pageable_prediction(pinned_Bps: float, host_copy_Bps: float) -> tuple[float, float]:
    """Bounds on pageable copy bandwidth from the staging model, in bytes/s: ``(serial, pipelined)``.

    A pageable copy moves every byte twice: a host memcpy into a pinned staging buffer (at
    ``host_copy_Bps / 2``, since ``host_copy_Bps`` counts bytes read + written as
    :func:`perflab.machine.cpu.memory_bandwidth` does) and the DMA (at ``pinned_Bps``). Done one after the
    other: ``1 / (1/pinned + 2/host_copy)``; perfectly overlapped: ``min(pinned, host_copy / 2)``.

    Raises:
        ValueError: a non-positive bandwidth.
    """
    positive("pinned_Bps", pinned_Bps)
    positive("host_copy_Bps", host_copy_Bps)
    staging = host_copy_Bps / 2
    return 1 / (1 / pinned_Bps + 1 / staging), min(pinned_Bps, staging)


def band_position(measured: Sequence[float], serial: Sequence[float],
                  overlapped: Sequence[float]) -> str:
    """Where a pageable copy's rate lies against the staging model's band, over rounds.

    Round ``r`` measured ``measured[r]`` (bytes/s) beside the band ``[serial[r], overlapped[r]]``
    that :func:`pageable_prediction` gives from the same round's inputs. No widening: the rounds
    are the spread. Returns ``"inside"`` when every round lies in its band, ``"above"`` when every
    round lies above the overlapped bound (the fastest the model allows), ``"below"`` when every
    round lies below the serial bound, and ``"undecided"`` otherwise (the rounds straddle an
    edge, or lie on both sides).

    Raises:
        ValueError: sequences of different lengths or empty, a value that is not positive, or
            ``serial[r] > overlapped[r]``.
    """
    rows = list(zip(measured, serial, overlapped, strict=False))
    if not rows or not len(measured) == len(serial) == len(overlapped):
        raise ValueError("measured, serial and overlapped need one value per round each, "
                         f"got {len(measured)}, {len(serial)} and {len(overlapped)}")
    for m, lo, hi in rows:
        positive("measured", m)
        positive("serial", lo)
        positive("overlapped", hi)
        if lo > hi:
            raise ValueError(f"serial must not exceed overlapped, got {lo} > {hi}")
    if all(lo <= m <= hi for m, lo, hi in rows):
        return "inside"
    if all(m > hi for m, _, hi in rows):
        return "above"
    if all(m < lo for m, lo, _ in rows):
        return "below"
    return "undecided"


def median_points(rounds: Sequence[Sequence["TransferPoint"]]) -> list["TransferPoint"]:
    """The per-size median of several :func:`host_device_sweep` results over the same sizes.

    A field is the median of the rounds that measured it: a NaN (a D2H copy a round skipped,
    ``d2h=False``) is left out, and a field no round measured stays NaN.

    Raises:
        ValueError: no rounds, or rounds whose sizes differ.
    """
    rounds = [list(r) for r in rounds]
    if not rounds:
        raise ValueError("rounds must hold at least one sweep")
    sizes = [p.nbytes for p in rounds[0]]
    if any([p.nbytes for p in r] != sizes for r in rounds):
        raise ValueError("every round must sweep the same sizes in the same order")
    fields = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")

    def median(values):
        kept = [v for v in values if not math.isnan(v)]
        return statistics.median(kept) if kept else math.nan

    return [TransferPoint(n, *(median([getattr(r[i], f) for r in rounds]) for f in fields))
            for i, n in enumerate(sizes)]


#: Where a size's pageable copy lies against a band (:func:`band_position`), in words.
_WHERE = {"inside": "in the band", "above": "above the band", "below": "below the band",
          "undecided": "across an edge of the band"}


def model_verdict(positions: Sequence[str], share: float = 0.75) -> bool | None:
    """The verdict on a staging model from the sizes' :func:`band_position` results.

    True when at least ``share`` of the sizes lie inside the band; False when they fall short
    even counting every undecided size as inside; None (undecided) otherwise, so an undecided
    size never decides the verdict either way.

    Raises:
        ValueError: no positions, one that :func:`band_position` does not return, or ``share``
            outside (0, 1].
    """
    positions = list(positions)
    if not positions:
        raise ValueError("positions must hold at least one size")
    for p in positions:
        one_of("positions", p, tuple(_WHERE))
    number("share", share, above=0.0, maximum=1.0)
    need = share * len(positions)
    inside = positions.count("inside")
    if inside >= need:
        return True
    return None if inside + positions.count("undecided") >= need else False


def describe_positions(positions: Sequence[str]) -> str:
    """The sizes' :func:`band_position` results counted in words, e.g. ``"in the band at 1 of 3
    sizes, above the band at 2 of 3 sizes"`` (in the order inside, above, below, undecided).

    Raises:
        ValueError: no positions, or one that :func:`band_position` does not return.
    """
    positions = list(positions)
    if not positions:
        raise ValueError("positions must hold at least one size")
    for p in positions:
        one_of("positions", p, tuple(_WHERE))
    return ", ".join(f"{words} at {positions.count(w)} of {len(positions)} sizes"
                     for w, words in _WHERE.items() if w in positions)


#: The staging copies that feed :func:`pageable_prediction`, one band each: one thread copying
#: the whole buffer (:func:`perflab.machine.cpu.memory_bandwidth`), the same chunk by chunk into
#: one reused 2 MiB buffer, and that pattern with the C library's memcpy
#: (:func:`staging_copy_bandwidth`).
STAGING_COPIES = ("one copy", "chunked", "memcpy")


def staging_rates(sizes: Sequence[int]) -> dict[str, dict[int, float]]:
    """One round of the staging copies of :data:`STAGING_COPIES` at each size, bytes/s (read +
    written): ``{kind: {nbytes: rate}}``.

    Raises:
        ValueError: empty ``sizes``, or a size that is not a positive multiple of 4.
    """
    sizes = integers("sizes", sizes, 4, multiple_of=4)
    return {"one copy": {n: cpu.memory_bandwidth(n, 1) for n in sizes},
            "chunked": {n: staging_copy_bandwidth(n) for n in sizes},
            "memcpy": {n: staging_copy_bandwidth(n, copier="memcpy") for n in sizes}}


@dataclass
class PageableRounds:
    """Alternated rounds of the host <-> device sweep and its staging inputs
    (:func:`pageable_rounds`).

    ``sweeps[r]`` is round ``r``'s :func:`host_device_sweep`, ``staging[r]`` the same round's
    :func:`staging_rates`, and ``telemetry`` the first round's telemetry summary (None without
    one). Each round's band comes from that round's pinned copy and staging copy, so the rounds,
    not a widening, are the band's spread.
    """

    sweeps: list[list[TransferPoint]]
    staging: list[dict[str, dict[int, float]]]
    telemetry: object = None

    def __post_init__(self):
        if not self.sweeps or len(self.sweeps) != len(self.staging):
            raise ValueError("sweeps and staging need one entry per round each, got "
                             f"{len(self.sweeps)} and {len(self.staging)}")
        median_points(self.sweeps)             # the rounds sweep the same sizes

    def points(self) -> list[TransferPoint]:
        """Each size's median over the rounds (:func:`median_points`; D2H over the rounds
        that timed it)."""
        return median_points(self.sweeps)

    def bands(self, kind: str) -> list[list[tuple[float, float]]]:
        """``[round][size] -> (serial, overlapped)`` of :func:`pageable_prediction`, from each
        round's pinned H2D copy and its ``kind`` staging copy (one of :data:`STAGING_COPIES`).

        Raises:
            ValueError: an unknown ``kind``.
        """
        one_of("kind", kind, STAGING_COPIES)
        return [[pageable_prediction(p.h2d_pinned, st[kind][p.nbytes]) for p in sw]
                for sw, st in zip(self.sweeps, self.staging)]

    def median_band(self, kind: str) -> dict[int, tuple[float, float]]:
        """``{nbytes: (serial, overlapped)}``, each bound the median over the rounds."""
        bands = self.bands(kind)
        return {p.nbytes: tuple(statistics.median(b[i][j] for b in bands) for j in (0, 1))
                for i, p in enumerate(self.sweeps[0])}

    def positions(self, kind: str, min_bytes: int = 2**20) -> list[str]:
        """:func:`band_position` of every size from ``min_bytes`` up: each round's pageable
        H2D copy against that round's ``kind`` band."""
        positive_int("min_bytes", min_bytes)
        bands = self.bands(kind)
        return [band_position([sw[i].h2d_pageable for sw in self.sweeps],
                              [b[i][0] for b in bands], [b[i][1] for b in bands])
                for i, p in enumerate(self.sweeps[0]) if p.nbytes >= min_bytes]


def pageable_rounds(sizes: Sequence[int], device=None, rounds: int = 3, watch=None,
                    sweep=None, staging=None, d2h_rounds: int | None = None) -> PageableRounds:
    """``rounds`` alternated rounds of the copy sweep and its staging inputs.

    Each round runs :func:`host_device_sweep` over ``sizes``, then :func:`staging_rates` at the
    same sizes, so each band is predicted from inputs measured beside its copy and a drift of
    the host (its clock, its caches' neighbours) shows as a spread between rounds.
    ``watch``, if given, is called once per round to give a context manager around that round's
    sweep with a ``summary()`` (e.g. ``lambda: Telemetry(work="link")``); the first round's
    summary is kept. ``sweep`` and ``staging`` replace the two measurements (for tests).
    ``d2h_rounds``: only the first ``d2h_rounds`` rounds also time the D2H copies, which no
    band reads (None: every round); the later ones sweep with ``d2h=False``.

    Raises:
        RuntimeError: no CUDA GPU (from the sweep).
        ValueError: ``rounds`` or ``d2h_rounds`` below 1, or bad ``sizes`` (from the sweep).
    """
    positive_int("rounds", rounds)
    if d2h_rounds is not None:
        integer("d2h_rounds", d2h_rounds, 1)
    sweep = sweep or host_device_sweep
    staging = staging or staging_rates
    sizes = list(sizes)
    sweeps, stage, summary = [], [], None
    for r in range(rounds):
        kw = {} if d2h_rounds is None or r < d2h_rounds else {"d2h": False}
        if watch is None:
            sweeps.append(list(sweep(sizes, device, **kw)))
        else:
            with watch() as tel:
                sweeps.append(list(sweep(sizes, device, **kw)))
            summary = tel.summary() if r == 0 else summary
        stage.append(staging(sizes))
    return PageableRounds(sweeps, stage, summary)


def staging_copy_bandwidth(nbytes: int, chunk: int = 2**21, reps: int = 5,
                           copier: str = "torch") -> float:
    """One thread's host copy of ``nbytes`` in the staging pattern, bytes/s (read + written).

    A pageable copy's staging memcpy does not write ``nbytes`` of fresh memory: the driver copies
    the buffer chunk by chunk into a pinned staging buffer of its own, which it reuses, so the
    writes may stay in the CPU's caches while only the reads stream from DRAM. This copies a
    pageable ``nbytes`` source into one reused ``chunk``-byte buffer (pinned when a GPU is
    present), chunk after chunk, on one intra-op thread, and counts bytes read plus bytes
    written as :func:`perflab.machine.cpu.memory_bandwidth` does, so the figure drops into
    :func:`pageable_prediction` in its place. The driver's own chunk size is not documented;
    ``chunk`` is a guess (2 MiB), and the result tests one candidate cause, not the driver.
    Best of ``reps`` passes (after one untimed pass). ``copier`` says who copies each chunk:
    ``"torch"`` (``Tensor.copy_``, ATen's loop) or ``"memcpy"`` (the C library's ``memmove``
    through :mod:`ctypes`, the kind of copy a driver's staging thread makes, which may use
    wider or non-temporal stores than ATen's loop).

    Raises:
        ValueError: ``nbytes`` or ``chunk`` not a positive multiple of 4, ``reps`` below 1, or
            an unknown ``copier``.
    """
    integer("nbytes", nbytes, 4, multiple_of=4)
    integer("chunk", chunk, 4, multiple_of=4)
    positive_int("reps", reps)
    one_of("copier", copier, ("torch", "memcpy"))
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    n = min(chunk, nbytes) // 4
    buf = torch.empty(n, dtype=torch.float32, pin_memory=has_gpu())
    pieces = [src[i:i + n] for i in range(0, src.numel(), n)]
    best = float("inf")
    before = torch.get_num_threads()
    torch.set_num_threads(1)            # one thread, as the driver's staging
    try:
        for rep in range(reps + 1):
            with Stopwatch() as watch:  # host time; no GPU work to wait for
                for piece in pieces:
                    if copier == "memcpy":
                        ctypes.memmove(buf.data_ptr(), piece.data_ptr(),
                                       piece.numel() * 4)
                    else:
                        buf[:piece.numel()].copy_(piece)
            if rep:                     # the first pass warms the pages
                best = min(best, watch.seconds)
    finally:
        torch.set_num_threads(before)
    return 2 * nbytes / best


def _check_nbytes(nbytes) -> None:
    positive_int("nbytes", nbytes)


def peer_access(src: int = 0, dst: int = 1) -> bool:
    """Whether GPU ``src`` can read and write GPU ``dst``'s memory directly (``torch.cuda.can_device_access_peer``).

    Raises:
        RuntimeError: fewer than two GPUs.
        ValueError: an index this machine does not have, or ``src == dst``.
    """
    _check_pair(src, dst)
    return bool(torch.cuda.can_device_access_peer(src, dst))


def _check_pair(src: int, dst: int) -> None:
    n = gpu_count()
    if n < 2:
        raise RuntimeError(f"peer copies need 2 GPUs; this machine has {n}")
    if src == dst or not (0 <= src < n and 0 <= dst < n):
        raise ValueError(f"src and dst must be two different GPUs among 0..{n - 1}, got {src} and {dst}")


def peer_copy_bandwidth(nbytes: int, src: int = 0, dst: int = 1, reps: int = 10) -> float:
    """Bandwidth in bytes/s of copying ``nbytes`` from GPU ``src`` to GPU ``dst`` (one direction).

    ``dst_tensor.copy_(src_tensor)``: PyTorch runs a cross-device copy on the source device's
    current stream (a direct peer copy when peer access is possible), so CUDA events recorded on
    that stream bracket it (:func:`perflab.core.timing.event_timer`, median of ``reps``).

    Raises:
        RuntimeError: fewer than two GPUs.
        ValueError: bad indices or ``nbytes``.
    """
    _check_nbytes(nbytes)
    _check_pair(src, dst)
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}").fill_(1)
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    with torch.cuda.device(src):
        seconds = event_timer(lambda: b.copy_(a, non_blocking=True), torch.device("cuda", src),
                              warmup=3, reps=reps).median_s
    torch.cuda.synchronize(dst)
    return nbytes / seconds


def peer_copy_sweep(sizes: Sequence[int], src: int = 0, dst: int = 1, progress: bool = False) -> list[tuple[int, float]]:
    """:func:`peer_copy_bandwidth` at each size: ``[(nbytes, bytes/s)]``.

    Raises:
        RuntimeError: fewer than two GPUs.
        ValueError: empty ``sizes`` or a bad size.
    """
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must not be empty")
    iterator = show_progress(sizes, "peer copies", progress)
    return [(s, peer_copy_bandwidth(s, src, dst)) for s in iterator]
