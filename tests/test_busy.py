"""perflab.profiling.busy: chapter 4's busy fraction, exported from its page (the dozen lines
that read a trace's kernel intervals), and summarize_trace's busy time, which reuses them."""

import pytest

from perflab.profiling.busy import busy_and_gaps, busy_fraction
from perflab.profiling.trace import summarize_trace
from fake_trace import kernel_event as _kernel  # noqa: E402


def _step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts,
            "dur": dur, "pid": 1, "tid": 1, "args": {}}


def test_overlapping_intervals_count_once_and_are_clipped_to_the_window():
    # 0-10 and 5-20 overlap (20 busy, not 25); 30-40 after a gap of 10; 95-120 is clipped to 100
    busy, gaps = busy_and_gaps([(5, 20), (0, 10), (30, 40), (95, 120), (150, 160)], 0, 100)
    assert busy == pytest.approx(20 + 10 + 5)
    assert gaps == [pytest.approx(10), pytest.approx(55)]


def test_an_interval_outside_the_window_is_left_out():
    assert busy_and_gaps([(-20, -10), (100, 110)], 0, 100) == (0, [])


def test_busy_fraction_reads_the_steps_window_of_a_trace():
    events = [_step(1, 0, 100), _step(2, 100, 100),
              _kernel("a", 10, 40, 1), _kernel("b", 30, 40, 2), _kernel("c", 150, 10, 3),
              _kernel("late", 190, 50, 4)]       # runs past the steps: 10 us of it counts
    trace = {"traceEvents": events}
    assert busy_fraction(trace) == pytest.approx((60 + 10 + 10) / 200)
    assert busy_fraction(trace, "cpu_op") == 0
    # summarize_trace extends the window to the late kernel's end, and counts the same way
    s = summarize_trace(trace)
    assert s.busy_us == pytest.approx(60 + 10 + 50) and s.window_us == pytest.approx(240)
    assert s.gaps_us == (pytest.approx(80), pytest.approx(30))


def test_bad_work_or_a_trace_without_steps_is_refused_by_name():
    with pytest.raises(ValueError, match="work"):
        busy_fraction({"traceEvents": [_step(1, 0, 10)]}, "gpu")
    with pytest.raises(ValueError, match="ProfilerStep"):
        busy_fraction({"traceEvents": [_kernel("a", 0, 10, 1)]})
