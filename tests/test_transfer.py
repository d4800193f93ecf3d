import pytest

from perflab.machine import transfer
from perflab.core.device import gpu_count, has_gpu


def test_pcie_bandwidth_per_direction():
    assert transfer.pcie_bandwidth(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert transfer.pcie_bandwidth(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert transfer.pcie_bandwidth(1, 1) == pytest.approx(0.25e9)
    with pytest.raises(ValueError, match="generation"):
        transfer.pcie_bandwidth(7, 16)
    with pytest.raises(ValueError, match="width"):
        transfer.pcie_bandwidth(5, 0)


def test_pageable_prediction_bounds_the_staged_copy():
    serial, overlapped = transfer.pageable_prediction(50e9, 20e9)   # staging memcpy: 10 GB/s of data
    assert serial == pytest.approx(1 / (1 / 50e9 + 1 / 10e9))
    assert overlapped == 10e9
    assert serial < overlapped <= 50e9
    fast_host = transfer.pageable_prediction(25e9, 400e9)
    assert fast_host[1] == 25e9                                          # then the link sets the pace
    with pytest.raises(ValueError, match="pinned_Bps"):
        transfer.pageable_prediction(0, 1)


def test_staging_copy_counts_read_and_write_over_the_best_pass(monkeypatch):
    """Timed passes of 1, 2, 4 and 3 s after an untimed 0.5 s one: the best timed pass (1 s,
    not the warm-up), with the bytes read plus written (2 x nbytes), whatever the chunk."""
    class Watch:                      # a stopwatch that reads out preset passes
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.seconds = next(passes)

    for chunk in (2**10, 2**16):
        passes = iter([0.5, 1, 2, 4, 3])
        monkeypatch.setattr(transfer, "Stopwatch", Watch)
        got = transfer.staging_copy_bandwidth(2**16, chunk=chunk, reps=4)
        assert got == pytest.approx(2 * 2**16 / 1)
    monkeypatch.undo()
    assert transfer.staging_copy_bandwidth(2**12, chunk=2**10, reps=1) > 0
    with pytest.raises(ValueError, match="nbytes"):
        transfer.staging_copy_bandwidth(6)
    with pytest.raises(ValueError, match="chunk"):
        transfer.staging_copy_bandwidth(2**12, chunk=0)
    with pytest.raises(ValueError, match="reps"):
        transfer.staging_copy_bandwidth(2**12, reps=0)


def test_the_staging_copy_can_be_the_c_librarys_memcpy(monkeypatch):
    """Review F15 (5 December): the driver stages with the C library's memcpy, not ATen's loop;
    copier="memcpy" copies every chunk with ctypes.memmove, the whole buffer on every pass."""
    import ctypes

    copied, real = [], ctypes.memmove

    def memmove(dst, src, count):
        copied.append(count)
        return real(dst, src, count)

    monkeypatch.setattr(transfer.ctypes, "memmove", memmove)
    assert transfer.staging_copy_bandwidth(2**16, chunk=2**12, reps=2, copier="memcpy") > 0
    assert sum(copied) == 3 * 2**16 and max(copied) == 2**12   # 1 untimed + 2 timed passes
    copied.clear()
    transfer.staging_copy_bandwidth(2**16, chunk=2**12, reps=1)   # ATen's copy_: no memmove
    assert copied == []
    with pytest.raises(ValueError, match="copier"):
        transfer.staging_copy_bandwidth(2**12, copier="rep movsb")


def test_arguments_are_checked_before_looking_for_a_gpu():
    with pytest.raises(ValueError, match="sizes"):
        transfer.host_device_sweep([])


@pytest.mark.skipif(has_gpu(), reason="checks the behaviour on a machine without a GPU")
def test_copies_say_they_need_a_gpu():
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        transfer.host_device_sweep([1024])
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        transfer.non_blocking_behaviour(1024)


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the behaviour with fewer than 2 GPUs")
def test_peer_copies_say_they_need_two_gpus():
    with pytest.raises(RuntimeError, match="2 GPUs"):
        transfer.peer_access(0, 1)
    with pytest.raises(RuntimeError, match="2 GPUs"):
        transfer.peer_copy_bandwidth(1024)
