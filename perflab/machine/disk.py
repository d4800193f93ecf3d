"""Disk reads: sequential against random, cold page cache against warm.

The operating system keeps recently read file pages in RAM (the *page cache*), so the second read
of a file usually never reaches the disk. To measure the disk itself, the file's cached pages are
dropped first with ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` after an ``fsync`` (dirty
pages cannot be dropped): see the Linux ``posix_fadvise(2)`` manual page. The call is advice: a
file system may ignore it (tmpfs keeps files *only* in RAM), in which case "cold" reads come out
as fast as warm ones; :func:`measure` reports that.

Each measurement is one timed pass (``time.perf_counter``) rather than a repeated benchmark,
because a second pass would find the pages cached. Units: bytes, seconds, bytes/s, reads/s (IOPS).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DiskReport",
    "default_directory",
    "drop_cache",
    "filesystem",
    "make_file",
    "measure",
    "random_read",
    "sequential_read",
]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def filesystem(path: str | os.PathLike) -> tuple[str, str]:
    """``(mount point, file-system type)`` that holds ``path``, from ``/proc/mounts`` (Linux).

    Returns ``("?", "unknown")`` where the OS does not say.
    """
    target = os.path.realpath(path)
    best = ("?", "unknown")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[0] if best[0] != "?" else ""):
                    best = (mount, parts[2])
    except OSError:
        pass
    return best


def default_directory() -> str:
    """Where to put a test file: the temp directory, unless it lives in RAM (tmpfs, ramfs), where
    dropping pages means nothing; then the current working directory."""
    tmp = tempfile.gettempdir()
    if filesystem(tmp)[1] in ("tmpfs", "ramfs"):
        return os.getcwd()
    return tmp


def make_file(nbytes: int, directory: str | os.PathLike | None = None, chunk: int = 2**20) -> Path:
    """Write a file of ``nbytes`` random bytes (incompressible), ``fsync`` it, and return its path.

    The file goes to ``directory`` (default: :func:`default_directory`); the caller deletes it.

    Raises:
        ValueError: ``nbytes`` or ``chunk`` not a positive integer.
        OSError: the directory is not writable or the disk is full.
    """
    _positive_int("nbytes", nbytes)
    _positive_int("chunk", chunk)
    rng = np.random.default_rng(0)
    fd, name = tempfile.mkstemp(prefix="perflab-disk-", suffix=".bin",
                                dir=directory if directory is not None else default_directory())
    try:
        left = nbytes
        while left:
            n = min(chunk, left)
            os.write(fd, rng.bytes(n))
            left -= n
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    os.close(fd)
    return Path(name)


def drop_cache(path: str | os.PathLike) -> bool:
    """Ask the OS to drop ``path``'s pages from the page cache; True if the request was made.

    ``fsync`` first (dirty pages are not dropped), then ``posix_fadvise(fd, 0, 0,
    POSIX_FADV_DONTNEED)``. Returns False where Python has no ``posix_fadvise`` (macOS, Windows).
    A True return means the advice was given, not that it was followed: compare a cold read with
    a warm one to know.

    Raises:
        FileNotFoundError: no such file.
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def sequential_read(path: str | os.PathLike, block: int = 2**20, cold: bool = True) -> float:
    """Read the whole file front to back in ``block``-byte reads; return bytes/s.

    ``cold=True`` drops the file's cached pages first (:func:`drop_cache`). The reads go into one
    reused buffer (``readinto``), so no Python object is allocated per block.

    Raises:
        ValueError: ``block`` not a positive integer.
        FileNotFoundError: no such file.
    """
    _positive_int("block", block)
    if cold:
        drop_cache(path)
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        t0 = time.perf_counter()
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
        seconds = time.perf_counter() - t0
    if total == 0:
        raise ValueError(f"{path} is empty: nothing to read")
    return total / seconds


