"""What a DataLoader is given: worker set-up, collate functions, and probe datasets.

:func:`seed_worker` is the ``worker_init_fn`` that gives every worker its own NumPy and ``random``
streams and one intra-op thread (:func:`threads_everywhere` is the one that oversubscribes);
:func:`collate_list` and :func:`collate_packed` (with :func:`unpack`) send images of different
sizes one tensor each or one buffer per batch; :class:`ZeroImages`, :class:`RandomProbe` and
:func:`worker_thread_counts` are datasets and probes that show what the workers do;
:func:`usable_cores` is how many cores this process may use; :class:`EpochProbe` (what a
persistent worker's copy of the dataset sees), :class:`IndexList` and :class:`IndexArray` (a
dataset's index as Python objects or as one array: copy-on-read in forked workers) and
:class:`StartupProbe` with :func:`startup_init` (when a worker started, initialized and fetched,
beside :func:`spawned_import_seconds`, bare processes started the same way) show the traps of
workers.

Everything a worker runs lives in an importable module, so that workers started with ``spawn``
or ``forkserver`` find it by name.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from perflab.core.timing import timestamp
from perflab.core.validate import integer, positive_int

__all__ = ["usable_cores", "seed_worker", "threads_everywhere", "RandomProbe",
           "worker_thread_counts", "collate_list", "collate_packed", "unpack", "ZeroImages",
           "EpochProbe", "IndexList", "IndexArray", "StartupProbe", "startup_init",
           "spawned_import_seconds"]


def usable_cores() -> int:
    """The CPU cores this process may run on: ``os.sched_getaffinity(0)`` where it exists
    (Linux; a container or ``taskset`` may allow fewer cores than the machine has), else
    ``os.cpu_count()`` (macOS and Windows have no affinity call in Python's ``os``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoader: give the dataset copy in this worker its own random
    stream, and keep torch to one intra-op thread.

    DataLoader seeds each worker's torch generator with ``base_seed + worker_id`` (``base_seed``
    drawn anew every epoch from the loader's ``generator``) and, since PyTorch 1.9, the global
    ``random`` and NumPy streams from it too. What it cannot reach is a random generator *object*
    the dataset built in ``__init__`` (``self.rng = np.random.default_rng(0)``): each worker gets a
    copy of the same state and draws the same "random" augmentations. This function reseeds a
    NumPy ``Generator`` found at ``dataset.rng`` from ``torch.initial_seed()`` (which differs per
    worker and epoch), seeds ``random`` and NumPy's global stream the same way (the PyTorch
    reproducibility notes recommend it), and sets one intra-op thread: DataLoader already does,
    but code that raised it again (N workers x N threads on N cores) oversubscribes the CPU.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = get_worker_info()
    if info is not None and isinstance(getattr(info.dataset, "rng", None), np.random.Generator):
        info.dataset.rng = np.random.default_rng(seed)
    torch.set_num_threads(1)


def threads_everywhere(worker_id: int) -> None:
    """A ``worker_init_fn`` that *causes* oversubscription (for the chapter and lab): every worker
    uses as many intra-op threads as the machine has cores, so N workers run N x N threads."""
    torch.set_num_threads(os.cpu_count() or 1)


class RandomProbe(Dataset):
    """``n`` items that report where and how they were drawn: item ``i`` is the tuple
    ``(i, worker id (-1 in the main process), torch.rand() draw, self.rng.random() draw)``.
    ``self.rng`` is a NumPy ``Generator`` made in ``__init__``: every worker gets a copy of the same
    state unless :func:`seed_worker` reseeds it. Used to show that augmentation differs (or not)
    across workers and epochs."""

    def __init__(self, n: int, seed: int = 0):
        self.n = positive_int("n", n)
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return i, (info.id if info is not None else -1), torch.rand(()).item(), float(self.rng.random())


