import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from perflab.machine import caches, workingset  # noqa: E402


def staircase(sizes, levels):
    """Bandwidth of a perfect hierarchy: levels = [(capacity, bytes/s), ..., (inf, dram)]."""
    return [next(bw for cap, bw in levels if s <= cap) for s in sizes]


def test_format_bytes_uses_binary_units():
    assert caches.format_bytes(32768) == "32 KiB"
    assert caches.format_bytes(60 * 2**20) == "60 MiB"
    assert caches.format_bytes(1.5 * 2**20) == "1.5 MiB"
    assert caches.format_bytes(512) == "512 B"


def test_geometric_sizes_are_increasing_multiples_between_the_bounds():
    sizes = caches.geometric_sizes(8192, 2**20, per_octave=2)
    assert sizes[0] == 8192 and sizes[-1] == 2**20
    assert all(b > a for a, b in zip(sizes, sizes[1:]))
    assert all(s % 4096 == 0 for s in sizes)
    assert len(sizes) == 15  # 7 octaves, 2 points each, plus the first
    with pytest.raises(ValueError, match="lo"):
        caches.geometric_sizes(0, 10)
    with pytest.raises(ValueError, match="per_octave"):
        caches.geometric_sizes(1, 10, per_octave=0)


def test_find_steps_reads_back_every_capacity_of_a_staircase():
    sizes = caches.geometric_sizes(4096, 2**30, per_octave=4)
    bws = staircase(sizes, [(32 * 2**10, 200e9), (2**20, 100e9), (32 * 2**20, 60e9), (math.inf, 20e9)])
    steps = caches.find_steps(sizes, bws)
    assert len(steps) == 3
    for step, cap in zip(steps, (32 * 2**10, 2**20, 32 * 2**20)):
        assert cap <= step.capacity_bytes <= cap * 2 ** 0.25   # between the last fast and first slow size
        assert step.last_fast_bytes == cap
    assert steps[-1].ratio == pytest.approx(3.0)
    assert caches.largest_step(steps) is steps[-1]


def test_a_single_noisy_point_neither_makes_nor_hides_a_step():
    sizes = caches.geometric_sizes(4096, 2**28, per_octave=2)
    bws = staircase(sizes, [(2**20, 100e9), (math.inf, 20e9)])
    bws[3] *= 0.5   # one dip on the fast plateau
    steps = caches.find_steps(sizes, bws)
    assert len(steps) == 1
    assert 2**20 <= steps[0].capacity_bytes <= 2**20 * 1.5


def test_a_flat_curve_has_no_step():
    assert caches.find_steps([1, 2, 4, 8], [5.0, 5.1, 4.9, 5.0]) == []
    assert caches.largest_step([]) is None


@pytest.mark.parametrize("sizes, bws, word", [
    ([1, 2], [1, 1], "at least 3"),
    ([1, 2, 3], [1, 1], "length"),
    ([1, 3, 2], [1, 1, 1], "increasing"),
    ([1, 2, 3], [1, 0, 1], "positive"),
])
def test_find_steps_rejects_bad_curves(sizes, bws, word):
    with pytest.raises(ValueError, match=word):
        caches.find_steps(sizes, bws)


def test_find_steps_rejects_a_bad_threshold():
    with pytest.raises(ValueError, match="min_drop"):
        caches.find_steps([1, 2, 3], [3, 2, 1], min_drop=1.5)


def test_match_steps_pairs_each_level_with_at_most_one_nearby_step():
    sizes = caches.geometric_sizes(4096, 2**30, per_octave=2)
    bws = staircase(sizes, [(32 * 2**10, 200e9), (32 * 2**20, 60e9), (math.inf, 20e9)])   # no L2 step
    steps = caches.find_steps(sizes, bws)
    l1, l2, l3 = caches.match_steps(steps, [32 * 2**10, 2**20, 32 * 2**20])
    assert l1 is steps[0] and l3 is steps[1] and l2 is None
    with pytest.raises(ValueError, match="max_factor"):
        caches.match_steps(steps, [1], max_factor=0.5)


