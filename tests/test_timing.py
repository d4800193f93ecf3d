import contextlib
import inspect
from pathlib import Path

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


def test_event_timer_times_each_call_on_the_cpu_clock(monkeypatch):
    clock = FakeClock(monkeypatch)
    costs = iter([9.0, 0.002, 0.003, 0.001])          # the warm-up call is slow and not counted
    t = timing.event_timer(lambda: clock.advance(next(costs)), "cpu", warmup=1, reps=3)
    assert t.samples_s == pytest.approx((0.002, 0.003, 0.001)) and t.median_s == pytest.approx(0.002)


@pytest.mark.parametrize("kwargs, word", [(dict(warmup=-1), "warmup"), (dict(reps=0), "reps")])
def test_event_timer_rejects_bad_counts(kwargs, word):
    with pytest.raises(ValueError, match=word):
        timing.event_timer(lambda: None, "cpu", **kwargs)


def test_timing_statistics():
    t = timing.Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    assert t.median_s == 3.0
    assert t.iqr_s > 0
    assert timing.Timing((1.0,)).iqr_s == 0.0


def test_benchmark_on_cpu_is_torch_utils_benchmarks_median_after_one_warm_up(monkeypatch):
    """torch.utils.benchmark is faked: what is tested is how benchmark() drives it (the
    function warmed up once, the Timer given it and torch's thread count, blocked_autorange's
    median returned), not how long anything takes."""
    seen = {}

    class FakeTimer:
        def __init__(self, stmt, globals, num_threads):
            seen.update(stmt=stmt, fn=globals["fn"], threads=num_threads)

        def blocked_autorange(self, min_run_time):
            seen["min_run_time"] = min_run_time
            return type("Measurement", (), {"median": 0.125})()

    monkeypatch.setattr(timing.tub, "Timer", FakeTimer)
    calls = []
    work = lambda: calls.append(1)  # noqa: E731
    assert timing.benchmark(work, "cpu", min_run_time_s=0.05) == 0.125
    assert calls == [1] and seen["fn"] is work and seen["stmt"] == "fn()"
    assert seen["min_run_time"] == 0.05 and seen["threads"] == torch.get_num_threads()
    with pytest.raises(ValueError, match="min_run_time_s"):
        timing.benchmark(lambda: None, "cpu", min_run_time_s=0)


def test_benchmark_on_cuda_runs_do_bench_until_the_window_is_long_enough(monkeypatch):
    """A do_bench whose repetitions overshoot (here each run lasts 0.1 s of a requested 0.3 s)
    left a window too short to read a clock: benchmark runs it again until the timed window has
    lasted min_run_time_s and returns the median of its medians. The clock is faked."""
    import sys
    import types
    now = [0.0]
    medians = iter([2.0, 4.0, 3.0, 9.0, 9.0])
    reps = []

    def do_bench(fn, warmup, rep, return_mode):
        reps.append(rep)
        now[0] += 0.1
        return next(medians)

    fake = types.ModuleType("triton.testing")
    fake.do_bench = do_bench
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.testing", fake)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(timing, "synchronize", lambda dev=None: None)
    opened = []
    stop = timing.window_listener(opened.append)
    try:
        got = timing.benchmark(lambda: None, "cuda", min_run_time_s=0.3)
    finally:
        stop()
    assert len(reps) == 3 and got == pytest.approx(3.0e-3)      # median of 2, 4, 3 ms
    assert reps[0] == 300 and opened == ["open", "close"]       # one window around all three


def test_flush_and_synchronize_are_noops_on_cpu(monkeypatch):
    def no_cuda(*args):
        raise AssertionError("a CPU device reached torch.cuda.synchronize")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    timing.flush_l2("cpu")
    timing.synchronize("cpu")
    timing.synchronize(torch.device("cpu"))
    assert timing._L2_FLUSH == {}                 # no flush buffer allocated for a CPU


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


class FakeClock:
    """time.perf_counter / time.time / time.monotonic that move only when work advances them."""

    def __init__(self, monkeypatch, start=1000.0):
        self.t = start
        for name in ("perf_counter", "time", "monotonic"):
            monkeypatch.setattr(timing.time, name, lambda: self.t)

    def work(self, seconds):
        return lambda: self.advance(seconds)

    def advance(self, seconds):
        self.t += seconds


def test_stopwatch_reads_elapsed_time_and_its_block(monkeypatch):
    clock = FakeClock(monkeypatch)
    with timing.Stopwatch("cpu") as sw:
        clock.advance(0.25)
        assert sw.elapsed() == pytest.approx(0.25)
        clock.advance(0.5)
    assert sw.seconds == pytest.approx(0.75)
    with pytest.raises(RuntimeError, match="before start"):
        timing.Stopwatch().elapsed()
    with pytest.raises(ValueError, match="device"):
        timing.Stopwatch("gpu7")


