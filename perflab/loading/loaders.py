"""What a DataLoader is given: worker set-up, collate functions, and probe datasets.

:func:`seed_worker` is the ``worker_init_fn`` that gives every worker its own NumPy and ``random``
streams and one intra-op thread (:func:`threads_everywhere` is the one that oversubscribes);
:func:`collate_list` and :func:`collate_packed` (with :func:`unpack`) send images of different
sizes one tensor each or one buffer per batch; :class:`ZeroImages`, :class:`RandomProbe` and
:func:`worker_thread_counts` are datasets and probes that show what the workers do;
:func:`usable_cores` is how many cores this process may use.

Everything a worker runs lives in an importable module, so that workers started with ``spawn``
or ``forkserver`` find it by name.
"""

from __future__ import annotations

import os
import random
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from perflab.core.validate import positive_int

__all__ = ["usable_cores", "seed_worker", "threads_everywhere", "RandomProbe",
           "worker_thread_counts", "collate_list", "collate_packed", "unpack", "ZeroImages"]


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
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
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
    """``n`` all-zero uint8 images of ``shape``: a loader whose workers do no work, so its rate is
    what the training process can *receive*, tensor by tensor."""

    def __init__(self, n: int, shape: tuple[int, ...] = (375, 500, 3)):
        self.n = positive_int("n", n)
        self.shape = tuple(shape)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(self.shape, dtype=torch.uint8)
