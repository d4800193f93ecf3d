import pytest

from perflab.machine import copies, link_figures, nonblocking, transfer
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


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the behaviour with fewer than 2 GPUs")
def test_peer_copies_say_they_need_two_gpus():
    with pytest.raises(RuntimeError, match="2 GPUs"):
        transfer.peer_access(0, 1)
    with pytest.raises(RuntimeError, match="2 GPUs"):
        transfer.peer_copy_bandwidth(1024)


def test_band_position_judges_every_round_without_widening():
    from perflab.machine.transfer import band_position

    lo, hi = [10.0, 10.0, 10.0], [20.0, 20.0, 20.0]
    assert band_position([12, 15, 19], lo, hi) == "inside"
    assert band_position([21, 25, 30], lo, hi) == "above"
    assert band_position([9, 5, 9.9], lo, hi) == "below"
    # one round 1 % above the top: no 10 % of room, so not inside
    assert band_position([15, 15, 20.2], lo, hi) == "undecided"
    assert band_position([5, 15, 25], lo, hi) == "undecided"
    # each round against its own band
    assert band_position([15, 25], [10, 30], [20, 40]) == "undecided"
    with pytest.raises(ValueError, match="one value per round"):
        band_position([1, 2], lo, hi)
    with pytest.raises(ValueError, match="serial"):
        band_position([15], [20], [10])
    with pytest.raises(ValueError, match="measured"):
        band_position([0], [1], [2])


def test_median_points_takes_each_size_and_field_over_rounds():
    from perflab.machine.transfer import TransferPoint, median_points

    rounds = [[TransferPoint(4, 1, 2, 3, 4), TransferPoint(8, 10, 20, 30, 40)],
              [TransferPoint(4, 3, 2, 1, 9), TransferPoint(8, 30, 10, 10, 40)],
              [TransferPoint(4, 2, 5, 2, 0.5), TransferPoint(8, 20, 30, 20, 40)]]
    assert median_points(rounds) == [TransferPoint(4, 2, 2, 2, 4),
                                     TransferPoint(8, 20, 20, 20, 40)]
    with pytest.raises(ValueError, match="same sizes"):
        median_points([rounds[0], rounds[1][:1]])
    with pytest.raises(ValueError, match="at least one"):
        median_points([])
    # a field a round did not measure (NaN) is left out of that field's median
    nan = float("nan")
    skipped = [rounds[0], [TransferPoint(4, 3, 2, nan, nan), TransferPoint(8, 30, 10, nan, nan)]]
    assert median_points(skipped) == [TransferPoint(4, 2, 2, 3, 4),
                                      TransferPoint(8, 20, 15, 30, 40)]
    (none,) = median_points([[TransferPoint(4, 1, 2, nan, nan)]])
    assert none.h2d_pinned == 1 and none.d2h_pinned != none.d2h_pinned   # NaN stays NaN


def test_model_verdict_never_lets_an_undecided_size_decide():
    from perflab.machine.transfer import model_verdict

    assert model_verdict(["inside"] * 3) is True
    assert model_verdict(["inside", "inside", "inside", "above"]) is True      # 3 of 4
    assert model_verdict(["inside", "above", "below"]) is False
    # the old 10 % widening would have called these inside; now they are open
    assert model_verdict(["inside", "undecided", "undecided"]) is None
    assert model_verdict(["inside", "undecided", "above"]) is False            # 2/3 < 3/4
    assert model_verdict(["above", "above"], share=0.5) is False
    with pytest.raises(ValueError, match="positions"):
        model_verdict(["inside", "within"])
    with pytest.raises(ValueError, match="positions"):
        model_verdict([])
    with pytest.raises(ValueError, match="share"):
        model_verdict(["inside"], share=0)