def random_read(
    path: str | os.PathLike,
    block: int = 4096,
    count: int = 2000,
    cold: bool = True,
    seed: int = 0,
) -> float:
    """``count`` reads of ``block`` bytes at random block-aligned offsets (``os.pread``); return reads/s.

    One read at a time (queue depth 1), so the rate is ``1 / latency``; bytes/s is the rate times
    ``block``. The offsets depend only on ``seed`` and the file size, so a warm run re-reads the
    pages a cold run brought in.

    Raises:
        ValueError: ``block`` or ``count`` not positive, or a file smaller than one block.
        FileNotFoundError: no such file.
    """
    _positive_int("block", block)
    _positive_int("count", count)
    size = os.path.getsize(path)
    if size < block:
        raise ValueError(f"{path} holds {size} bytes, less than one block of {block}")
    rng = random.Random(seed)
    offsets = [rng.randrange(size // block) * block for _ in range(count)]
    if cold:
        drop_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in offsets:
            os.pread(fd, block, off)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    return count / seconds


@dataclass(frozen=True)
class DiskReport:
    """Read throughput of one file, cold and warm.

    Attributes:
        nbytes: file size in bytes.
        directory: where the file was written; ``mount`` and ``fstype`` hold it.
        seq_cold_Bps, seq_warm_Bps: sequential read bandwidth, bytes/s.
        rand_cold_iops, rand_warm_iops: random ``block``-byte reads per second (queue depth 1).
        block: random-read size in bytes.
        cache_dropped: True when the cold reads were clearly slower than the warm ones
            (sequential cold < 0.7 x warm), i.e. the OS followed the advice to drop the pages.
    """

    nbytes: int
    directory: str
    mount: str
    fstype: str
    seq_cold_Bps: float
    seq_warm_Bps: float
    rand_cold_iops: float
    rand_warm_iops: float
    block: int
    cache_dropped: bool

    def summary(self) -> str:
        """A few lines for a notebook or the report card."""
        lines = [
            f"file: {self.nbytes / 2**20:.0f} MiB in {self.directory} ({self.fstype} mounted at {self.mount})",
            f"sequential read: cold {self.seq_cold_Bps / 1e9:6.2f} GB/s, warm {self.seq_warm_Bps / 1e9:6.2f} GB/s",
            f"random {self.block // 1024} KiB reads: cold {self.rand_cold_iops:9,.0f} IOPS "
            f"({self.rand_cold_iops * self.block / 1e6:.0f} MB/s), warm {self.rand_warm_iops:9,.0f} IOPS",
        ]
        if not self.cache_dropped:
            lines.append("the OS did not drop the file's pages (cold read as fast as warm):\n"
                         "'cold' figures here are page-cache figures")
        return "\n".join(lines)


def measure(
    nbytes: int,
    directory: str | os.PathLike | None = None,
    block: int = 4096,
    count: int = 2000,
) -> DiskReport:
    """Write a file of ``nbytes``, read it cold and warm, sequentially and at random; delete it.

    Order: write + fsync; sequential cold (pages dropped), sequential warm; random cold (pages
    dropped again), random warm (the same offsets). See :func:`sequential_read` and
    :func:`random_read`.

    Raises:
        ValueError: ``nbytes`` smaller than ``block``, or bad ``block``/``count``.
        OSError: the directory is not writable or the disk is full.
    """
    _positive_int("nbytes", nbytes)
    _positive_int("block", block)
    if nbytes < block:
        raise ValueError(f"nbytes ({nbytes}) must be at least one block ({block})")
    path = make_file(nbytes, directory)
    try:
        seq_cold = sequential_read(path, cold=True)
        seq_warm = sequential_read(path, cold=False)
        rand_cold = random_read(path, block, count, cold=True)
        rand_warm = random_read(path, block, count, cold=False)
    finally:
        path.unlink(missing_ok=True)
    mount, fstype = filesystem(path.parent)
    return DiskReport(nbytes, str(path.parent), mount, fstype, seq_cold, seq_warm, rand_cold, rand_warm,
                      block, seq_cold < 0.7 * seq_warm)
