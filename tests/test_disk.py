import os

import pytest

from perflab.machine import disk


def test_filesystem_finds_the_mount_holding_a_path(tmp_path):
    mount, fstype = disk.filesystem(tmp_path)
    assert str(tmp_path).startswith(mount.rstrip("/") or "/")
    assert fstype != "" and os.path.isdir(disk.default_directory())


def test_make_file_writes_incompressible_bytes(tmp_path):
    path = disk.make_file(3 * 2**20 + 5, tmp_path)
    try:
        data = path.read_bytes()
        assert len(data) == 3 * 2**20 + 5
        assert data[:4096] != data[2**20: 2**20 + 4096]   # each chunk is fresh random data
    finally:
        path.unlink()
    with pytest.raises(ValueError, match="nbytes"):
        disk.make_file(0, tmp_path)


def test_measure_reads_cold_and_warm_and_deletes_its_file(tmp_path):
    r = disk.measure(2 * 2**20, tmp_path, count=50)
    assert list(tmp_path.iterdir()) == []
    for v in (r.seq_cold_Bps, r.seq_warm_Bps, r.rand_cold_iops, r.rand_warm_iops):
        assert v > 0
    assert r.nbytes == 2 * 2**20 and r.block == 4096
    text = r.summary()
    assert "sequential read" in text and "random 4 KiB reads" in text
    if not r.cache_dropped:
        assert "did not drop" in text


def test_drop_cache_gives_the_advice_on_linux(tmp_path):
    path = disk.make_file(4096, tmp_path)
    assert disk.drop_cache(path) is hasattr(os, "posix_fadvise")
    with pytest.raises(FileNotFoundError):
        disk.drop_cache(tmp_path / "missing")


def test_reads_reject_bad_blocks_and_tiny_files(tmp_path):
    path = disk.make_file(1000, tmp_path)
    with pytest.raises(ValueError, match="block"):
        disk.sequential_read(path, block=0)
    with pytest.raises(ValueError, match="less than one block"):
        disk.random_read(path, block=4096)
    with pytest.raises(ValueError, match="count"):
        disk.random_read(path, block=100, count=0)
    with pytest.raises(ValueError, match="at least one block"):
        disk.measure(100, tmp_path)