def test_read_bandwidth_on_cpu_is_a_positive_rate():
    """Chapter 2's probe, exported from its page (perflab.machine.workingset)."""
    bw = workingset.read_bandwidth(64 * 1024, total_bytes=4 * 2**20)
    assert math.isfinite(bw) and bw > 0


@pytest.mark.parametrize("nbytes", [0, 6, 4.0, True])
def test_read_bandwidth_rejects_sizes_that_are_not_whole_elements(nbytes):
    with pytest.raises(ValueError, match="nbytes"):
        workingset.read_bandwidth(nbytes)
    with pytest.raises(ValueError, match="total_bytes"):
        workingset.read_bandwidth(4096, total_bytes=0)


def test_working_set_sweep_keeps_the_best_pass(monkeypatch):
    values = iter([1.0, 5.0, 3.0, 2.0])   # pass 1: sizes 4096, 8192; pass 2: the same
    monkeypatch.setattr(workingset, "read_bandwidth", lambda s: next(values))
    points = workingset.working_set_sweep([4096, 8192], passes=2)
    assert [(p.nbytes, p.bytes_per_s) for p in points] == [(4096, 3.0), (8192, 5.0)]
    with pytest.raises(ValueError, match="passes"):
        workingset.working_set_sweep([4096], passes=0)
    with pytest.raises(ValueError, match="sizes"):
        workingset.working_set_sweep([])


def test_plot_working_set_returns_a_figure():
    pts = [caches.WorkingSetPoint(s, b) for s, b in zip([4096, 8192, 16384, 32768], [4e9, 4e9, 1e9, 1e9])]
    steps = caches.find_steps([p.nbytes for p in pts], [p.bytes_per_s for p in pts])
    fig = caches.plot_working_set({"test": pts}, [("L1", 8192)], steps)
    assert fig.axes[0].get_xlabel().startswith("working set")


def _h200_like(rounds=5, startup=1.07e-6, jitter=0.01, dips=()):
    """Per-call times of x * 2 replayed from CUDA graphs on an H200-like GPU: a start-up of about
    a microsecond per kernel, 7.4 TB/s while the working set fits in one L2 partition, a fall
    between 38 and 64 MiB, 4.15 TB/s from HBM; ``dips`` sizes run 1.7x slower (a probe's own
    steps). Rounds alternate +-jitter."""
    from perflab.core.rounds import Spread

    sizes = caches.geometric_sizes(4 * 2**20, 2**30, per_octave=3)

    def bw(n):
        if n <= 38 * 2**20:
            return 7.4e12
        if n >= 64 * 2**20:
            return 4.15e12
        f = math.log(n / (38 * 2**20)) / math.log(64 / 38)
        return 7.4e12 ** (1 - f) * 4.15e12 ** f

    wobble = [1 + jitter * (-1) ** r for r in range(rounds)]
    times = {n: Spread(tuple((startup + n / bw(n) * (1.7 if n in dips else 1)) * w for w in wobble))
             for n in sizes}
    return caches.ReplayCurve(times, Spread(tuple(startup * w for w in wobble))), sizes


