"""Loading measured: read, decode and loader rates, the workers' CPU and memory.

* :func:`read_rate`, :func:`raw_read_rate`: items or bytes per second of reading a dataset or
  files in this process (cold stays cold: one timed pass); :func:`memmap_copy_rate`: the copy
  alone that a :class:`MemmapImages` read makes, :func:`memmap_wrapper_seconds` the rest of it;
* :func:`parallel_decode_rate`: the machine's own scaling of decoding with processes, without a
  DataLoader; :func:`cpu_rate` and :func:`gpu_rate`: decoding (or the whole pipeline) on loader
  workers and on the GPU; :func:`gpu_decode_profile` and :func:`kernel_seconds`: which engine or
  kernel did the work;
* :func:`loader_rate`: a DataLoader's steady state (the first round of batches and the last left
  out), with the CPU time of its workers;
* :func:`worker_memory_growth`: forked workers' private memory, grown by copy-on-read;
* :func:`small_cnn`, the model chapter 5's ladder feeds (its training loop is on the page,
  exported to :mod:`perflab.loading.training`; :func:`train_steps_clocked` runs it under its own
  sampler).

Rates are items (images) per second or bytes per second; times are seconds.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset, IterableDataset

from perflab.core.telemetry import Telemetry
from perflab.core.timing import Stopwatch, process_seconds, thread_seconds, timestamp
from perflab.core.validate import one_of, positive_int
from perflab.loading.loaders import collate_list, collate_packed, seed_worker, usable_cores
from perflab.loading.storage import MemmapImages
from perflab.loading.training import train_steps
from perflab.loading.transforms import (decode_pil, decode_resized, gpu_augment_list, gpu_decode,
                                       pil_pipeline)

try:  # Unix only: the CPU time of finished loader workers (None on Windows)
    import resource
except ImportError:
    resource = None

__all__ = ["read_rate", "memmap_copy_rate", "memmap_wrapper_seconds", "parallel_decode_rate", "parallel_decode",
           "loader_rate", "raw_read_rate",
           "kernel_seconds", "cpu_rate", "gpu_rate", "gpu_decode_profile", "small_cnn",
           "small_cnn_flops", "worker_memory_growth", "train_steps_clocked"]


def read_rate(dataset, n: int | None = None, batch: int = 64) -> float:
    """Items per second of reading ``n`` items of ``dataset`` in this process, front to back.

    Map-style datasets of single items are indexed ``0..n-1``; a :class:`MemmapImages` is read
    ``batch`` indices per call; an iterable dataset is iterated. One timed pass
    (:class:`perflab.core.timing.Stopwatch`), so a cold page cache stays cold.

    Raises:
        ValueError: ``n`` not positive or larger than the dataset.
    """
    if isinstance(dataset, IterableDataset):
        count = 0
        with Stopwatch() as sw:
            for _ in dataset:
                count += 1
                if n is not None and count >= n:
                    break
        return count / sw.seconds
    n = len(dataset) if n is None else positive_int("n", n)
    if n > len(dataset):
        raise ValueError(f"n={n} but the dataset has {len(dataset)} items")
    with Stopwatch() as sw:
        if isinstance(dataset, MemmapImages):
            for k in range(0, n, batch):
                dataset[list(range(k, min(n, k + batch)))]
        else:
            for i in range(n):
                dataset[i]
    return n / sw.seconds


def _memmap_pass(dataset, n: int | None, batch: int) -> int:
    """The images a pass over ``dataset`` reads (``n``, or all of them), with the arguments of
    :func:`memmap_copy_rate` and :func:`memmap_wrapper_seconds` checked.

    Raises:
        TypeError: ``dataset`` is not a :class:`MemmapImages`.
        ValueError: ``n`` or ``batch`` not positive, or ``n`` larger than the dataset.
    """
    if not isinstance(dataset, MemmapImages):
        raise TypeError(f"dataset must be a MemmapImages, got {type(dataset).__name__}")
    n = len(dataset) if n is None else positive_int("n", n)
    positive_int("batch", batch)
    if n > len(dataset):
        raise ValueError(f"n={n} but the dataset has {len(dataset)} items")
    return n


def memmap_copy_rate(dataset: MemmapImages, n: int | None = None, batch: int = 64) -> float:
    """Images per second of copying the batches :func:`read_rate` reads from ``dataset``, the
    way the read copies them: each batch of ``batch`` consecutive images is copied out of the
    mapped file into a fresh array by the same fancy index of sorted ``int64`` positions
    (``mm[np.arange(k, k + batch)]``) that :meth:`MemmapImages.__getitem__` uses.

    The same bytes, the same mapping (:meth:`MemmapImages.array`, so the source pages a read
    mapped are mapped here too), the same numpy copy path and the same fresh destinations as the
    read, without its index list and sort, its labels and the tensor it becomes: the read's copy
    alone, its prediction. (A plain slice copied with ``np.array(mm[k:k + batch])`` takes a
    faster numpy path, about 10 % faster on a CPU, and would not be like with like.) One timed
    pass (:class:`perflab.core.timing.Stopwatch`).

    Raises:
        TypeError: ``dataset`` is not a :class:`MemmapImages`.
        ValueError: ``n`` or ``batch`` not positive, or ``n`` larger than the dataset.
    """
    n = _memmap_pass(dataset, n, batch)
    mm = dataset.array()                          # the read's own mapping
    with Stopwatch() as sw:
        for k in range(0, n, batch):
            mm[np.arange(k, min(n, k + batch), dtype=np.int64)]   # as the read
    return n / sw.seconds


def memmap_wrapper_seconds(dataset: MemmapImages, n: int | None = None,
                           batch: int = 64) -> float:
    """Seconds per batch of what a :class:`MemmapImages` read does besides its copy: the same
    reads as :func:`read_rate` (``n`` images front to back, ``batch`` indices a call, through
    :meth:`MemmapImages.__getitem__`) of a twin map whose images are 1 x 1 pixel, with the
    dataset's labels.

    Every per-batch step of the read is there at the read's own batch size: the index list and
    its conversion and sort, the fancy index, the labels, the two tensors and the view; the copy
    shrinks from ``side * side * 3`` bytes an image to 3. (A read of one-image batches less one
    image's copy misses the steps whose cost grows with the indices of a batch.) The twin,
    ``<path>.1px.u8`` and its ``.json``, is written beside the map on first use. One timed pass
    (:class:`perflab.core.timing.Stopwatch`).

    Raises:
        TypeError: ``dataset`` is not a :class:`MemmapImages`.
        ValueError: ``n`` or ``batch`` not positive, or ``n`` larger than the dataset.
    """
    n = _memmap_pass(dataset, n, batch)
    twin = Path(str(dataset.path) + ".1px.u8")
    shape = (len(dataset), 1, 1, dataset.shape[3])
    meta = {"shape": list(shape), "labels": dataset.labels.tolist()}
    meta_path = Path(str(twin) + ".json")
    if not meta_path.exists() or json.loads(meta_path.read_text()) != meta:
        np.memmap(twin, dtype=np.uint8, mode="w+", shape=shape).flush()
        meta_path.write_text(json.dumps(meta))
    small = MemmapImages(twin)
    with Stopwatch() as sw:
        for k in range(0, n, batch):
            small[list(range(k, min(n, k + batch)))]
    return sw.seconds / math.ceil(n / batch)


def _decode_share(args: tuple) -> tuple[float, int, float]:
    files, side, t_go = args
    decode_resized(files[0], side)            # warm: this process's first decode, untimed
    while timestamp() < t_go:                 # every process starts at the same moment
        time.sleep(0.0005)
    cpu0 = process_seconds()
    with Stopwatch() as sw:
        for f in files:
            decode_resized(f, side)
    return sw.seconds, len(files), process_seconds() - cpu0


def _ready(_: int) -> int:
    return os.getpid()


def parallel_decode_rate(files: Sequence[str | os.PathLike], processes: int,
                         side: int = 144) -> float:
    """Images/s of :func:`parallel_decode` (see there): the ``"images_per_s"`` of one call."""
    return parallel_decode(files, processes, side)["images_per_s"]


def parallel_decode(files: Sequence[str | os.PathLike], processes: int,
                    side: int = 144) -> dict:
    """Images/s of ``processes`` plain processes, each decoding its own share of ``files`` with
    :func:`decode_resized` (what :class:`JpegFolder` does per item) and keeping nothing: no
    DataLoader, no batches sent anywhere. This is the machine's own scaling with cores (clock
    boost, shared caches and memory bandwidth, shared physical cores), the ceiling a loader with
    as many workers can reach. Processes are forked (spawned where fork does not exist) and
    started before the clock; each one then decodes one of its own files, untimed (its first
    decode: the decoder's set-up and the copy-on-write faults of a forked process), waits for a
    common start and times its whole share. The rate is the sum of the processes' own rates
    (each one's images over its own time): what they decode while all of them work, not set by
    the slowest one's start or straggling. One call is one sample: call it in
    :func:`perflab.core.rounds.interleaved` rounds for a spread.

    Returns ``{"images_per_s", "cpu_s_per_image"}``: the rate, and the CPU seconds (user +
    system, ``time.process_time`` in each process over its timed share) per image, all the
    processes together: what a decode costs a core, to set beside a loader worker's CPU per
    image (:func:`loader_rate`'s ``worker_window_cpu_s``).

    Raises:
        ValueError: ``processes`` not a positive int, or fewer ``files`` than ``processes``.
    """
    positive_int("processes", processes)
    if len(files) < processes:
        raise ValueError(f"need at least processes={processes} files, got {len(files)}")
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        list(pool.map(_ready, range(4 * processes)))           # every process up
        t_go = timestamp() + 0.1 + 0.01 * processes            # after every warm-up
        shares = [(list(files[k::processes]), side, t_go) for k in range(processes)]
        done = list(pool.map(_decode_share, shares))
    return {"images_per_s": sum(n / t for t, n, _ in done),
            "cpu_s_per_image": sum(c for _, _, c in done) / sum(n for _, n, _ in done)}


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far, from Linux's
    ``/proc/<pid>/stat``; None where it cannot be read (another OS, a process gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _workers_cpu_s(it) -> float | None:
    """CPU seconds the live workers of a DataLoader iterator have used so far (None without
    workers, or where /proc cannot say)."""
    procs = getattr(it, "_workers", None)
    if not procs:
        return None
    seconds = [_proc_cpu_s(p.pid) for p in procs]
    return None if any(v is None for v in seconds) else sum(seconds)


def _private_dirty_bytes(pid: int) -> int | None:
    """Bytes of process ``pid``'s memory that are its own and written (``Private_Dirty`` of
    ``/proc/<pid>/smaps_rollup``): pages it copied on write. None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worker_memory_growth(dataset: Dataset, num_workers: int = 2, batch_size: int = 256
                         ) -> list[int] | None:
    """How much each forked loader worker's private memory grew while it read its share of
    ``dataset`` once: ``Private_Dirty`` (``/proc/<pid>/smaps_rollup``) after its first batch and
    after its last, in bytes, one value per worker.

    A forked worker shares the parent's pages until it writes one (copy-on-write). Reading a
    Python object writes its reference count, so a dataset holding Python objects is copied page
    by page into every worker that reads it: memory that grows with the data set and with the
    workers. Returns None where the measurement is not possible (no ``fork`` start method, no
    ``/proc``).

    Raises:
        ValueError: ``num_workers`` or ``batch_size`` not a positive int, or a dataset too short
            for one batch per worker beyond the first.
    """
    positive_int("num_workers", num_workers)
    positive_int("batch_size", batch_size)
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                        multiprocessing_context="fork")
    if len(loader) < num_workers + 1:
        raise ValueError(f"the dataset gives {len(loader)} batches of {batch_size}: too few for "
                         f"{num_workers} workers")
    it = iter(loader)
    for _ in range(num_workers):            # every worker has built its first batch
        next(it)
    before = [_private_dirty_bytes(p.pid) for p in it._workers]
    for _ in range(len(loader) - num_workers - 1):
        next(it)                             # the workers have now read every item
    after = [_private_dirty_bytes(p.pid) for p in it._workers]
    del it
    if any(v is None for v in before + after):
        return None
    return [b - a for a, b in zip(before, after)]


def _children_cpu_s() -> float | None:
    if resource is None:
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def loader_rate(loader: DataLoader, batches: int | None = None, warmup: int | None = None,
                count: Callable | None = None) -> dict:
    """Drain ``loader`` and time its steady state.

    Loader workers start together, so their first batches arrive in one burst (one per worker,
    built from scratch), and at the end of an epoch they run out of batches one by one: neither
    is what a long epoch sees. By default the clock starts after the first *round* (``warmup`` =
    one batch per worker, or one batch without workers) and times the *whole rounds* that fit
    before the last round (``batches`` = a multiple of the workers). Whole rounds matter: batch
    ``i`` comes from worker ``i % num_workers``, and each worker has ``prefetch_factor`` batches
    in hand, so when the clock starts the early workers may already hold finished batches of the
    next round. A window that ends inside a round can consist of such batches only and reads a
    queue, not a rate (16 workers, 8 batches timed: anything from half the steady rate to
    unbounded). A window of whole rounds starts at a batch some worker had to finish (none
    later is delivered before it), and that worker builds ``R`` more batches, one at a time,
    before the window ends, so the rate cannot exceed ``num_workers`` times one worker's; with ``R`` rounds timed it can fall short by at most about
    ``prefetch_factor / (R + prefetch_factor)``, the most a worker can be ahead of the others.
    Returns a dict with ``images_per_s`` (over the timed
    batches), ``first_batch_s`` (creating the iterator, starting workers, first batch),
    ``images`` (timed), ``worker_cpu_s`` (CPU seconds the loader's worker processes used over
    their whole lives, start and teardown included, read when they have exited; None without
    workers or where the OS does not say), ``worker_window_cpu_s`` (CPU seconds the workers used
    during the timed batches only, read from ``/proc/<pid>/stat`` at the window's two ends:
    the workers' cost of what was timed; None where /proc cannot say), ``main_cpu_s`` (CPU
    seconds of this whole process over the timed batches, every thread: a ``pin_memory`` thread
    included) and ``main_thread_cpu_s`` (CPU seconds of the calling thread alone over the timed
    batches, ``time.thread_time``: the thread that receives the batches unless a ``pin_memory``
    thread does).

    A batch is counted with ``count(batch)`` when given; else it is a tensor, or a tuple/list
    whose first element is one (its first dimension counts the images) or a list of images
    (:func:`collate_list`).

    Raises:
        ValueError: a loader too short for ``warmup`` plus one timed batch, or (by default) for a
            round skipped at each end and one whole round timed.
    """
    rounds = max(1, loader.num_workers)
    if warmup is None:
        warmup = rounds
    if batches is None:
        try:
            total = len(loader)
        except TypeError:       # an iterable dataset without a length: time it to the end
            total = None
        if total is not None:   # whole rounds between the skipped ones
            left = total - warmup - (rounds if loader.num_workers else 0)
            batches = left // rounds * rounds
            if batches < 1:
                raise ValueError(f"the loader gives {total} batches: too few to skip a round of "
                                 f"{rounds} at each end and time one whole round")
    cpu0 = _children_cpu_s()
    workers0 = None
    sw = Stopwatch().start()
    it = iter(loader)
    count_, n_batches = 0, 0
    first = timed = main0 = None
    for batch in it:
        if count is not None:
            k = count(batch)
        else:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            k = len(x)
        n_batches += 1
        if first is None:
            first = sw.elapsed()
        if n_batches == warmup:
            timed, main0 = Stopwatch().start(), process_seconds()
            thread0 = thread_seconds()
            workers0 = _workers_cpu_s(it)
        elif n_batches > warmup:
            count_ += k
        if batches is not None and n_batches >= batches + warmup:
            break
    elapsed = timed.elapsed() if timed is not None else None
    main1, thread1 = process_seconds(), thread_seconds()
    workers1 = _workers_cpu_s(it)
    del it                                   # the workers exit (and are reaped) here
    cpu1 = _children_cpu_s()
    if timed is None or count_ == 0:
        raise ValueError(f"the loader gave {n_batches} batches; need more than warmup={warmup}")
    return {"images_per_s": count_ / elapsed, "first_batch_s": first, "images": count_,
            "worker_cpu_s": (cpu1 - cpu0) if loader.num_workers and cpu0 is not None else None,
            "worker_window_cpu_s": (workers1 - workers0) if timed is not None
            and workers0 is not None and workers1 is not None else None,
            "main_cpu_s": main1 - main0, "main_thread_cpu_s": thread1 - thread0}


def raw_read_rate(files: Sequence[str | os.PathLike]) -> float:
    """Bytes per second of reading ``files`` whole, one after the other, in this process (no
    decoding): the storage's rate when their pages are not cached, the page cache's when they
    are. One timed pass, so cold stays cold."""
    sw = Stopwatch().start()
    total = sum(len(Path(f).read_bytes()) for f in files)
    return total / sw.elapsed()


def kernel_seconds(fn: Callable[[], object]) -> dict[str, float]:
    """Seconds each CUDA kernel name took in one call of ``fn()`` (after one warm-up call), from
    ``torch.profiler``, longest first: where a GPU function's time goes, kernel by kernel.

    Raises:
        RuntimeError: no CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("kernel_seconds needs a CUDA GPU")

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(
                ("Memcpy", "Memset", "[memory]")):
            out[e.name] = out.get(e.name, 0.0) + (e.time_range.end - e.time_range.start) * 1e-6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class _BytesDataset(Dataset):
    """``n`` items of JPEG bytes held in memory, the blobs over again as often as ``n`` needs;
    item ``i`` is ``fn(blobs[i % len(blobs)])`` (``fn`` a picklable module-level function)."""

    def __init__(self, blobs: Sequence[bytes], fn: Callable, n: int):
        self.blobs, self.fn, self.n = list(blobs), fn, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.fn(self.blobs[i % len(self.blobs)])


def _pipeline_224(data: bytes) -> torch.Tensor:
    return pil_pipeline(data, 224)


def cpu_rate(blobs: Sequence[bytes], what: str = "decode", num_workers: int | None = None,
             batch: int = 64, multiprocessing_context: str | None = None,
             collate: str = "list", rounds: int = 10) -> dict:
    """Images/s of decoding (``what="decode"``, Pillow, pixels delivered to this process) or of
    the full pipeline (``what="pipeline"``: :func:`pil_pipeline` to 224 x 224, batches of float32
    ``(B, 3, 224, 224)`` stacked by the default collate) on ``num_workers`` loader workers
    (default: every usable core; 0 = this process). Decoded images differ in size: ``collate``
    ``"list"`` sends them as one tensor each (:func:`collate_list`), ``"packed"`` as one tensor
    per batch (:func:`collate_packed`). Returns :func:`loader_rate`'s dict over one pass
    (steady state), with ``"batch"`` and ``"items"``, the pass's length.

    A pass times at least ``rounds`` whole rounds of batches (one batch per worker), whatever
    the cores: :func:`loader_rate` leaves out a round at each end and reads up to ``2 / (rounds
    + 2)`` low (``prefetch_factor`` 2), so the pass holds ``(rounds + 2) * workers * batch``
    items, or every blob if there are more, ``blobs`` over again as often as that needs.

    Raises:
        ValueError: ``what`` not "decode" or "pipeline", ``collate`` not "list" or "packed",
            ``batch`` or ``rounds`` below 1, or no ``blobs``.
    """
    one_of("what", what, ("decode", "pipeline"))
    one_of("collate", collate, ("list", "packed"))
    workers = usable_cores() if num_workers is None else num_workers
    positive_int("batch", batch)
    positive_int("rounds", rounds)
    positive_int("len(blobs)", len(blobs))
    n = max(len(blobs), (rounds + 2) * max(1, workers) * batch)
    fn = decode_pil if what == "decode" else _pipeline_224
    collate_fn = None if what == "pipeline" else collate_list if collate == "list" else collate_packed
    loader = DataLoader(_BytesDataset(blobs, fn, n), batch_size=batch, num_workers=workers,
                        collate_fn=collate_fn, worker_init_fn=seed_worker if workers else None,
                        multiprocessing_context=multiprocessing_context if workers else None)
    packed = what == "decode" and collate == "packed"
    r = loader_rate(loader, count=(lambda b: len(b[0])) if packed else None)
    return {**r, "batch": batch, "items": n}


def gpu_rate(blobs: Sequence[bytes], what: str = "decode", batch: int = 256,
             device: str | torch.device = "cuda", repeats: int = 3) -> dict:
    """Images/s of batched GPU decode (``what="decode"``) or of the whole GPU pipeline
    (``"pipeline"``: decode, then :func:`gpu_augment_list` to 224 x 224) over ``blobs`` in
    batches of ``batch``, from bytes in host memory to pixels on the GPU.

    One warm-up pass, then ``repeats`` timed passes (synchronized, ``time.perf_counter``).
    Returns ``{"images_per_s"`` (the best pass), ``"median_images_per_s"``, ``"host_cpu_fraction"``,
    ``"threads"``, ``"telemetry"}``: the host CPU time of this process over the timed passes
    divided by their wall time (1.0 = one core busy all along; more when several of the
    process's threads worked, nvJPEG's among them), the process's threads after the passes,
    and the :class:`perflab.core.telemetry.TelemetrySummary` of the timed passes only (the
    GPU's clock while it worked, not while it waited for the warm-up or the set-up).

    Raises:
        ValueError: ``what`` not "decode" or "pipeline".
    """
    one_of("what", what, ("decode", "pipeline"))
    g = torch.Generator().manual_seed(0)
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]  # once, untimed

    def one_pass():
        for k in range(0, len(data), batch):
            imgs = gpu_decode(data[k:k + batch], device)
            if what == "pipeline":
                gpu_augment_list(imgs, 224, generator=g)

    one_pass()
    times, cpu = [], 0.0
    with Telemetry(device=device) as tel:
        for _ in range(repeats):
            with tel.window():          # the telemetry describes the timed passes only
                c0, sw = process_seconds(), Stopwatch(device).start()
                one_pass()
                times.append(sw.elapsed())
                cpu += process_seconds() - c0
    return {"images_per_s": len(blobs) / min(times),
            "median_images_per_s": len(blobs) / sorted(times)[len(times) // 2],
            "host_cpu_fraction": cpu / sum(times), "threads": _thread_count(),
            "telemetry": tel.summary()}


def _thread_count() -> int | None:
    """Threads of this process now (Linux's /proc/self/task; None elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def gpu_decode_profile(blobs: Sequence[bytes], device: str | torch.device = "cuda") -> dict:
    """Which engine decodes: one batched :func:`gpu_decode` of ``blobs`` under ``torch.profiler``.

    Returns ``{"wall_s", "kernel_s", "sm_busy_fraction", "kernels"}``: the call's wall time, the
    summed duration of the CUDA kernels it launched (copies excluded), their ratio, and the names
    of the five longest kernels with their seconds. nvJPEG's CUDA back end runs its inverse DCT
    and colour conversion as kernels on the SMs; its hardware back end runs them on the JPEG
    engines, which launch no kernel a profiler sees.
    """

    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    gpu_decode(data, device)                  # warm-up: the decoder and its buffers
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sw = Stopwatch(device).start()
        gpu_decode(data, device)
        wall = sw.elapsed()
    per_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(
                ("Memcpy", "Memset", "[memory]")):
            per_name[e.name] = per_name.get(e.name, 0.0) + (e.time_range.end - e.time_range.start) * 1e-6
    kernel_s = sum(per_name.values())
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
    return {"wall_s": wall, "kernel_s": kernel_s, "sm_busy_fraction": kernel_s / wall,
            "kernels": top}


def small_cnn(width: int = 64, classes: int = 10) -> torch.nn.Module:
    """A small convolutional classifier: four stages, each a stride-2 3x3 convolution and a
    stride-1 3x3 convolution (``width``, 2x, 4x, 8x channels, BatchNorm + ReLU after each), global
    average pooling and a linear head. FLOPs: :func:`small_cnn_flops`."""
    positive_int("width", width)
    layers, c_in = [], 3
    for k in range(4):
        c_out = width * 2**k
        layers += [torch.nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                   torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(inplace=True),
                   torch.nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
                   torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(inplace=True)]
        c_in = c_out
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c_in, classes)]
    return torch.nn.Sequential(*layers)


def small_cnn_flops(width: int = 64, side: int = 128) -> float:
    """Forward FLOPs of :func:`small_cnn` on one ``side`` x ``side`` image: the convolutions only,
    ``2 * 9 * C_in * C_out * H_out * W_out`` each (a multiply-add is two FLOPs). A training step
    costs about three times this (forward, and two products of the same size backward)."""
    total, c_in, s = 0.0, 3, side
    for k in range(4):
        c_out = width * 2**k
        s = (s + 1) // 2
        total += 2 * 9 * c_in * c_out * s * s + 2 * 9 * c_out * c_out * s * s
        c_in = c_out
    return total


def train_steps_clocked(*args, **kwargs) -> tuple[dict, object]:
    """:func:`perflab.loading.training.train_steps` (same arguments, same errors) under its own
    :class:`perflab.core.telemetry.Telemetry`: returns ``(result, summary)``, ``summary`` the
    :class:`perflab.core.telemetry.TelemetrySummary` of the timed steps' window (the clock the
    GPU ran them at), as :func:`perflab.machine.gpu.matmul_rates_clocked` does for products.
    """
    with Telemetry() as tel:
        result = train_steps(*args, **kwargs)
    return result, tel.summary()