def test_describe_positions_counts_each_kind_in_order():
    from perflab.machine.transfer import describe_positions

    assert describe_positions(["above", "inside", "above"]) == (
        "in the band at 1 of 3 sizes, above the band at 2 of 3 sizes")
    assert describe_positions(["undecided"]) == "across an edge of the band at 1 of 1 sizes"
    with pytest.raises(ValueError, match="positions"):
        describe_positions([])


def _fake_rounds(monkeypatch=None, rounds=3, **kw):
    """Three rounds of a fake sweep (pinned 50 GB/s; pageable 20, 22, 24 GB/s by round) and
    fake staging rates (one copy 40 GB/s, chunked 60, memcpy 44 + 2 per round, read + written)."""
    from perflab.machine.transfer import TransferPoint, pageable_rounds

    calls = []

    def sweep(sizes, device, d2h=True):
        r = len([c for c in calls if c.startswith("sweep")])
        calls.append("sweep" if d2h else "sweep h2d")
        d2h_rate = 40e9 + r * 1e9 if d2h else float("nan")
        return [TransferPoint(n, 50e9, (20 + 2 * r) * 1e9, d2h_rate, 10e9 if d2h else d2h_rate)
                for n in sizes]

    def staging(sizes):
        r = len([c for c in calls if c == "staging"])
        calls.append("staging")
        return {"one copy": {n: 40e9 for n in sizes}, "chunked": {n: 60e9 for n in sizes},
                "memcpy": {n: (44 + 2 * r) * 1e9 for n in sizes}}

    class Watch:
        def __enter__(self):
            calls.append("watch")
            return self

        def __exit__(self, *exc):
            return False

        def summary(self):
            return f"summary {calls.count('watch')}"

    out = pageable_rounds([2**16, 2**20, 2**24], "cuda", rounds=rounds, watch=Watch,
                          sweep=sweep, staging=staging, **kw)
    return out, calls


def test_pageable_rounds_alternate_the_sweep_and_its_staging_inputs():
    out, calls = _fake_rounds()
    assert calls == ["watch", "sweep", "staging"] * 3
    assert out.telemetry == "summary 1"                 # the first round's
    assert [p.h2d_pageable for p in out.points()] == [22e9] * 3
    # one copy: staging 20 GB/s of data, so overlapped = 20, serial = 1/(1/50 + 1/20)
    serial = 1 / (1 / 50e9 + 1 / 20e9)
    assert out.median_band("one copy")[2**20] == pytest.approx((serial, 20e9))
    # rounds 0, 1, 2 measured 20, 22, 24 against an overlapped bound of 20: one on the edge,
    # two above: undecided, not "inside within 10 %"
    assert out.positions("one copy") == ["undecided", "undecided"]   # sizes from 1 MiB up
    assert out.positions("chunked") == ["inside", "inside"]          # band up to 30 GB/s
    # memcpy's top moves with its round (22, 23, 24 GB/s): each round inside its own band,
    # though round 2's 24 GB/s lies above the median band's top (23)
    assert out.positions("memcpy") == ["inside", "inside"]
    assert out.median_band("memcpy")[2**20][1] == pytest.approx(23e9)
    assert len(out.positions("one copy", min_bytes=1)) == 3
    with pytest.raises(ValueError, match="kind"):
        out.bands("two copies")


def test_pageable_rounds_time_d2h_in_the_first_d2h_rounds_only():
    out, calls = _fake_rounds(d2h_rounds=1)
    assert calls == ["watch", "sweep", "staging"] + ["watch", "sweep h2d", "staging"] * 2
    # D2H is round 0's alone; H2D and every band still come from all three rounds
    assert [(p.d2h_pinned, p.d2h_pageable) for p in out.points()] == [(40e9, 10e9)] * 3
    assert [p.h2d_pageable for p in out.points()] == [22e9] * 3
    assert out.positions("one copy") == ["undecided", "undecided"]
    assert _fake_rounds()[0].points()[0].d2h_pinned == 41e9   # every round: the median
    with pytest.raises(ValueError, match="d2h_rounds"):
        _fake_rounds(d2h_rounds=0)


