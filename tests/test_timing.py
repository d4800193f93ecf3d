import pytest
import torch

from perflab import timing


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
    from perflab.progress import progress

    items = [1, 2, 3]
    assert progress(items, "x", enabled=False) is items
    assert list(progress(items, "x")) == items