def test_replay_curve_takes_the_measured_start_up_out_before_reading_the_l2():
    sweep, sizes = _h200_like()
    raw = sweep.raw()
    # with the start-up left in, the smallest working sets look far slower than the L2 is
    assert raw[0].bytes_per_s < 0.5 * 7.4e12
    curve = sweep.curve()
    # sizes whose bytes take less than the start-up are left out, the rest read the L2's rate
    assert curve[0].nbytes > 4 * 2**20
    assert all(abs(p.bytes_per_s / 7.4e12 - 1) < 0.02 for p in curve if p.nbytes <= 32 * 2**20)
    l2, hbm = sweep.level(60 * 2**20 / 8, 30 * 2**20), sweep.level(240 * 2**20)
    assert l2.median == pytest.approx(7.4e12, rel=0.02) and hbm.median == pytest.approx(4.15e12, rel=0.02)
    assert (l2 / hbm).median == pytest.approx(7.4 / 4.15, rel=1e-6)   # round by round: drift cancels
    step = caches.largest_step(caches.find_steps([p.nbytes for p in curve], [p.bytes_per_s for p in curve]))
    assert step is not None and 30 * 2**20 <= step.capacity_bytes <= 60 * 2**20
    # each round has its own curve, and each reads the same capacity within a size
    caps = [caches.largest_step(caches.find_steps([p.nbytes for p in c], [p.bytes_per_s for p in c])).capacity_bytes
            for c in sweep.round_curves()]
    assert len(caps) == 5 and max(caps) / min(caps) < 1.3


def test_a_straight_line_through_the_start_up_bound_sizes_misreads_the_l2():
    """The first edition's mistake, kept as a test: a straight line t = a + n / B fitted across
    a probe's own dips misreads the L2's rate; the dips are found as what they are."""
    from perflab.core.fits import fit_line

    sizes = caches.geometric_sizes(4 * 2**20, 2**30, per_octave=3)
    inside = [n for n in sizes if 60 * 2**20 / 16 <= n <= 30 * 2**20]
    planted = {inside[4], inside[6], sizes[20]}
    sweep, _ = _h200_like(dips=planted)
    fit = fit_line(inside, [sweep.seconds[n].median for n in inside])
    assert abs(1 / fit.slope / 7.4e12 - 1) > 0.05   # the dips drag the line off the L2's rate
    # the dips are the probe's: they come back up, a cache's fall does not
    assert set(sweep.dips()) == planted
    # with the start-up subtracted round by round, the undipped sizes read the L2's rate
    assert sweep.bandwidth(inside[3]).median == pytest.approx(7.4e12, rel=0.02)


def test_replay_curve_rejects_mismatched_rounds_and_reports_an_empty_range():
    from perflab.core.rounds import Spread

    with pytest.raises(ValueError, match="rounds"):
        caches.ReplayCurve({2**20: Spread((1e-6, 2e-6))}, Spread((1e-7, 1e-7, 1e-7)))
    with pytest.raises(ValueError, match="at least one"):
        caches.ReplayCurve({}, Spread((1e-7,)))
    sweep = caches.ReplayCurve({2**20: Spread((1.1e-6,))}, Spread((1e-6,)))
    assert not sweep.counted(2**20) and sweep.curve() == []
    with pytest.raises(ValueError, match="no counted size"):
        sweep.level(0)
    with pytest.raises(ValueError, match="start-up"):
        caches.ReplayCurve({2**20: Spread((0.9e-6,))}, Spread((1e-6,))).bandwidth(2**20)


def _fake_sysfs(root, size, shared):
    d = root / "index3"
    d.mkdir(parents=True)
    (d / "level").write_text("3\n")
    (d / "type").write_text("Unified\n")
    (d / "size").write_text(size + "\n")
    (d / "shared_cpu_list").write_text(shared + "\n")
    return str(root)


def test_beyond_cache_numel_reads_the_last_level_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(caches.os, "cpu_count", lambda: 4)
    sysfs = _fake_sysfs(tmp_path, "32768K", "0-1")  # 2 instances of 32 MiB
    # 4 x 64 MiB = 256 MiB of float32 = 2**26 elements
    assert caches.beyond_cache_numel(sysfs=sysfs) == 2**26
    assert caches.beyond_cache_numel(sysfs=sysfs, maximum=2**25) == 2**25
    assert caches.beyond_cache_numel(sysfs=str(tmp_path / "none")) == 2**24
    with pytest.raises(ValueError, match="factor"):
        caches.beyond_cache_numel(0.5)
    with pytest.raises(ValueError, match="maximum"):
        caches.beyond_cache_numel(maximum=1)
