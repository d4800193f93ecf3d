"""perflab.core.profiler: kernels per call, the trace readers and the interval toolkit, on CPU."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perflab.core.profiler import (covered, intersection_length, kernels_per_call, load_trace,
                                   overlap_fraction, trace_events, trace_intervals, union)


def test_eager_chain_counts_one_aten_call_per_operator():
    x = torch.randn(100)
    assert kernels_per_call(lambda t: t.cos().cos().sin(), x) == 3


def test_compiled_chain_dispatches_no_aten_compute_call_on_cpu():
    x = torch.randn(100)
    torch.compiler.reset()
    fused = torch.compile(lambda t: t.cos().cos(), fullgraph=True)
    fused(x)
    assert kernels_per_call(fused, x) == 0


def test_calls_must_be_positive():
    with pytest.raises(ValueError, match="calls"):
        kernels_per_call(lambda: None, calls=0)


def test_overlap_fraction_merges_kernels_and_checks_intervals():
    assert overlap_fraction([(0, 10)], [(0, 5), (2, 5)]) == pytest.approx(0.5)
    assert overlap_fraction([(0, 10), (20, 30)], [(5, 25)]) == pytest.approx(0.5)
    assert overlap_fraction([(0, 10)], []) == 0.0
    with pytest.raises(ValueError):
        overlap_fraction([], [(0, 1)])
    with pytest.raises(ValueError, match="ends before"):
        overlap_fraction([(5, 1)], [])


def test_trace_intervals_reads_a_chrome_trace():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)",
         "ts": 0, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
         "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3}]}
    copies, kernels = trace_intervals(trace)
    assert copies == [(0.0, 10.0)] and kernels == [(5.0, 15.0)]
    with pytest.raises(ValueError):
        trace_intervals({})


def test_union_merges_touching_and_overlapping_intervals_and_keeps_them_sorted():
    assert union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0.0, 4.0), (5.0, 6.0)]
    assert union([]) == []
    assert union([(2, 2)]) == [(2.0, 2.0)]          # an empty interval stays (no length)
    with pytest.raises(ValueError, match="ends before"):
        union([(1, 0)])


def test_covered_and_intersection_length_count_each_moment_once():
    merged = union([(0, 4), (6, 8)])
    assert covered((2, 7), merged) == 3.0           # 2..4 and 6..7
    assert covered((4, 6), merged) == 0.0
    # two kernels at once under one copy count once; two copies at once count once
    assert intersection_length([(0, 10), (0, 10)], [(2, 4), (3, 5)]) == 3.0
    assert intersection_length([(0, 1)], []) == 0.0
    assert intersection_length([(0, 10)], [(5, 15), (20, 30)]) == 5.0


def test_trace_events_reads_back_a_real_cpu_profile():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(8, 8) @ torch.randn(8, 8)
    events = trace_events(prof)
    assert any(e.get("name") == "aten::mm" for e in events)
    assert events == load_trace({"traceEvents": events})
