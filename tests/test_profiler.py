"""perflab.core.profiler: kernels per call, the trace readers and the interval toolkit, on CPU."""

import contextlib
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perflab.core import profiler
from perflab.core.profiler import (covered, intersection_length, kernels_per_call, load_trace,
                                   overlap_fraction, trace_events, trace_intervals, union)
from fake_trace import kernel_event as _kernel, op_event as _op  # noqa: E402


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




def _annotation(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {}}


def _launch(ts, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": 3, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}


def test_kernels_by_call_assigns_each_kernel_to_the_call_that_launched_it(monkeypatch):
    """Two calls, two passes, in one session: a kernel belongs to the range its launch lies in,
    found by its correlation (runtime or driver launch), or by its External id (the ATen op)."""
    events = []
    for r in range(2):
        for i in range(2):
            t0 = 1000 * (2 * r + i)
            events.append(_annotation(f"perflab_call_{r}_{i}", t0, 100))
            corr = 10 * (2 * r + i) + 1
            events.append(_launch(t0 + 10, corr, "cuda_driver" if i else "cuda_runtime"))
            k = _kernel(f"gemm_{i}", t0 + 500, 40 + i, ext=0)
            k["args"]["correlation"] = corr
            events.append(k)
        # a kernel with no launch event: placed by its ATen operator's External id
        events.append(_op("aten::mm", 1000 * (2 * r + 1) + 20, 5, 900 + r, [], []))
        extra = _kernel("reduce", 1000 * (2 * r + 1) + 600, 2, ext=900 + r)
        extra["args"]["correlation"] = 5000 + r
        events.append(extra)
    monkeypatch.setattr(profiler.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiler, "_trace_of", lambda run: events)
    windows = []      # the profiled passes are one timed window (for Telemetry)

    @contextlib.contextmanager
    def window(device=None):
        windows.append(str(device))
        yield

    monkeypatch.setattr(profiler, "timed_window", window)
    got = profiler.kernels_by_call([lambda: None, lambda: None], repeats=2)
    assert windows == ["cuda"]
    assert [[[k.name for k in call] for call in rep] for rep in got] == \
        [[["gemm_0"], ["gemm_1", "reduce"]], [["gemm_0"], ["gemm_1", "reduce"]]]
    assert got[0][1][0].duration_us == 41 and got[0][1][0].grid is None
    with pytest.raises(ValueError, match="repeats"):
        profiler.kernels_by_call([lambda: None], repeats=0)
    with pytest.raises(ValueError, match="at least one"):
        profiler.kernels_by_call([])


def test_device_activities_lists_kernels_and_copies_in_order(monkeypatch):
    events = [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 20, "dur": 7.5,
         "args": {}},
        _kernel("at::native::vectorized_elementwise_kernel", 5, 3.0, ext=1),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1, "dur": 2, "args": {}},
    ]
    monkeypatch.setattr(profiler.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiler, "_trace_of", lambda run: events)
    got = profiler.device_activities(lambda: None)
    assert got == [("kernel", "at::native::vectorized_elementwise_kernel", 3.0),
                   ("memcpy", "Memcpy DtoD (Device -> Device)", 7.5)]


def test_kernels_of_groups_one_calls_kernels_by_name_in_launch_order(monkeypatch):
    """Three profiled calls: each kernel once per call, in launch order, with its grid, block and
    mean device time; the calls ran inside the one profiled region."""
    ran = []
    events = []
    for c in range(3):
        t0 = 100 * c
        k = _kernel("gemm", t0 + 10, 30 + c, ext=c)
        k["args"].update({"grid": [4, 2, 1], "block": [128, 1, 1]})
        events += [_kernel("fill", t0 + 50, 2, ext=c), k]
    monkeypatch.setattr(profiler.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiler, "_trace_of", lambda run: (run(), events)[1])
    got = profiler.kernels_of(lambda: ran.append(1), calls=3)
    assert len(ran) == 3
    assert [k.name for k in got] == ["gemm", "fill"]
    assert got[0].grid == (4, 2, 1) and got[0].block == (128, 1, 1) and got[0].blocks_per_sm == 2.0
    assert got[0].duration_us == pytest.approx(31.0) and got[0].launches == 1.0
    monkeypatch.setattr(profiler, "_trace_of", lambda run: [])
    with pytest.raises(RuntimeError, match="no CUDA kernel"):
        profiler.kernels_of(lambda: None)


def test_external_id_reads_either_spelling():
    assert profiler.external_id({"External id": 3}) == 3
    assert profiler.external_id({"external id": 4}) == 4
    assert profiler.external_id({}) is None
