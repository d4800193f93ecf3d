"""Storage formats of the same images: a JPEG folder, a decoded memory map, tar shards.

A folder of JPEG files (:class:`JpegFolder`, one file per item), one decoded ``uint8`` memory map
at a fixed size (:func:`write_memmap`, :class:`MemmapImages`, read a whole batch per call), and tar
shards of the JPEG bytes in WebDataset's layout (:func:`write_tar_shards`, :class:`TarShards`, an
iterable dataset that gives each loader worker its own shards). The label of an image is the
class in its file name (``{i:06d}_{c}.jpg``, as :func:`perflab.loading.datasets.make_jpeg_folder`
writes them).

Datasets live in this importable module rather than in a notebook so that loader workers started
with ``spawn`` or ``forkserver`` (which import them by name) find them.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from perflab.core.validate import positive_int
from perflab.loading.transforms import decode_resized

__all__ = ["JpegFolder", "write_memmap", "MemmapImages", "write_tar_shards", "TarShards",
           "read_blobs"]


def _label(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


class JpegFolder(Dataset):
    """Map-style dataset over a folder of JPEG files: item ``i`` is ``(transform(path), label)``.

    ``transform`` takes the file's path (default: :func:`decode_resized` at ``side=144`` as a
    ``(3, 144, 144)`` uint8 tensor). ``files`` may be given instead of ``root`` (a subset).

    Raises:
        ValueError: neither or both of ``root`` and ``files``; no JPEG in ``root``.
    """

    def __init__(self, root: str | os.PathLike | None = None, transform: Callable | None = None,
                 files: Sequence[str | os.PathLike] | None = None):
        if (root is None) == (files is None):
            raise ValueError("give exactly one of root and files")
        self.files = [Path(f) for f in files] if files is not None else sorted(Path(root).glob("*.jpg"))
        if not self.files:
            raise ValueError(f"no .jpg files in {root}")
        self.labels = [_label(f) for f in self.files]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        f = self.files[i]
        if self.transform is None:
            x = torch.from_numpy(decode_resized(f, 144)).permute(2, 0, 1)
        else:
            x = self.transform(f)
        return x, self.labels[i]


def write_memmap(files: Sequence[str | os.PathLike], path: str | os.PathLike, side: int = 144,
                 labels: Sequence[int] | None = None) -> Path:
    """Decode every JPEG once, resize to ``side`` x ``side`` (:func:`decode_resized`), and store
    them in one raw ``uint8`` file of shape ``(N, side, side, 3)`` (NHWC), plus ``<path>.json``
    with the shape and the labels. Offline preprocessing: decoding is paid once, not every epoch.
    Returns ``path``.

    The ``.json`` exists only beside a complete map: an old one is removed before the map is
    rewritten, and the new one is written to a temporary file and renamed into place after the
    map is flushed, so a reader that finds it (chapter 5's ladder reuses the first page's map)
    never finds a half-written map behind it (a run stopped mid-write leaves no ``.json``).

    Raises:
        ValueError: empty ``files``; ``labels`` of another length.
    """
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("files is empty")
    labels = list(labels) if labels is not None else [_label(f) for f in files]
    if len(labels) != len(files):
        raise ValueError(f"{len(labels)} labels for {len(files)} files")
    path = Path(path)
    meta = Path(str(path) + ".json")
    meta.unlink(missing_ok=True)             # no old .json beside a map being rewritten
    mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(len(files), side, side, 3))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for i, img in enumerate(pool.map(lambda f: decode_resized(f, side), files)):
            mm[i] = img
    mm.flush()
    del mm
    part = meta.with_name(meta.name + f".{os.getpid()}.part")
    part.write_text(json.dumps({"shape": [len(files), side, side, 3], "labels": labels}))
    os.replace(part, meta)                   # atomic: the .json appears whole, last
    return path


class MemmapImages(Dataset):
    """The images of :func:`write_memmap`, read a **batch** per call.

    Use it with ``DataLoader(ds, batch_size=None, sampler=BatchSampler(...))``: item ``idx`` is a
    list of indices and the result is ``(uint8 tensor (B, 3, side, side), int64 labels (B,))``,
    read with one fancy index of the memory map (indices sorted, so reads go front to back). An
    int index gives one image ``(3, side, side)`` and its label. The pixels are copied once out of
    the page cache; ``torch.from_numpy`` then shares that copy (no second copy).
    """

    def __init__(self, path: str | os.PathLike):
        meta = json.loads(Path(str(path) + ".json").read_text())
        self.path = Path(path)
        self.shape = tuple(meta["shape"])
        self.labels = torch.tensor(meta["labels"], dtype=torch.int64)
        self._mm = None  # opened lazily in each process (a memmap does not pickle for spawn)

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_mm"] = None
        return state

    def array(self) -> np.memmap:
        """The mapped pixels, ``uint8 (N, side, side, 3)``, read-only: one mapping per process,
        opened at the first call and kept (pages mapped once stay mapped)."""
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r", shape=self.shape)
        return self._mm

    def __getitem__(self, idx):
        mm = self.array()
        if isinstance(idx, (int, np.integer)):
            x = torch.from_numpy(np.array(mm[idx])).permute(2, 0, 1)
            return x, int(self.labels[idx])
        order = np.sort(np.asarray(idx, dtype=np.int64))
        x = torch.from_numpy(mm[order])  # fancy indexing copies: the array is writable
        return x.permute(0, 3, 1, 2), self.labels[torch.from_numpy(order)]


def write_tar_shards(files: Sequence[str | os.PathLike], folder: str | os.PathLike,
                     per_shard: int = 256) -> list[Path]:
    """Pack JPEG files, unchanged, into tar archives of ``per_shard`` samples each (stdlib
    ``tarfile``, no compression): ``shard-000000.tar``, ...

    The layout is WebDataset's: a sample is the consecutive members that share a key (the file
    name without its extension), here ``<key>.jpg`` (the JPEG bytes) and ``<key>.cls`` (the
    label, as decimal text), so the ``webdataset`` library, NVIDIA DALI's reader and
    :class:`TarShards` all read these shards. Returns the shard paths.

    Raises:
        ValueError: empty ``files`` or ``per_shard`` not a positive integer.
    """
    positive_int("per_shard", per_shard)
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("files is empty")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(0, len(files), per_shard):
        p = folder / f"shard-{k // per_shard:06d}.tar"
        with tarfile.open(p, "w") as tar:
            for f in files[k:k + per_shard]:
                tar.add(f, arcname=f"{f.stem}.jpg")
                label = str(_label(f)).encode()
                info = tarfile.TarInfo(f"{f.stem}.cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
        shards.append(p)
    return shards


class TarShards(IterableDataset):
    """Iterable dataset over WebDataset-layout tar shards (:func:`write_tar_shards`): yields
    ``(transform(jpeg_bytes), label)`` per sample.

    With loader workers, worker ``w`` of ``W`` reads shards ``w, w + W, ...`` (so every sample is
    seen exactly once per epoch when there are at least as many shards as workers), front to back:
    sequential reads of large files, the access pattern disks like. ``shuffle=True`` shuffles the
    shard order and the samples inside each shard with torch's random stream, which DataLoader
    seeds per worker and per epoch. Default ``transform``: :func:`decode_resized` at 144 pixels.
    """

    def __init__(self, shards: Sequence[str | os.PathLike], transform: Callable | None = None,
                 shuffle: bool = False):
        self.shards = [Path(s) for s in shards]
        if not self.shards:
            raise ValueError("shards is empty")
        self.transform = transform
        self.shuffle = shuffle

    def _mine(self) -> list[Path]:
        info = get_worker_info()
        if info is None:
            return list(self.shards)
        return self.shards[info.id::info.num_workers]

    @staticmethod
    def samples(tar: tarfile.TarFile) -> list[dict[str, bytes]]:
        """The samples of an open shard, in order: ``{extension: bytes}`` per key."""
        out: dict[str, dict[str, bytes]] = {}
        for m in tar:
            if m.isfile():
                key, _, ext = m.name.rpartition(".")
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
        return list(out.values())

    def __iter__(self) -> Iterator:
        mine = self._mine()
        if self.shuffle:
            mine = [mine[i] for i in torch.randperm(len(mine)).tolist()]
        for shard in mine:
            with tarfile.open(shard, "r") as tar:
                samples = self.samples(tar)
            if self.shuffle:
                samples = [samples[i] for i in torch.randperm(len(samples)).tolist()]
            for sample in samples:
                data, label = sample["jpg"], int(sample["cls"])
                if self.transform is None:
                    x = torch.from_numpy(decode_resized(data, 144)).permute(2, 0, 1)
                else:
                    x = self.transform(data)
                yield x, label


def read_blobs(files: Sequence[str | os.PathLike]) -> list[bytes]:
    """The bytes of each file, in order (so that a decode benchmark leaves the disk out)."""
    return [Path(f).read_bytes() for f in files]
