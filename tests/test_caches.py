import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from perflab.machine import caches  # noqa: E402


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
    bw = caches.read_bandwidth("cpu", 64 * 1024, total_bytes=4 * 2**20)
    assert math.isfinite(bw) and bw > 0


@pytest.mark.parametrize("nbytes", [0, 6, 4.0, True])
def test_read_bandwidth_rejects_sizes_that_are_not_whole_elements(nbytes):
    with pytest.raises(ValueError, match="nbytes"):
        caches.read_bandwidth("cpu", nbytes)


def test_working_set_sweep_keeps_the_best_pass(monkeypatch):
    values = iter([1.0, 5.0, 3.0, 2.0])   # pass 1: sizes 4096, 8192; pass 2: the same
    monkeypatch.setattr(caches, "read_bandwidth", lambda device, s, total=None: next(values))
    points = caches.working_set_sweep("cpu", [4096, 8192], passes=2)
    assert [(p.nbytes, p.bytes_per_s) for p in points] == [(4096, 3.0), (8192, 5.0)]
    with pytest.raises(ValueError, match="passes"):
        caches.working_set_sweep("cpu", [4096], passes=0)
    with pytest.raises(ValueError, match="sizes"):
        caches.working_set_sweep("cpu", [])


def test_plot_working_set_returns_a_figure():
    pts = [caches.WorkingSetPoint(s, b) for s, b in zip([4096, 8192, 16384, 32768], [4e9, 4e9, 1e9, 1e9])]
    steps = caches.find_steps([p.nbytes for p in pts], [p.bytes_per_s for p in pts])
    fig = caches.plot_working_set({"test": pts}, [("L1", 8192)], steps)
    assert fig.axes[0].get_xlabel().startswith("working set")


def test_fixed_cost_fit_recovers_the_l2_staircase_under_a_kernel_latency():
    # a GPU-like curve: 4 us per kernel, 6 TB/s from L2 up to 48 MiB, 4.3 TB/s from HBM beyond
    from perflab.machine.caches import (WorkingSetPoint, find_steps, fit_fixed_cost, largest_step,
                                        without_fixed_cost)

    sizes = [int(2 * 2**20 * 2 ** (k / 4)) // 4096 * 4096 for k in range(37)]
    pts = [WorkingSetPoint(s, s / (4e-6 + s / (6e12 if s <= 48 * 2**20 else 4.3e12))) for s in sizes]
    # the raw curve rises with size (latency-bound) and hides the step
    assert pts[0].bytes_per_s < 0.2 * pts[-1].bytes_per_s
    l2 = fit_fixed_cost(pts, lo=4 * 2**20, hi=30 * 2**20)
    hbm = fit_fixed_cost(pts, lo=120 * 2**20)
    assert abs(l2.fixed_s - 4e-6) < 1e-9 and abs(l2.bytes_per_s / 6e12 - 1) < 1e-6
    assert abs(hbm.bytes_per_s / 4.3e12 - 1) < 1e-6
    corrected = without_fixed_cost(pts, l2.fixed_s)
    step = largest_step(find_steps([p.nbytes for p in corrected], [p.bytes_per_s for p in corrected]))
    assert step is not None and 40 * 2**20 < step.capacity_bytes < 60 * 2**20


def test_fixed_cost_fit_rejects_too_few_points_and_flat_time():
    import pytest

    from perflab.machine.caches import WorkingSetPoint, fit_fixed_cost, without_fixed_cost

    with pytest.raises(ValueError, match="at least 2"):
        fit_fixed_cost([WorkingSetPoint(1024, 1e9)])
    flat = [WorkingSetPoint(s, s / 1e-6) for s in (1024, 2048, 4096)]
    with pytest.raises(ValueError, match="does not grow"):
        fit_fixed_cost(flat)
    with pytest.raises(ValueError, match="fixed_s"):
        without_fixed_cost(flat, -1)
    assert without_fixed_cost(flat, 2e-6) == []


def test_fixed_cost_below_zero_is_reported_as_zero():
    # t = -0.3 us + n / 5e12: a fit through points with no fixed cost, noise below zero
    pts = [caches.WorkingSetPoint(n, n / (n / 5e12 - 3e-7)) for n in (2**24, 2**25, 2**26)]
    fit = caches.fit_fixed_cost(pts)
    assert fit.fixed_s == 0.0
    assert caches.without_fixed_cost(pts, fit.fixed_s)


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
