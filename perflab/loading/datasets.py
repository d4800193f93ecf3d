"""Datasets built offline from real material on the machine, and the loaders that feed them.

The course downloads nothing at run time, so its data come from files that installed packages
ship:

* **Images**: real photographs (matplotlib's sample ``grace_hopper.jpg``; the photographs in
  scikit-image's ``skimage/data`` folder when scikit-image is installed) cut into many
  ImageNet-like JPEGs by random crops, scales, flips and re-encodes (:func:`make_jpeg_folder`).
  Unlike a real data set, the images share a few scenes, so they compress alike and a model
  could memorize them; for loading speed what matters is their size and encoding, and those are
  realistic (about 500 x 375 pixels, JPEG quality 90, tens of kB each).
* **Text**: the source files of the running interpreter's standard library
  (``sysconfig.get_paths()["stdlib"]``), cleaned (exact duplicates removed, generated or binary-like
  files filtered), tokenized once by a byte-level BPE trained with Hugging Face ``tokenizers`` into
  a ``uint16`` memory map (:func:`text_corpus`, :class:`TokenDataset`; chapter 10 reuses them).

Everything built here is cached under :func:`cache_dir`: ``<clone>/.cache/perflab/data`` by
default, or the folder named by the environment variable ``PERFLAB_DATA_DIR``. Delete it to
rebuild.

Storage formats of the same images: a folder of JPEG files (:class:`JpegFolder`), one decoded
``uint8`` memory map at a fixed size (:func:`write_memmap`, :class:`MemmapImages`, read a whole
batch per call), and tar shards of the JPEG bytes (:func:`write_tar_shards`,
:class:`TarShards`, an iterable dataset that gives each loader worker its own shards).

Datasets, transforms and collate functions live in this importable module rather than in a
notebook so that loader workers started with ``spawn`` or ``forkserver`` (which import them by
name) find them. :func:`seed_worker` is the ``worker_init_fn`` that gives every worker its own
NumPy and ``random`` streams and one intra-op thread.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
import sysconfig
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.profiler import ProfilerActivity, profile
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import (BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler,
                              get_worker_info)

from perflab.core.timing import Stopwatch, best_of, process_seconds, timestamp
from perflab.core.validate import positive_int

from perflab.core.telemetry import Telemetry

try:  # Unix only: the CPU time of finished loader workers (None on Windows)
    import resource
except ImportError:
    resource = None

__all__ = [
    "AugmentBatch",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "JpegFolder",
    "MemmapImages",
    "RandomProbe",
    "TarShards",
    "TextCorpus",
    "TokenDataset",
    "ZeroImages",
    "cache_dir",
    "collate_list",
    "collate_packed",
    "cpu_rate",
    "decode_augment",
    "decode_blur",
    "decode_pil",
    "decode_resized",
    "decode_scaled",
    "gpu_augment",
    "gpu_augment_list",
    "gpu_decode",
    "gpu_decode_profile",
    "gpu_rate",
    "import_seconds",
    "kernel_seconds",
    "loader_rate",
    "make_jpeg_folder",
    "parallel_decode_rate",
    "pil_pipeline",
    "raw_read_rate",
    "read_blobs",
    "read_rate",
    "seed_worker",
    "small_cnn",
    "small_cnn_flops",
    "source_photos",
    "stdlib_sources",
    "text_corpus",
    "threads_everywhere",
    "train_steps",
    "unpack",
    "usable_cores",
    "worker_thread_counts",
    "write_memmap",
    "write_tar_shards",
]

# ImageNet channel statistics (RGB, on the 0-1 scale), the constants torchvision's models use.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def cache_dir(*parts: str) -> Path:
    """The folder where built data live (created on first use): ``$PERFLAB_DATA_DIR`` or
    ``<clone>/.cache/perflab/data``, joined with ``parts``."""
    root = os.environ.get("PERFLAB_DATA_DIR")
    base = Path(root) if root else Path(__file__).resolve().parent.parent.parent / ".cache" / "perflab" / "data"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def usable_cores() -> int:
    """The CPU cores this process may run on: ``os.sched_getaffinity(0)`` where it exists
    (Linux; a container or ``taskset`` may allow fewer cores than the machine has), else
    ``os.cpu_count()`` (macOS and Windows have no affinity call in Python's ``os``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

def source_photos(min_side: int = 300) -> list[tuple[str, np.ndarray]]:
    """The real photographs installed packages ship, as ``(name, HxWx3 uint8 RGB array)``.

    matplotlib's ``grace_hopper.jpg`` always; every RGB image of at least ``min_side`` pixels on
    its shorter side in scikit-image's ``skimage/data`` folder when scikit-image is installed (read
    from the package's files: nothing is downloaded).
    """

    paths = [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"]
    try:
        import skimage.data  # optional: scikit-image adds photographs when installed
    except ImportError:  # scikit-image is optional: matplotlib's photograph is enough
        skimage = None
    if skimage is not None:
        folder = Path(skimage.data.__file__).parent
        paths += sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg"))
    photos = []
    for p in paths:
        with Image.open(p) as im:
            if im.mode != "RGB" or min(im.size) < min_side:
                continue
            photos.append((p.stem, np.asarray(im.convert("RGB"))))
    return photos


def _make_one(args) -> None:
    photo, path, seed, size, quality = args
    rng = random.Random(seed)
    h, w = photo.shape[:2]
    landscape = rng.random() < 0.75  # ImageNet is mostly landscape
    out_w, out_h = size if landscape else size[::-1]
    aspect = out_w / out_h
    area = rng.uniform(0.25, 1.0) * h * w
    cw = min(w, int(round(math.sqrt(area * aspect))))
    ch = min(h, int(round(cw / aspect)))
    cw = min(cw, int(round(ch * aspect)))
    x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
    im = Image.fromarray(photo[y0:y0 + ch, x0:x0 + cw]).resize((out_w, out_h), Image.BILINEAR)
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    im.save(path, "JPEG", quality=quality)


def make_jpeg_folder(n: int, size: tuple[int, int] = (500, 375), quality: int = 90,
                     seed: int = 0, root: str | os.PathLike | None = None) -> Path:
    """Write ``n`` JPEGs cut from :func:`source_photos`; return the folder (reused when built).

    Each file is a random crop (25-100 % of a photo's area, at the output's aspect ratio) scaled to
    ``size`` = (width, height) pixels, landscape three times in four and portrait otherwise,
    flipped half the time, encoded at JPEG ``quality``. File ``{i:06d}_{c}.jpg`` has class ``c``,
    the index of the photograph it came from. Encoding runs on a thread pool (Pillow releases the
    GIL while it encodes). Default folder: ``cache_dir("images", <settings>)``.

    Raises:
        ValueError: ``n`` not a positive integer, ``quality`` outside 1-95.
    """
    positive_int("n", n)
    if not 1 <= quality <= 95:
        raise ValueError(f"quality must be in 1..95 (Pillow's range), got {quality}")
    photos = source_photos()
    key = f"n{n}_{size[0]}x{size[1]}_q{quality}_s{seed}_p{len(photos)}"
    folder = Path(root) if root is not None else cache_dir("images", key)
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "DONE"
    if done.exists():
        return folder
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        c = rng.randrange(len(photos))
        jobs.append((photos[c][1], folder / f"{i:06d}_{c}.jpg", rng.randrange(2**31), size, quality))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(_make_one, jobs))
    done.write_text(json.dumps({"n": n, "size": size, "quality": quality,
                                "sources": [name for name, _ in photos]}))
    return folder


def _label(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


def decode_resized(data: bytes | str | os.PathLike, side: int, draft: bool = False) -> np.ndarray:
    """Decode one JPEG (bytes or path) and resize its shorter side to ``side``, centre-cropped to a
    square: a ``(side, side, 3)`` uint8 RGB array (Pillow, bilinear with antialiasing).

    ``draft=True`` asks libjpeg for a reduced-size decode first (Pillow's ``Image.draft``): the
    decoder scales by 1/2, 1/4 or 1/8 inside the inverse DCT, choosing the smallest scale that
    keeps the image at least ``side`` pixels on its shorter side, so fewer pixels are made and
    fewer resampled; the entropy decoding of the whole file remains.

    Raises:
        ValueError: ``side`` not a positive integer.
    """

    positive_int("side", side)
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    with Image.open(src) as im:
        if draft:
            w, h = im.size
            k = side / min(w, h)                      # the shorter side must stay >= side
            im.draft("RGB", (math.ceil(w * k), math.ceil(h * k)))
        w, h = im.size
        s = min(w, h)
        box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        return np.array(im.convert("RGB").resize((side, side), Image.BILINEAR, box=box))


def decode_scaled(data: bytes, scale: int) -> np.ndarray:
    """Decode JPEG bytes at ``1/scale`` of their size in libjpeg's inverse DCT (``scale`` 1, 2,
    4 or 8; Pillow's ``Image.draft``): an ``(H/scale, W/scale, 3)`` uint8 array, rounded up.

    Raises:
        ValueError: ``scale`` not 1, 2, 4 or 8.
    """

    if scale not in (1, 2, 4, 8):
        raise ValueError(f"scale must be 1, 2, 4 or 8 (libjpeg's DCT scales), got {scale!r}")
    with Image.open(io.BytesIO(data)) as im:
        if scale > 1:
            w, h = im.size
            im.draft("RGB", (w // scale, h // scale))
        return np.asarray(im.convert("RGB"))


def pil_pipeline(data: bytes | str | os.PathLike, out: int, generator: torch.Generator | None = None,
                 scale: tuple[float, float] = (0.25, 1.0)) -> torch.Tensor:
    """The classic per-image CPU pipeline: decode, random resized crop, flip, normalize.

    The crop is a square covering a uniform draw from ``scale`` of the image's area (at most its
    shorter side), at a random place, resized to ``out`` x ``out`` (bilinear).

    Random numbers come from torch (``generator`` or the global stream), which DataLoader seeds
    differently in every worker and epoch. Returns a ``(3, out, out)`` float32 tensor normalized
    with :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`.
    """

    positive_int("out", out)
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    r = torch.rand(4, generator=generator).tolist()
    with Image.open(src) as im:
        w, h = im.size
        s = math.sqrt((scale[0] + r[0] * (scale[1] - scale[0])) * w * h)
        cw = ch = max(1, min(w, h, int(s)))
        x0, y0 = int(r[1] * (w - cw)), int(r[2] * (h - ch))
        im = im.convert("RGB").resize((out, out), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if r[3] < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std


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
    mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(len(files), side, side, 3))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for i, img in enumerate(pool.map(lambda f: decode_resized(f, side), files)):
            mm[i] = img
    mm.flush()
    del mm
    Path(str(path) + ".json").write_text(json.dumps({"shape": [len(files), side, side, 3],
                                                     "labels": labels}))
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

    def __getitem__(self, idx):
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r", shape=self.shape)
        if isinstance(idx, (int, np.integer)):
            x = torch.from_numpy(np.array(self._mm[idx])).permute(2, 0, 1)
            return x, int(self.labels[idx])
        order = np.sort(np.asarray(idx, dtype=np.int64))
        x = torch.from_numpy(self._mm[order])  # fancy indexing copies: the array is writable
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


def _crop_boxes(h: torch.Tensor, w: torch.Tensor, generator: torch.Generator | None,
                scale: tuple[float, float], flip: bool) -> tuple[torch.Tensor, ...]:
    """Random square crop boxes for images of heights ``h`` and widths ``w`` (float64 ``(B,)``
    on the CPU): ``(y0, x0, side, sign)``, ``sign`` -1 for a horizontal flip. One draw of
    ``torch.rand(B, 4)`` from ``generator``, so both augment functions crop alike."""
    b = h.shape[0]
    r = torch.rand(b, 4, generator=generator, dtype=torch.float64)
    s = torch.sqrt((scale[0] + r[:, 0] * (scale[1] - scale[0])) * h * w)
    side = torch.minimum(s, torch.minimum(h, w))  # square crops: the output is square
    y0, x0 = r[:, 1] * (h - side), r[:, 2] * (w - side)
    sign = torch.where(r[:, 3] < 0.5, -1.0, 1.0) if flip else torch.ones(b, dtype=torch.float64)
    return y0, x0, side, sign


def _normalize(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1) * 255
    return (x - mean) / std


def gpu_augment(batch: torch.Tensor, out: int, generator: torch.Generator | None = None,
                scale: tuple[float, float] = (0.25, 1.0), flip: bool = True) -> torch.Tensor:
    """Random resized crop + horizontal flip + normalize of a whole batch in a few kernels.

    ``batch``: uint8 ``(B, 3, H, W)`` on any device, images of one size. Each crop is a square
    covering ``scale`` of the image's area (at most its shorter side) at a random place. One
    affine grid per image (crop box, and a mirrored x axis for a flip) and one bilinear
    ``F.grid_sample`` do every crop and resize at once; the result is float32
    ``(B, 3, out, out)`` normalized with :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`. Random
    numbers come from ``generator`` (on the CPU) so the same seed gives the same crops on any
    device. For images of different sizes, :func:`gpu_augment_list`.

    Raises:
        ValueError: ``batch`` not a 4-d uint8 tensor with 3 channels.
    """
    if batch.dim() != 4 or batch.shape[1] != 3 or batch.dtype != torch.uint8:
        raise ValueError(f"batch must be uint8 (B, 3, H, W), got {batch.dtype} {tuple(batch.shape)}")
    positive_int("out", out)
    b, _, H, W = batch.shape
    dev = batch.device
    h = torch.full((b,), float(H), dtype=torch.float64)
    w = torch.full((b,), float(W), dtype=torch.float64)
    y0, x0, side, sign = _crop_boxes(h, w, generator, scale, flip)
    # crop box -> normalized [-1, 1] coordinates (align_corners=False)
    theta = torch.zeros(b, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = sign * side / W
    theta[:, 0, 2] = (2 * x0 + side) / W - 1
    theta[:, 1, 1] = side / H
    theta[:, 1, 2] = (2 * y0 + side) / H - 1
    grid = F.affine_grid(theta.float().to(dev), [b, 3, out, out], align_corners=False)
    x = F.grid_sample(batch.float(), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)
    return _normalize(x)


def _resample(flat: torch.Tensor, p: torch.Tensor, out: int) -> torch.Tensor:
    """Bilinear crops of the images packed in ``flat`` (uint8, each image ``(3, h, w)``
    contiguous) to float32 ``(B, 3, out, out)``, normalized. ``p``: float64 ``(B, 7)`` rows of
    (y0, x0, side, sign, h, w, offset of the image in ``flat``). About twenty kernels over
    ``(B, 3, out, out)`` tensors, whatever ``B``."""
    dev = flat.device
    y0, x0, side, sign, h, w, start = p.unbind(1)
    centres = (torch.arange(out, device=dev, dtype=torch.float64) + 0.5) / out
    # source pixel coordinates (pixel centres at integers), a flip mirrors x inside the box
    ys = y0[:, None] + side[:, None] * centres - 0.5
    xs = torch.where(sign[:, None] > 0, x0[:, None] + side[:, None] * centres,
                     x0[:, None] + side[:, None] * (1 - centres)) - 0.5
    ys = torch.minimum(ys.clamp(min=0), h[:, None] - 1)
    xs = torch.minimum(xs.clamp(min=0), w[:, None] - 1)
    y_lo, x_lo = ys.floor(), xs.floor()
    wy = (ys - y_lo).float()[:, None, :, None]               # (B, 1, out, 1)
    wx = (xs - x_lo).float()[:, None, None, :]               # (B, 1, 1, out)
    y_hi = torch.minimum(y_lo + 1, h[:, None] - 1)
    x_hi = torch.minimum(x_lo + 1, w[:, None] - 1)
    width = w.long()[:, None]
    chan = (start[:, None] + torch.arange(3, device=dev) * (h * w)[:, None]).long()
    chan = chan[:, :, None, None]                           # (B, 3, 1, 1)
    rows = [chan + (y.long() * width)[:, None, :, None] for y in (y_lo, y_hi)]
    cols = [x.long()[:, None, None, :] for x in (x_lo, x_hi)]

    def at(r, c):                                           # (B, 3, out, out)
        return torch.take(flat, r + c).float()

    top = torch.lerp(at(rows[0], cols[0]), at(rows[0], cols[1]), wx)
    bottom = torch.lerp(at(rows[1], cols[0]), at(rows[1], cols[1]), wx)
    mean = torch.tensor(IMAGENET_MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=dev).view(1, 3, 1, 1) * 255
    return torch.addcmul(-mean / std, torch.lerp(top, bottom, wy), 1 / std)


def gpu_augment_list(images: Sequence[torch.Tensor], out: int,
                     generator: torch.Generator | None = None,
                     scale: tuple[float, float] = (0.25, 1.0), flip: bool = True) -> torch.Tensor:
    """:func:`gpu_augment` for images of different sizes (what a batched JPEG decode returns),
    with a number of kernels that does not grow with the batch.

    ``images``: uint8 ``(3, H_i, W_i)`` tensors on one device. They are concatenated into one
    flat buffer (one ``torch.cat``); every output pixel's four bilinear neighbours are then
    gathered from it by index arithmetic on the whole batch at once (``torch.take``), with
    coordinates clamped to each image's own border (``grid_sample``'s ``padding_mode="border"``,
    ``align_corners=False``). Same crops, flips and result as :func:`gpu_augment` for the same
    ``generator`` when the images share one size. Returns float32 ``(B, 3, out, out)``.

    The gathers and blends write int64 indices and float32 values for every output element:
    about 130 bytes of memory traffic per output element (4 written in the end).

    Raises:
        ValueError: ``images`` empty, or an image not uint8 ``(3, H, W)``.
    """
    if len(images) == 0:
        raise ValueError("images is empty")
    for k, t in enumerate(images):
        if t.dim() != 3 or t.shape[0] != 3 or t.dtype != torch.uint8:
            raise ValueError(f"images[{k}] must be uint8 (3, H, W), got {t.dtype} {tuple(t.shape)}")
    positive_int("out", out)
    dev = images[0].device
    hw = torch.tensor([[t.shape[1], t.shape[2]] for t in images], dtype=torch.float64)
    h, w = hw[:, 0], hw[:, 1]
    y0, x0, side, sign = _crop_boxes(h, w, generator, scale, flip)
    start = torch.cumsum(3 * h * w, 0) - 3 * h * w          # each image's offset in the buffer
    # one host-to-device copy of every per-image number: (B, 7) float64
    p = torch.stack([y0, x0, side, sign, h, w, start], 1).to(dev)
    flat = torch.cat([t.reshape(-1) for t in images])
    return _resample(flat, p, out)


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


def _decode_share(args: tuple) -> tuple[float, int]:
    files, side, t_go = args
    while timestamp() < t_go:                 # every process starts at the same moment
        time.sleep(0.0005)
    with Stopwatch() as sw:
        for f in files:
            decode_resized(f, side)
    return sw.seconds, len(files)


def _ready(_: int) -> int:
    return os.getpid()


def parallel_decode_rate(files: Sequence[str | os.PathLike], processes: int,
                         side: int = 144) -> float:
    """Images/s of ``processes`` plain processes, each decoding its own share of ``files`` with
    :func:`decode_resized` (what :class:`JpegFolder` does per item) and keeping nothing: no
    DataLoader, no batches sent anywhere. This is the machine's own scaling with cores (clock
    boost, shared caches and memory bandwidth, shared physical cores), the ceiling a loader with
    as many workers can reach. Processes are forked (spawned where fork does not exist), started
    and warmed before the clock; the rate is all images over the slowest process's time.

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
        t_go = timestamp() + 0.1 + 0.01 * processes
        shares = [(list(files[k::processes]), side, t_go) for k in range(processes)]
        done = list(pool.map(_decode_share, shares))
    return sum(n for _, n in done) / max(t for t, _ in done)


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
    one batch per worker, or one batch without workers) and stops one round before the end
    (``batches`` = the batches in between). Returns a dict with ``images_per_s`` (over the timed
    batches), ``first_batch_s`` (creating the iterator, starting workers, first batch),
    ``images`` (timed), ``worker_cpu_s`` (CPU seconds the loader's worker processes used, read
    when they have exited; None without workers or where the OS does not say) and
    ``main_cpu_s`` (CPU seconds of this process over the timed batches).

    A batch is counted with ``count(batch)`` when given; else it is a tensor, or a tuple/list
    whose first element is one (its first dimension counts the images) or a list of images
    (:func:`collate_list`).

    Raises:
        ValueError: a loader too short for ``warmup`` plus one timed batch.
    """
    rounds = max(1, loader.num_workers)
    if warmup is None:
        warmup = rounds
    if batches is None:
        try:
            total = len(loader)
        except TypeError:       # an iterable dataset without a length: time it to the end
            total = None
        batches = None if total is None else total - warmup - (rounds if loader.num_workers else 0)
        if batches is not None and batches < 1:
            raise ValueError(f"the loader gives {total} batches: too few to skip a round of "
                             f"{rounds} at each end and time one")
    cpu0 = _children_cpu_s()
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
        elif n_batches > warmup:
            count_ += k
        if batches is not None and n_batches >= batches + warmup:
            break
    elapsed = timed.elapsed() if timed is not None else None
    main1 = process_seconds()
    del it                                   # the workers exit (and are reaped) here
    cpu1 = _children_cpu_s()
    if timed is None or count_ == 0:
        raise ValueError(f"the loader gave {n_batches} batches; need more than warmup={warmup}")
    return {"images_per_s": count_ / elapsed, "first_batch_s": first, "images": count_,
            "worker_cpu_s": (cpu1 - cpu0) if loader.num_workers and cpu0 is not None else None,
            "main_cpu_s": main1 - main0}


def raw_read_rate(files: Sequence[str | os.PathLike]) -> float:
    """Bytes per second of reading ``files`` whole, one after the other, in this process (no
    decoding): the storage's rate when their pages are not cached, the page cache's when they
    are. One timed pass, so cold stays cold."""
    sw = Stopwatch().start()
    total = sum(len(Path(f).read_bytes()) for f in files)
    return total / sw.elapsed()


def import_seconds(modules: Sequence[str] = ("torch", "perflab.loading.datasets"),
                   processes: int = 1) -> float:
    """Seconds ``processes`` fresh Python processes, started together, take to import ``modules``
    and exit (the slowest of them): what loader workers started with ``spawn`` or ``forkserver``
    pay before their first batch, since they start together and import the dataset's module by
    name. Runs ``sys.executable -c "import ..."`` with this clone on the path.

    Raises:
        RuntimeError: a child process failed (its stderr in the message).
        ValueError: ``processes`` not a positive integer.
    """
    positive_int("processes", processes)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    sw = Stopwatch().start()
    procs = [subprocess.Popen([sys.executable, "-c", "import " + ", ".join(modules)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(processes)]
    errors = [p.communicate()[1] for p in procs]
    elapsed = sw.elapsed()
    for p, err in zip(procs, errors):
        if p.returncode != 0:
            raise RuntimeError(f"importing {modules} failed: {err[-1000:]}")
    return elapsed


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


def threads_everywhere(worker_id: int) -> None:
    """A ``worker_init_fn`` that *causes* oversubscription (for the chapter and lab): every worker
    uses as many intra-op threads as the machine has cores, so N workers run N x N threads."""
    torch.set_num_threads(os.cpu_count() or 1)


def decode_blur(path: str | os.PathLike, side: int = 144) -> torch.Tensor:
    """Decode and resize one image (:func:`decode_resized`), then blur it with a 7 x 7 box filter
    in torch (``F.conv2d``, a float32 ``(3, side, side)`` result): torch work big enough
    (3 x 144 x 144 outputs x 49 taps) that torch splits it over its intra-op threads."""
    x = torch.from_numpy(decode_resized(path, side)).permute(2, 0, 1).float().unsqueeze(1)
    k = torch.full((1, 1, 7, 7), 1 / 49)
    return F.conv2d(x, k, padding=3).squeeze(1)


class AugmentBatch:
    """``collate_fn`` for a batch-reading dataset (``batch_size=None``): ``(uint8 (B, 3, H, W),
    labels)`` -> ``(gpu_augment(x, out), labels)``, the batched crop/flip/normalize on the CPU
    (picklable, so it also works in workers)."""

    def __init__(self, out: int, seed: int | None = None):
        self.out = positive_int("out", out)
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def __call__(self, batch):
        x, y = batch
        return gpu_augment(x, self.out, generator=self.generator), y


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


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------

def stdlib_sources(max_bytes: int | None = None) -> list[tuple[str, str]]:
    """The running interpreter's standard-library ``.py`` files, cleaned: ``[(relative path, text)]``.

    Read from ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and ``__pycache__`` left out),
    sorted by path. Cleaning: files that are not UTF-8, shorter than 200 bytes, or look generated
    (a line over 1,000 characters, or a mean line over 100) are dropped, and exact duplicates
    (same SHA-256 of the text) kept once. ``max_bytes`` stops after that many bytes of text.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    seen, out, total = set(), [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if rel.parts and rel.parts[0] in ("site-packages", "dist-packages") or "__pycache__" in rel.parts:
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines() or [""]
        if len(text) < 200 or max(map(len, lines)) > 1000 or len(text) / len(lines) > 100:
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        out.append((str(rel), text))
        total += len(text.encode())
        if max_bytes is not None and total >= max_bytes:
            break
    return out


@dataclass
class TextCorpus:
    """A tokenized corpus on disk: ``tokens`` (uint16 memmap path), ``tokenizer`` (its JSON),
    ``n_tokens``, ``vocab_size``, ``n_files``, ``n_bytes`` (UTF-8 bytes of text)."""

    tokens: Path
    tokenizer: Path
    n_tokens: int
    vocab_size: int
    n_files: int
    n_bytes: int

    def array(self) -> np.ndarray:
        """The tokens as a read-only ``uint16`` memory map of shape ``(n_tokens,)``."""
        return np.memmap(self.tokens, dtype=np.uint16, mode="r", shape=(self.n_tokens,))

    def load_tokenizer(self):
        """The trained ``tokenizers.Tokenizer``."""

        return Tokenizer.from_file(str(self.tokenizer))


def text_corpus(max_bytes: int | None = None, vocab_size: int = 8192,
                train_bytes: int = 4_000_000, folder: str | os.PathLike | None = None) -> TextCorpus:
    """Build (once) and return the standard-library corpus, tokenized into a uint16 memmap.

    Steps: :func:`stdlib_sources` (``max_bytes`` of cleaned text; None = all), a byte-level BPE
    with ``vocab_size`` tokens trained by Hugging Face ``tokenizers`` on the first ``train_bytes``
    of it (BPE training is the slow step; a few MB give a good vocabulary), every file encoded
    (``encode_batch``, on all cores) and separated by the ``<|endoftext|>`` token (id 0), written
    to ``tokens.u16``. Cached under ``cache_dir("text", <settings>)`` unless ``folder`` is given.

    Raises:
        ValueError: ``vocab_size`` not in 257..65536 (uint16 ids, plus the 256 bytes).
    """
    if not 257 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in 257..65536 for uint16 token ids, got {vocab_size}")

    key = f"py{sys.version_info[0]}{sys.version_info[1]}_b{max_bytes}_v{vocab_size}_t{train_bytes}"
    folder = Path(folder) if folder is not None else cache_dir("text", key)
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return TextCorpus(folder / "tokens.u16", folder / "tokenizer.json", **meta)

    docs = [text for _, text in stdlib_sources(max_bytes)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    sample, size = [], 0
    for d in docs:
        if size >= train_bytes:
            break
        sample.append(d)
        size += len(d)
    tok.train_from_iterator(sample, trainer=trainer)
    eot = tok.token_to_id("<|endoftext|>")
    ids = [np.asarray(e.ids + [eot], dtype=np.uint16) for e in tok.encode_batch(docs)]
    tokens = np.concatenate(ids)
    tokens.tofile(folder / "tokens.u16")
    tok.save(str(folder / "tokenizer.json"))
    meta = {"n_tokens": int(tokens.size), "vocab_size": tok.get_vocab_size(), "n_files": len(docs),
            "n_bytes": sum(len(d.encode()) for d in docs)}
    meta_path.write_text(json.dumps(meta))
    return TextCorpus(folder / "tokens.u16", folder / "tokenizer.json", **meta)


class TokenDataset(Dataset):
    """Next-token pairs from a token memmap: item ``i`` is ``(x, y)``, int64 tensors of shape
    ``(seq_len,)`` with ``x = tokens[i*L : i*L + L]`` and ``y`` the same window shifted by one.
    Non-overlapping windows: ``len = (n_tokens - 1) // seq_len``.

    Raises:
        ValueError: ``seq_len`` not positive, or the corpus shorter than one window.
    """

    def __init__(self, corpus: TextCorpus | str | os.PathLike, seq_len: int):
        positive_int("seq_len", seq_len)
        self.path = Path(corpus.tokens if isinstance(corpus, TextCorpus) else corpus)
        self.n_tokens = self.path.stat().st_size // 2
        self.seq_len = seq_len
        if (self.n_tokens - 1) // seq_len < 1:
            raise ValueError(f"{self.n_tokens} tokens is shorter than one window of {seq_len} + 1")
        self._mm = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_mm"] = None
        return state

    def __len__(self) -> int:
        return (self.n_tokens - 1) // self.seq_len

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint16, mode="r", shape=(self.n_tokens,))
        w = torch.from_numpy(self._mm[i * self.seq_len: (i + 1) * self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


# ---------------------------------------------------------------------------------------------
# Decoding on the CPU and on the GPU; the training-loop ladder
# ---------------------------------------------------------------------------------------------

class _BytesDataset(Dataset):
    """JPEG bytes held in memory; item ``i`` is ``fn(bytes_i)`` (a picklable module-level fn)."""

    def __init__(self, blobs: Sequence[bytes], fn: Callable):
        self.blobs = list(blobs)
        self.fn = fn

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        return self.fn(self.blobs[i])


def decode_pil(data: bytes) -> torch.Tensor:
    """Decode JPEG bytes with Pillow: uint8 ``(H, W, 3)`` tensor (shares the array's memory)."""

    with Image.open(io.BytesIO(data)) as im:
        return torch.from_numpy(np.array(im.convert("RGB")))


def _pipeline_224(data: bytes) -> torch.Tensor:
    return pil_pipeline(data, 224)


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


def read_blobs(files: Sequence[str | os.PathLike]) -> list[bytes]:
    """The bytes of each file, in order (so that a decode benchmark leaves the disk out)."""
    return [Path(f).read_bytes() for f in files]


def cpu_rate(blobs: Sequence[bytes], what: str = "decode", num_workers: int | None = None,
             batch: int = 64, multiprocessing_context: str | None = None,
             collate: str = "list") -> dict:
    """Images/s of decoding (``what="decode"``, Pillow, pixels delivered to this process) or of
    the full pipeline (``what="pipeline"``: :func:`pil_pipeline` to 224 x 224, batches of float32
    ``(B, 3, 224, 224)`` stacked by the default collate) on ``num_workers`` loader workers
    (default: every usable core; 0 = this process). Decoded images differ in size: ``collate``
    ``"list"`` sends them as one tensor each (:func:`collate_list`), ``"packed"`` as one tensor
    per batch (:func:`collate_packed`). Returns :func:`loader_rate`'s dict over one pass of
    ``blobs`` (steady state).

    Raises:
        ValueError: ``what`` not "decode" or "pipeline", or ``collate`` not "list" or "packed".
    """
    if what not in ("decode", "pipeline"):
        raise ValueError(f"what must be 'decode' or 'pipeline', got {what!r}")
    if collate not in ("list", "packed"):
        raise ValueError(f"collate must be 'list' or 'packed', got {collate!r}")
    workers = usable_cores() if num_workers is None else num_workers
    fn = decode_pil if what == "decode" else _pipeline_224
    collate_fn = None if what == "pipeline" else collate_list if collate == "list" else collate_packed
    loader = DataLoader(_BytesDataset(blobs, fn), batch_size=batch, num_workers=workers,
                        collate_fn=collate_fn, worker_init_fn=seed_worker if workers else None,
                        multiprocessing_context=multiprocessing_context if workers else None)
    packed = what == "decode" and collate == "packed"
    return loader_rate(loader, count=(lambda b: len(b[0])) if packed else None)


def gpu_decode(blobs: Sequence[bytes | torch.Tensor],
               device: str | torch.device = "cuda") -> list[torch.Tensor]:
    """Decode a batch of JPEGs on the GPU: ``torchvision.io.decode_jpeg(list, device=device)``.

    ``blobs``: the files' bytes, or 1-d uint8 CPU tensors of them. The compressed bytes are copied
    to the GPU inside the call (counted in its time). torchvision asks nvJPEG for its *hardware*
    back end (the JPEG decoding engines of an A100, H100 or H200) and falls back to the default,
    CUDA, back end where the GPU has none (torchvision's ``decode_jpegs_cuda.cpp``). Returns uint8
    ``(3, H, W)`` tensors on ``device``.
    """
    # torchvision is optional (the "vision" extra): the CPU wheels of torch this course pins have
    # no matching torchvision on PyPI, so only GPU code paths import it.
    from torchvision.io import decode_jpeg, ImageReadMode

    data = [b if isinstance(b, torch.Tensor) else torch.frombuffer(bytearray(b), dtype=torch.uint8)
            for b in blobs]
    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def gpu_rate(blobs: Sequence[bytes], what: str = "decode", batch: int = 256,
             device: str | torch.device = "cuda", repeats: int = 3) -> dict:
    """Images/s of batched GPU decode (``what="decode"``) or of the whole GPU pipeline
    (``"pipeline"``: decode, then :func:`gpu_augment_list` to 224 x 224) over ``blobs`` in
    batches of ``batch``, from bytes in host memory to pixels on the GPU.

    One warm-up pass, then ``repeats`` timed passes (synchronized, ``time.perf_counter``), the
    best kept. Returns ``{"images_per_s", "host_cpu_fraction", "telemetry"}``: the host CPU time
    of this process over the timed passes divided by their wall time (1.0 = one core busy all
    along), and the :class:`perflab.core.telemetry.TelemetrySummary` of the timed passes only (the
    GPU's clock while it worked, not while it waited for the warm-up or the set-up).

    Raises:
        ValueError: ``what`` not "decode" or "pipeline".
    """
    if what not in ("decode", "pipeline"):
        raise ValueError(f"what must be 'decode' or 'pipeline', got {what!r}")
    g = torch.Generator().manual_seed(0)
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]  # once, untimed

    def one_pass():
        for k in range(0, len(data), batch):
            imgs = gpu_decode(data[k:k + batch], device)
            if what == "pipeline":
                gpu_augment_list(imgs, 224, generator=g)

    one_pass()
    best, cpu, wall = math.inf, 0.0, 0.0
    with Telemetry(device=device) as tel:
        for _ in range(repeats):
            c0, sw = process_seconds(), Stopwatch(device).start()
            one_pass()
            dt = sw.elapsed()
            cpu, wall = cpu + process_seconds() - c0, wall + dt
            best = min(best, dt)
    return {"images_per_s": len(blobs) / best, "host_cpu_fraction": cpu / wall,
            "telemetry": tel.summary()}


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


def decode_augment(path: str | os.PathLike, out: int = 128, side: int = 144) -> torch.Tensor:
    """The loading ladder's per-image CPU work: decode and resize to the ``side`` x ``side``
    centre square (:func:`decode_resized`, what the memory map stores), then :func:`gpu_augment`'s
    random resized crop to ``out``, flip and normalization of that one image, on the CPU: float32
    ``(3, out, out)``. The offline rung does the same arithmetic, on the GPU, for a whole batch,
    so every rung trains on the same distribution of crops."""
    x = torch.from_numpy(decode_resized(path, side)).permute(2, 0, 1)
    return gpu_augment(x.unsqueeze(0), out)[0]


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


def train_steps(loader, model: torch.nn.Module, steps: int, device: str | torch.device,
                gpu_transform: Callable | None = None, warmup: int = 3) -> dict:
    """Train ``model`` (SGD, cross-entropy) for ``steps`` batches of ``loader`` and split each
    step's time into waiting for data and the rest.

    Per step (a :class:`perflab.core.timing.Stopwatch` on ``device``): ``next(loader)``; copy to ``device`` (``non_blocking`` when the batch is
    pinned); ``gpu_transform(x)`` if given, else ``x.float() / 255`` when ``x`` is uint8;
    forward, backward, optimizer step; synchronize. Data wait = time until the batch is on the
    device (the GPU is idle meanwhile). Returns ``images_per_s``, ``data_wait_fraction``
    (wait / total over the timed steps), ``step_ms``, ``steps`` (after ``warmup`` untimed ones).

    Raises:
        ValueError: ``steps`` not positive, or the loader ran out before ``warmup + steps``.
    """
    positive_int("steps", steps)
    dev = torch.device(device)
    model = model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    it = iter(loader)
    wait = total = 0.0
    images = 0
    for k in range(warmup + steps):
        sw = Stopwatch(dev).start()
        try:
            x, y = next(it)
        except StopIteration:
            raise ValueError(f"the loader ran out after {k} batches; need {warmup + steps}") from None
        x = x.to(dev, non_blocking=x.is_pinned())
        y = torch.as_tensor(y).to(dev, non_blocking=True)
        waited = sw.elapsed()                    # the batch is on the device
        if gpu_transform is not None:
            x = gpu_transform(x)
        elif x.dtype == torch.uint8:
            x = x.float().div_(255)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_s = sw.elapsed()
        if k >= warmup:
            wait += waited
            total += step_s
            images += len(y)
    return {"images_per_s": images / total, "data_wait_fraction": wait / total,
            "step_ms": 1e3 * total / steps, "steps": steps}