class _ThreadProbe(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return (info.id if info is not None else -1), torch.get_num_threads()


def worker_thread_counts(num_workers: int, worker_init_fn: Callable | None = None,
                         multiprocessing_context: str | None = None) -> dict[int, int]:
    """Intra-op threads torch uses inside each loader worker after ``worker_init_fn`` ran:
    ``{worker_id: torch.get_num_threads()}`` (worker id -1 is the main process when
    ``num_workers=0``). Multiply by the workers to get the threads competing for the cores.
    """
    integer("num_workers", num_workers, 0)
    loader = DataLoader(_ThreadProbe(4 * max(1, num_workers)), batch_size=1,
                        num_workers=num_workers, worker_init_fn=worker_init_fn,
                        multiprocessing_context=multiprocessing_context if num_workers else None)
    seen = {}
    for wid, threads in loader:
        seen[int(wid)] = int(threads)
    return seen


def collate_list(batch: list) -> tuple[list]:
    """Collate that keeps the images as a list (images of different sizes cannot be stacked):
    returns ``(list_of_images,)``, so the batch's first element holds the images, as usual.
    A worker sends each of them to the training process as a tensor of its own."""
    return (batch,)


def collate_packed(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate images of different sizes into **one** tensor: ``(shapes, packed)``, ``shapes`` an
    int64 ``(B, 3)`` tensor of each image's shape and ``packed`` their bytes concatenated (uint8,
    1-d). A worker then sends one buffer per batch instead of one per image; :func:`unpack`
    splits it again (views, no copy). Count the images with ``count=lambda b: len(b[0])``."""
    shapes = torch.tensor([tuple(t.shape) for t in batch], dtype=torch.int64)
    return shapes, torch.cat([t.reshape(-1) for t in batch])


def unpack(shapes: torch.Tensor, packed: torch.Tensor) -> list[torch.Tensor]:
    """The images of a :func:`collate_packed` batch, as views of ``packed``."""
    sizes = shapes.prod(dim=1).tolist()
    return [p.view(*shape) for p, shape in zip(packed.split(sizes), shapes.tolist())]


class ZeroImages(Dataset):
    """``n`` all-zero uint8 images of ``shape``: a loader whose workers decode nothing. They still
    make each tensor (allocated and zero-filled, about 0.56 MB at the default shape) and move it
    into shared memory, so its rate is the smaller of what the workers can send and what the
    training process can *receive*, tensor by tensor; more workers raise the first only."""

    def __init__(self, n: int, shape: tuple[int, ...] = (375, 500, 3)):
        self.n = positive_int("n", n)
        self.shape = tuple(shape)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(self.shape, dtype=torch.uint8)


class EpochProbe(Dataset):
    """``n`` items ``(i * self.scale, torch.initial_seed())``: what a worker's copy of the
    dataset holds, and the seed its torch generator got.

    Change ``scale`` in the main process between epochs: a loader that starts new workers every
    epoch copies the changed dataset into them; one with ``persistent_workers=True`` keeps the
    copies its workers made at the first epoch, and their seeds too."""

    def __init__(self, n: int, scale: int = 1):
        self.n = positive_int("n", n)
        self.scale = scale

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * self.scale, torch.initial_seed()


class IndexList(Dataset):
    """A dataset whose index is a Python list of ``n`` objects (ints here; file names and labels
    in a real one), items returned as they are.

    Forked workers share the parent's memory pages until one is written (copy-on-write).
    Reading a Python object writes its reference count, so every page of the list a worker
    reads becomes that worker's own copy: its private memory grows with what it reads
    (the DataLoader documentation's warning; :class:`IndexArray` is the remedy)."""

    def __init__(self, n: int):
        self.items = list(range(positive_int("n", n)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class IndexArray(Dataset):
    """:class:`IndexList` with the index in one NumPy array: reading it writes nothing, so the
    forked workers' pages stay shared."""

    def __init__(self, n: int):
        self.items = np.arange(positive_int("n", n), dtype=np.int64)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return int(self.items[i])


_STARTED: dict[str, float] = {}


def _process_age() -> float | None:
    """Seconds since this process started, to the 10 ms of the kernel's clock ticks (Linux's
    /proc: the time since boot minus the process's start after boot; None elsewhere)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def startup_init(worker_id: int) -> None:
    """``worker_init_fn`` for :class:`StartupProbe`: records when this worker reached its
    initialization (after the interpreter started, the parent's main module was prepared, the
    modules were imported and the dataset unpickled), then does what :func:`seed_worker` does."""
    _STARTED["init"] = timestamp()
    age = _process_age()
    _STARTED["age"] = float("nan") if age is None else age
    seed_worker(worker_id)


class StartupProbe(Dataset):
    """Wraps ``dataset``; item ``i`` is ``(x, y, phases)`` with ``phases`` a float64 tensor
    ``[process age at worker init, worker init, this fetch began, ipykernel imported (1/0),
    modules loaded]``: the age in seconds (NaN where /proc does not say), the two moments in
    seconds since the epoch, comparable with :func:`perflab.core.timing.timestamp` in the
    parent. Use it with :func:`startup_init` to split a spawned worker's start-up: launch (the
    parent's call until the process existed), start to init (interpreter, the parent's main
    module prepared, imports, the dataset unpickled: the age), init to fetch, fetch to batch.
    Two more entries split start to init: ``[5]`` the moment this module finished importing in
    the worker's own process (torch and this package imported: a spawned worker imports it
    while it unpickles the dataset), NaN in a forked worker (it inherited the module from the
    parent and imported nothing); ``[6]`` the worker's id (-1 outside a worker)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        began = timestamp()
        x, y = self.dataset[i]
        info = get_worker_info()
        phases = torch.tensor([_STARTED.get("age", float("nan")),
                               _STARTED.get("init", float("nan")), began,
                               float("ipykernel" in sys.modules), float(len(sys.modules)),
                               _IMPORTED[1] if _IMPORTED[0] == os.getpid() else float("nan"),
                               float(info.id if info is not None else -1)],
                              dtype=torch.float64)
        return x, y, phases


def _report_imported(conn) -> None:
    """The target of :func:`spawned_import_seconds`' processes: sends the moment this module
    finished importing in this process."""
    conn.send(_IMPORTED[1] if _IMPORTED[0] == os.getpid() else float("nan"))
    conn.close()


def spawned_import_seconds(processes: int = 2, method: str = "spawn",
                           timeout: float = 300.0) -> list[float]:
    """Seconds from each of ``processes`` processes' ``start()`` to the end of its imports of torch
    and this module: the moment :class:`StartupProbe` reports as a worker's imports' end, read on
    the same clock, for processes started one after another, as a DataLoader starts its workers,
    with the same ``multiprocessing`` start method (so they prepare the parent's main module as
    a worker does) and a target in this module (so unpickling it imports what unpickling a
    :class:`StartupProbe` imports). The prediction for a spawned worker's start and imports.

    Returns:
        one value per process, in the order they were started.

    Raises:
        ValueError: ``processes`` not a positive integer; ``method`` not ``"spawn"`` or
            ``"forkserver"`` (a forked process imports nothing); ``timeout`` not positive.
        RuntimeError: a process sent nothing within ``timeout`` seconds (its exit code in the
            message).
    """
    positive_int("processes", processes)
    if method not in ("spawn", "forkserver"):
        raise ValueError(f"method must be 'spawn' or 'forkserver', got {method!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    ctx = multiprocessing.get_context(method)
    pipes = [ctx.Pipe(duplex=False) for _ in range(processes)]
    procs = [ctx.Process(target=_report_imported, args=(w,), daemon=True) for _, w in pipes]
    started = []
    for p in procs:
        started.append(timestamp())
        p.start()
    out = []
    for (r, w), p, t in zip(pipes, procs, started):
        w.close()
        try:
            if not r.poll(timeout):
                raise EOFError
            out.append(r.recv() - t)
        except EOFError:
            p.join(1.0)
            raise RuntimeError(f"a {method} process sent no import stamp within {timeout} s "
                               f"(exit code {p.exitcode})") from None
        finally:
            r.close()
    for p in procs:
        p.join()
    return out


#: (process id, moment) this module finished importing: in a spawned worker, the end of its
#: imports (:class:`StartupProbe` reports it); last in the module, so that it follows them all
_IMPORTED = (os.getpid(), timestamp())
