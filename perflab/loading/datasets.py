"""Datasets built offline from real material on the machine: JPEG photographs and a text corpus.

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
rebuild. The storage formats of the images are :mod:`perflab.loading.storage`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import Dataset

from perflab.core.validate import integer, positive_int

__all__ = ["cache_dir", "source_photos", "make_jpeg_folder", "stdlib_sources", "TextCorpus",
           "text_corpus", "TokenDataset"]


def cache_dir(*parts: str) -> Path:
    """The folder where built data live (created on first use): ``$PERFLAB_DATA_DIR`` or
    ``<clone>/.cache/perflab/data``, joined with ``parts``."""
    root = os.environ.get("PERFLAB_DATA_DIR")
    base = Path(root) if root else Path(__file__).resolve().parent.parent.parent / ".cache" / "perflab" / "data"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    integer("quality", quality, 1, 95)        # Pillow's range
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
    integer("vocab_size", vocab_size, 257, 65536)   # uint16 ids, beyond the 256 bytes

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
