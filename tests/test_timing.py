import pytest
import torch

from perflab.core import timing


def test_event_timer_on_cpu_returns_one_sample_per_rep_after_warmup():
    calls = []
    t = timing.event_timer(lambda: calls.append(1), "cpu", warmup=2, reps=5)
    assert len(calls) == 7
    assert len(t.samples_s) == 5
    assert t.method == "perf_counter"
    assert t.min_s <= t.median_s


def test_event_timer_sees_a_sleep():
    import time

    t = timing.event_timer(lambda: time.sleep(0.002), "cpu", warmup=0, reps=3)
    assert t.median_s >= 0.002


@pytest.mark.parametrize("kwargs, word", [(dict(warmup=-1), "warmup"), (dict(reps=0), "reps")])
def test_event_timer_rejects_bad_counts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        timing.event_timer(lambda: None, "cpu", **kwargs)


def test_timing_statistics():
    t = timing.Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    assert t.median_s == 3.0
    assert t.iqr_s > 0
    assert timing.Timing((1.0,)).iqr_s == 0.0


def test_benchmark_on_cpu_uses_torch_utils_benchmark_and_agrees_with_a_sleep():
    import time

    s = timing.benchmark(lambda: time.sleep(0.001), "cpu", min_run_time_s=0.05)
    assert 0.001 <= s < 0.05
    with pytest.raises(ValueError, match="min_run_time_s"):
        timing.benchmark(lambda: None, "cpu", min_run_time_s=0)


def test_flush_and_synchronize_are_noops_on_cpu():
    timing.flush_l2("cpu")
    timing.synchronize("cpu")


def test_progress_is_a_pass_through_when_disabled_and_yields_every_item_when_enabled():
    from perflab.core.progress import progress

    items = [1, 2, 3]
    assert progress(items, "x", enabled=False) is items
    assert list(progress(items, "x")) == items


def test_hot_and_cold_on_cpu_calls_fn_and_reports_per_call_times():
    calls = []
    out = torch.empty(1024)
    x = torch.randn(1024)

    def fn():
        calls.append(1)
        return torch.mul(x, 2, out=out)

    r = timing.hot_and_cold(fn, "cpu", calls=4, reps=2, flush_bytes=2**16)
    assert len(calls) == 1 + 4 + 4  # one warm-up, four hot, four cold
    assert r.hot_s > 0 and r.cold_s > 0
    assert r.flush_s is None  # the flush is not timed on a CPU
    assert r.calls == 4 and r.flush_bytes == 2**16
    assert "perf_counter" in r.method
    assert torch.equal(out, x * 2)


@pytest.mark.parametrize("kw", [dict(calls=0), dict(reps=0), dict(flush_bytes=0),
                                dict(calls=2.5)])
def test_hot_and_cold_rejects_bad_arguments(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        timing.hot_and_cold(lambda: None, "cpu", **kw)


def test_order_effect_separates_drift_from_the_timer():
    # A first then last: A/B flips from below to above 1 -> whoever ran later was slower
    assert timing.order_effect((1.00, 1.04), (1.05, 1.01)) == "later slower"
    assert timing.order_effect((1.05, 1.00), (1.00, 1.05)) == "earlier slower"
    # A/B on the same side both times -> the timer, not the order
    assert timing.order_effect((1.05, 1.00), (1.06, 1.00)) == "a slower"
    assert timing.order_effect((0.95, 1.00), (0.96, 1.00)) == "b slower"
    assert timing.order_effect((1.001, 1.0), (0.999, 1.0)) == "same"
    assert timing.order_effect((1.05, 1.0), (1.0, 1.0)) == "same"
    with pytest.raises(ValueError, match="first"):
        timing.order_effect((0.0, 1.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="tolerance"):
        timing.order_effect((1.0, 1.0), (1.0, 1.0), tolerance=-1)


def test_paired_ratio_is_the_median_of_back_to_back_pairs(monkeypatch):
    """With a fake clock (base costs 3 ticks a call, candidate 1, one pair disturbed by a burst
    of 100 ticks), the ratio is 3: the burst moves one pair, not the median."""
    from perflab.core import timing

    clock = {"t": 0.0, "calls": 0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])

    def base():
        clock["calls"] += 1
        clock["t"] += 3e-3 + (0.1 if clock["calls"] == 12 else 0.0)

    def candidate():
        clock["t"] += 1e-3

    ratio, pairs = timing.paired_ratio(base, candidate, "cpu", pairs=5, block_s=0.01)
    assert ratio == pytest.approx(3.0) and len(pairs) == 5
    assert max(pairs) > 3.5             # the disturbed pair, outvoted
    with pytest.raises(ValueError, match="pairs"):
        timing.paired_ratio(base, candidate, pairs=0)
    with pytest.raises(ValueError, match="block_s"):
        timing.paired_ratio(base, candidate, block_s=0)


def test_paired_ratio_times_with_the_threads_asked_and_restores_them():
    import torch

    from perflab.core import timing

    before = torch.get_num_threads()
    seen = []
    timing.paired_ratio(lambda: seen.append(torch.get_num_threads()), lambda: None, "cpu",
                        pairs=1, block_s=1e-9, cpu_threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="cpu_threads"):
        timing.paired_ratio(lambda: None, lambda: None, cpu_threads=0)