def test_seconds_per_call_and_best_of_divide_by_the_calls(monkeypatch):
    clock = FakeClock(monkeypatch)
    costs = iter([3.0, 1.0, 2.0] * 4)
    assert timing.seconds_per_call(clock.work(0.2), calls=4, device="cpu") == pytest.approx(0.2)
    # blocks of two calls cost (3 + 1), (2 + 3), (1 + 2): the best is 1.5 s a call
    assert timing.best_of(lambda: clock.advance(next(costs)), repeats=3, calls=2) == pytest.approx(1.5)
    for bad in ({"calls": 0}, {"repeats": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            timing.best_of(clock.work(1), **bad)


def test_deadline_and_timestamps(monkeypatch):
    clock = FakeClock(monkeypatch)
    d = timing.Deadline(10)
    clock.advance(9)
    assert not d.expired() and d.left_s() == pytest.approx(1)
    clock.advance(2)
    assert d.expired()
    then = timing.timestamp()
    clock.advance(4)
    assert timing.seconds_since(then) == pytest.approx(4)
    with pytest.raises(ValueError, match="seconds"):
        timing.Deadline(0)
    with pytest.raises(ValueError, match="moment"):
        timing.seconds_since(float("nan"))


def test_event_timer_inside_a_callers_window_reads_its_events_after_a_synchronize(
        monkeypatch):
    # a window nested in a caller's window does not synchronize as it closes; reading a CUDA
    # event the GPU has not reached raises (burst_and_sustained on the H100, 5 December).
    # Fake events that raise like CUDA's prove event_timer synchronizes itself.
    from perflab.core import timing

    state = {"synced": True}

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            state["synced"] = False

        def elapsed_time(self, other):
            if not state["synced"]:
                raise RuntimeError("Both events must be completed before calculating "
                                   "elapsed time.")
            return 3.0

    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing, "synchronize", lambda dev=None: state.update(synced=True))
    with timing.timed_window():
        t = timing.event_timer(lambda: None, "cuda", warmup=0, reps=2)
    assert t.samples_s == (0.003, 0.003)


def test_event_timer_behind_queues_its_first_event_behind_earlier_work(monkeypatch):
    """By default the outermost window synchronizes before the first start event (the call
    starts on an idle device); with behind=True it does not, so a probe queued behind earlier
    work (cycle_clock_behind's spin) starts the moment that work ends. Until 6 December the
    probe called event_timer without it, and the synchronize put an idle gap between the work
    and the spin the page said ran right behind it."""
    from perflab.core import timing

    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("record")

        def elapsed_time(self, other):
            return 1.0

    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing, "synchronize", lambda dev=None: log.append("sync"))
    timing.event_timer(lambda: log.append("fn"), "cuda", warmup=0, reps=1)
    assert log[0] == "sync" and log[1:4] == ["record", "fn", "record"]
    log.clear()
    timing.event_timer(lambda: log.append("fn"), "cuda", warmup=0, reps=1, behind=True)
    assert log[:3] == ["record", "fn", "record"] and log[-1] == "sync"


def _excerpt_lines(page, after):
    """The code lines (comments and blank lines dropped, stripped) of the first ```python block
    after the sentence ``after`` in ``page``."""
    text = page.read_text()
    block = text[text.index(after):]
    block = block[block.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    return [line.split("#")[0].strip() for line in block.splitlines()
            if line.split("#")[0].strip()]


def _in_order(needles, haystack):
    """Whether every line of ``needles`` is a line of ``haystack``, in the same order."""
    rest = iter(haystack)
    return all(any(n == h for h in rest) for n in needles)


def test_chapter_4_shows_event_timer_as_the_package_has_it():
    """Chapter 4 shows event_timer's core as an excerpt (the clock rule keeps the function in
    core/timing.py, so the page cannot export it): every line of the excerpt is a line of the
    function, in its order, so the page cannot teach code the package no longer runs."""
    page = Path(__file__).resolve().parent.parent / "book" / "04_measuring_and_profiling.md"
    shown = _excerpt_lines(page, "Our `event_timer` is short enough to read whole")
    source = [line.split("#")[0].strip() for line in
              inspect.getsource(timing.event_timer).splitlines()]
    assert len(shown) >= 10
    missing = [line for line in shown if line not in source]
    assert not missing, f"chapter 4's excerpt of event_timer has lines it lacks: {missing}"
    assert _in_order(shown, source), "chapter 4's excerpt of event_timer is out of its order"
    assert not _in_order(shown[::-1], source)   # the order check can fail
