"""Checks for lab 5 (data loading): each prints one sentence when right and raises
:class:`~perflab.labs.exercises.ExerciseFailed` with one sentence saying what is wrong.

Speed checks compare two loaders measured one after the other in the same process (a ratio),
and insist on ``num_workers=0`` so that the speed-up comes from less work per image, not from a
machine with more cores. Correctness checks read what the student's code produced (thread
counts in real workers, the bytes of a converted file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from perflab.labs.exercises import ExerciseFailed, check_ratio_at_least, not_done
from perflab.loading import datasets as ds

__all__ = ["check_loader_speedup", "check_num_workers", "check_oversubscription",
           "check_storage_conversion", "rule_of_thumb_workers"]


def _first_images(loader: DataLoader):
    batch = next(iter(loader))
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def check_loader_speedup(slow: DataLoader, fast: DataLoader | None, minimum: float = 4.0,
                         batches: int = 4) -> dict:
    """Exercise 1: ``fast`` gives batches like ``slow``'s at least ``minimum`` times the rate.

    Both loaders must run in this process (``num_workers=0``) and yield ``(x, y)`` with ``x`` a
    float32 tensor of the same shape. Both are timed with one torch thread (restored after), so
    the ratio compares work per image and cannot depend on how many idle cores the machine has. Rates come from :func:`perflab.loading.datasets.loader_rate` over
    ``batches`` batches each, measured one after the other. Returns ``{"slow", "fast",
    "speedup"}`` (images/s, images/s, ratio).

    Raises:
        ExerciseFailed: ``fast`` missing, using workers, giving other shapes or dtypes, or too slow.
    """
    if fast is None:
        not_done(1, "set fast_loader to your DataLoader.")
    if not isinstance(fast, DataLoader):
        raise ExerciseFailed(f"✗ fast_loader must be a DataLoader, got {type(fast).__name__}.")
    for name, loader in (("slow_loader", slow), ("fast_loader", fast)):
        if loader.num_workers != 0:
            raise ExerciseFailed(
                f"✗ {name} uses num_workers={loader.num_workers}: set num_workers=0, the "
                "speed-up must come from less work per image, not from more cores.")
    a, b = _first_images(slow), _first_images(fast)
    if b.dtype != a.dtype or tuple(b.shape) != tuple(a.shape):
        raise ExerciseFailed(
            f"✗ fast_loader's batches are {b.dtype} {tuple(b.shape)}; the slow loader's are "
            f"{a.dtype} {tuple(a.shape)}: same crops, same batch size, normalized floats.")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core each: the comparison is of work per image
    try:
        r_slow = ds.loader_rate(slow, batches=batches)["images_per_s"]
        r_fast = ds.loader_rate(fast, batches=batches)["images_per_s"]
    finally:
        torch.set_num_threads(threads)
    check_ratio_at_least(r_fast, r_slow, minimum, "fast_loader against slow_loader, images/s")
    return {"slow": r_slow, "fast": r_fast, "speedup": r_fast / r_slow}


def check_oversubscription(total_threads, broken_init: Callable, fixed_init: Callable | None,
                           num_workers: int = 2) -> bool:
    """Exercise 2: ``total_threads`` is the number of torch threads ``num_workers`` workers run
    with ``broken_init``, and ``fixed_init`` leaves each worker one thread.

    Measured with :func:`perflab.loading.datasets.worker_thread_counts` in real worker processes.

    Raises:
        ExerciseFailed: a missing answer, a wrong count, or a fix that leaves more threads.
    """
    if total_threads is None or fixed_init is None:
        not_done(2, "set total_threads and fixed_init.")
    measured = ds.worker_thread_counts(num_workers, broken_init)
    expected = sum(measured.values())
    if total_threads != expected:
        raise ExerciseFailed(
            f"✗ total_threads is {total_threads!r}, but {num_workers} workers ran "
            f"{sorted(measured.values())} torch threads each ({expected} in all). Hint: count "
            "torch.get_num_threads() inside a worker, after worker_init_fn.")
    fixed = ds.worker_thread_counts(num_workers, fixed_init)
    if any(t != 1 for t in fixed.values()):
        raise ExerciseFailed(
            f"✗ with fixed_init the workers still run {sorted(fixed.values())} threads: "
            "setting OMP_NUM_THREADS after torch started changes nothing; call "
            "torch.set_num_threads(1) in the worker.")
    print(f"✓ {num_workers} workers x {expected // num_workers} threads = {expected} threads "
          f"before, {len(fixed)} after your fix.")
    return True


def rule_of_thumb_workers(curve: dict, fraction: float = 0.9) -> int:
    """The fewest workers reaching ``fraction`` of the best rate of a measured ``curve``
    (``{num_workers: images/s}``): more workers past that point cost memory and start-up time
    for almost no throughput.

    Raises:
        ValueError: an empty curve or a ``fraction`` outside (0, 1].
    """
    if not curve:
        raise ValueError("curve is empty")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    best = max(curve.values())
    return min(n for n, r in curve.items() if r >= fraction * best)


def check_num_workers(curve, choice, cores: int) -> int:
    """Exercise 3: ``curve`` is a measured ``{num_workers: images/s}`` from 0 up to ``cores``
    (at least three points), and ``choice`` is the fewest workers within 10 % of its best rate.

    Raises:
        ExerciseFailed: missing or malformed curve, or another choice.
    """
    if curve is None or choice is None:
        not_done(3, "set curve and best_workers.")
    if not isinstance(curve, dict) or len(curve) < min(3, cores + 1):
        raise ExerciseFailed("✗ curve must be a dict {num_workers: images/s} with at least "
                             "three points (0, 1 and the number of cores).")
    if 0 not in curve or max(curve) != cores:
        raise ExerciseFailed(f"✗ measure from num_workers=0 up to the {cores} cores; the curve "
                             f"has {sorted(curve)}.")
    if any(not (isinstance(r, (int, float)) and r > 0) for r in curve.values()):
        raise ExerciseFailed("✗ every rate in curve must be a positive number (images/s).")
    want = rule_of_thumb_workers(curve)
    if choice != want:
        raise ExerciseFailed(
            f"✗ best_workers is {choice!r}; your curve reaches 90 % of its best rate "
            f"({max(curve.values()):,.0f} images/s) already at {want} workers.")
    print(f"✓ num_workers={choice}: the fewest that reach 90 % of the best rate on this machine.")
    return choice


def check_storage_conversion(path, files: Sequence, side: int, jpeg_rate, memmap_rate,
                             minimum: float = 3.0) -> float:
    """Exercise 4: ``path`` holds the images of ``files`` decoded and resized
    (:func:`perflab.loading.datasets.decode_resized`) as raw uint8 ``(N, side, side, 3)`` with a
    ``<path>.json`` that :class:`perflab.loading.datasets.MemmapImages` reads, and reading it was at
    least ``minimum`` times faster than reading the JPEGs (rates measured in the same run).
    Returns the speed-up.

    Raises:
        ExerciseFailed: missing answers, a wrong size or layout, other pixels, or too slow.
    """
    if path is None or jpeg_rate is None or memmap_rate is None:
        not_done(4, "set memmap_path, jpeg_rate and memmap_rate.")
    path = Path(path)
    meta_path = Path(str(path) + ".json")
    if not path.exists() or not meta_path.exists():
        raise ExerciseFailed(f"✗ expected {path} and {meta_path}; one of them is missing.")
    want = (len(files), side, side, 3)
    shape = tuple(json.loads(meta_path.read_text()).get("shape", ()))
    if shape != want or path.stat().st_size != int(np.prod(want)):
        raise ExerciseFailed(f"✗ the file should hold uint8 {want} ({int(np.prod(want)):,} "
                             f"bytes); its JSON says {shape} and it has "
                             f"{path.stat().st_size:,} bytes.")
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=want)
    for i in sorted({0, len(files) // 3, len(files) // 2, len(files) - 1}):
        diff = float(np.abs(mm[i].astype(np.int16) - ds.decode_resized(files[i], side)).mean())
        if diff > 2.0:
            raise ExerciseFailed(
                f"✗ image {i} differs from decode_resized(files[{i}], {side}) by {diff:.1f} "
                "grey levels on average: store height x width x RGB (NHWC), in file order.")
    check_ratio_at_least(memmap_rate, jpeg_rate, minimum, "memmap reads against JPEG reads")
    return memmap_rate / jpeg_rate