def test_pageable_rounds_refuse_bad_rounds_and_mismatched_sweeps():
    from perflab.machine.transfer import PageableRounds, TransferPoint

    with pytest.raises(ValueError, match="rounds"):
        _fake_rounds(rounds=0)
    one = [TransferPoint(4, 1, 1, 1, 1)]
    with pytest.raises(ValueError, match="one entry per round"):
        PageableRounds([one, one], [{}])
    with pytest.raises(ValueError, match="same sizes"):
        PageableRounds([one, [TransferPoint(8, 1, 1, 1, 1)]], [{}, {}])


def test_staging_rates_refuse_sizes_that_are_not_whole_floats():
    with pytest.raises(ValueError, match="sizes"):
        transfer.staging_rates([6])
    with pytest.raises(ValueError, match="sizes"):
        transfer.staging_rates([])


def test_plot_copy_rates_draws_four_copies_and_the_link():
    import matplotlib.pyplot as plt
    pts = [transfer.TransferPoint(n, 2e9 * i, 1e9 * i, 3e9 * i, 1.5e9 * i)
           for i, n in enumerate((2**20, 2**22, 2**24), start=1)]
    fig = link_figures.plot_copy_rates(pts, pcie_Bps=31.5e9)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"h2d pinned", "h2d pageable", "d2h pinned", "d2h pageable",
                          "PCIe, per direction (theory)"}
    assert list(lines["d2h pinned"].get_ydata()) == [3.0, 6.0, 9.0]  # GB/s
    assert lines["PCIe, per direction (theory)"].get_ydata()[0] == 31.5
    plt.close(fig)
    with pytest.raises(ValueError, match="points"):
        link_figures.plot_copy_rates([])


def test_plot_allreduce_busbw_draws_the_sweep_the_fit_and_the_prediction():
    import matplotlib.pyplot as plt
    from perflab.machine import interconnect
    pts = tuple(interconnect.AllReducePoint(s, t, 10, interconnect.algorithm_bandwidth(s, t),
                                            interconnect.bus_bandwidth(s, t, 2))
                for s, t in ((2**20, 1e-4), (2**24, 1e-3), (2**28, 1e-2)))
    res = interconnect.AllReduceResult(backend="nccl", world_size=2, device="cuda",
                                       points=pts, versions={}, timer="cuda events")
    fit = interconnect.alpha_beta(res)
    fig = link_figures.plot_allreduce_busbw(res, fit, link_bw=450e9, peer_Bps=380e9)
    labels = {line.get_label() for line in fig.axes[0].get_lines()}
    assert labels == {"all-reduce busbw (nccl)", "alpha-beta fit", "predicted (chapter 2)",
                      "peer copy, measured"}
    plt.close(fig)
    gloo = link_figures.plot_allreduce_busbw(res, fit)
    assert len(gloo.axes[0].get_lines()) == 2
    plt.close(gloo)


def test_the_non_blocking_probe_checks_its_arguments_by_name():
    """Chapter 2's probe, exported from its page (perflab.machine.nonblocking)."""
    with pytest.raises(ValueError, match="nbytes"):
        nonblocking.non_blocking_behaviour(0)
    with pytest.raises(ValueError, match="reps"):
        nonblocking.non_blocking_behaviour(1024, reps=0)
    with pytest.raises(ValueError, match="CUDA device"):
        nonblocking.non_blocking_behaviour(1024, device="cpu")


def test_the_copy_sweep_is_chapter_2s_and_checks_its_sizes_first():
    """host_device_sweep is exported from chapter 2's page (perflab.machine.copies); transfer's
    rounds and the report use that one copy."""
    assert transfer.host_device_sweep is copies.host_device_sweep
    assert transfer.TransferPoint is copies.TransferPoint
    with pytest.raises(ValueError, match="sizes"):
        copies.host_device_sweep([1024, 0])
