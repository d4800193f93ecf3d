import math

import pytest
import torch

from perflab.machine import gpu, waves
from perflab.core.device import has_gpu

cpu_only = pytest.mark.skipif(has_gpu(), reason="checks the behaviour on a machine without a GPU")


def test_dram_bandwidth_from_clock_matches_the_h100_datasheet():
    assert gpu.dram_bandwidth_from_clock(5120, 2619e6) == pytest.approx(3.35e12, rel=0.01)
    with pytest.raises(ValueError, match="bus_width_bits"):
        gpu.dram_bandwidth_from_clock(0, 1e9)


def test_matmul_rates_on_cpu_cover_fp32_and_bf16():
    assert gpu.available_matmul_kinds("cpu") == ["fp32", "bf16"]
    rates, errors = gpu.matmul_rates("cpu", 64)
    assert set(rates) == {"fp32", "bf16"} and errors == {}
    assert all(math.isfinite(r) and r > 0 for r in rates.values())


def test_matmul_rate_rejects_unknown_and_gpu_only_formats_on_cpu():
    from perflab.machine import roofline

    with pytest.raises(ValueError, match="precision"):
        roofline.matmul_rate("cpu", 64, "int4")
    with pytest.raises(ValueError, match="tf32"):
        roofline.matmul_rate("cpu", 64, "tf32")
    with pytest.raises(RuntimeError, match="CUDA"):
        roofline.fp8_matmul_rate("cpu", 64)


def test_matmul_rates_reports_an_fp8_failure_instead_of_stopping(monkeypatch):
    def broken(device, n):
        raise RuntimeError("no fp8 kernel for this architecture\nsecond line")

    runs = []

    def rate(d, n, k, min_run_time_s):
        runs.append(min_run_time_s)
        return broken(d, n) if k == "fp8" else 1.0

    monkeypatch.setattr(gpu, "matmul_rate", rate)
    rates, errors = gpu.matmul_rates("cpu", 64, ["fp32", "fp8"], min_run_time_s=0.5)
    assert rates == {"fp32": 1.0} and runs == [0.5, 0.5]
    assert errors == {"fp8": "RuntimeError: no fp8 kernel for this architecture"}


@cpu_only
def test_gpu_only_functions_say_so_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gpu.properties()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        waves.wave_sweep("cpu", 128, 128, [128])
    from perflab.core import nvml

    assert nvml.readings() is None


@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU")
def test_properties_on_a_gpu():
    p = gpu.properties(0)
    assert p["sm_count"] > 0 and p["warp_size"] == 32
    assert p["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory


def test_replay_sweep_times_every_size_in_interleaved_rounds_on_cpu():
    from perflab.core.rounds import Spread
    from perflab.machine import replay

    times = replay.replay_sweep([2**16, 2**18], "cpu", rounds=3, target_s=1e-6)
    assert list(times) == [8192, 2**16, 2**18]           # the tiny working set first
    assert all(isinstance(t, Spread) and t.n == 3 and t.median > 0 for t in times.values())
    run = replay.replayed(replay.copy_probe(2**16, "cpu"), 4, "cpu")
    assert len(run()) == 4                              # on a CPU: a loop of the calls
    probe = replay.copy_probe(2**16, "cpu")
    assert probe().numel() == 2**16 // 8 and float(probe()[0]) == 2.0   # half the set, x 2


def test_a_replayed_graph_keeps_the_buffers_it_was_captured_on(monkeypatch):
    """A CUDA graph records addresses, not tensors: the callable `replayed` returns must hold the
    captured function (and the buffers it closes over) for as long as it lives. Without that the
    5 December H200 run's L2 sweep freed each size's buffers after its capture and replayed into
    reused memory ("an illegal memory access"). The graph machinery is faked on this CPU."""
    import gc
    import weakref
    from perflab.machine import replay

    class Graph:
        def replay(self):
            pass

    class Ctx:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", Ctx)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Ctx)
    probe = replay.copy_probe(64, "cpu")        # its buffers live in its closure
    alive = weakref.ref(probe.__closure__[0].cell_contents)
    run = replay.replayed(probe, 3, "cuda")
    del probe
    gc.collect()
    assert alive() is not None, "the replay no longer holds the tensors its graph writes"
    run()
    del run
    gc.collect()
    assert alive() is None


def test_burst_and_sustained_times_both_under_telemetry_on_cpu():
    r = gpu.burst_and_sustained("cpu", 64, dtype=torch.float32, burst_reps=3,
                                sustained_s=0.05, rest_s=0)
    assert r.flops == 2 * 64**3
    assert r.burst_rate > 0 and r.sustained_rate > 0
    assert r.sustained_window_s >= 0.05
    # the telemetry of the sustained rate: one window, the second half the rate comes from
    # (not the chunks' own windows without the moments between them, nor the settling half)
    assert r.burst.duration_s > 0 and r.sustained.windows == 1
    assert 0.025 <= r.sustained.duration_s <= r.sustained_window_s - 0.025
    assert r.burst_cycle_hz is None and r.sustained_cycle_hz is None   # no SM to count on a CPU
    assert r.burst_counted_hz is None and r.sustained_counted_hz is None
    with pytest.raises(ValueError, match="sustained_s"):
        gpu.burst_and_sustained("cpu", 8, sustained_s=0)
    with pytest.raises(ValueError, match="rest_s"):
        gpu.burst_and_sustained("cpu", 8, rest_s=-1)


def test_clocked_burst_counts_the_clock_between_the_products(monkeypatch):
    """Work, short spin, work, long spin, ... in one event-timed window, no synchronize inside:
    the clock is the spins' difference in cycles over their difference in time, which cancels
    the start-up each spin's events hold beyond its cycles. Spins of 50,000 and 150,000 cycles
    at 1.5 GHz with 3 µs of start-up each read 1.5 GHz, where 50,000 over its own time reads
    1.42 GHz (chapter 4's clock check, runs 2026-12-07c and 07d)."""
    log, f, o = [], 1.5e9, 3e-6

    def fake_timer(fn, dev, warmup, reps, behind=False):
        assert warmup == 0 and dev.type == "cuda" and not behind
        out = []
        for _ in range(reps):
            fn()
            last = log[-1]
            out.append(1.4e-3 if last == "work" else int(last.split()[1]) / f + o)
        return type("T", (), {"samples_s": tuple(out)})()

    monkeypatch.setattr(gpu, "event_timer", fake_timer)
    monkeypatch.setattr(gpu.torch.cuda, "_sleep", lambda c: log.append(f"spin {c}"))
    b = gpu.clocked_burst(lambda: log.append("work"), "cuda", pairs=3, warmup=2)
    assert log == ["work"] * 2 + ["work", "spin 50000", "work", "spin 150000"] * 3
    assert b.work_s == (1.4e-3,) * 6 and len(b.short_s) == len(b.long_s) == 3
    assert b.median_s == pytest.approx(1.4e-3)
    assert b.clock_hz == pytest.approx(f) and b.offset_s == pytest.approx(o)
    assert 50_000 / b.short_s[0] < 0.95 * f            # one spin alone reads low
    both = b + b
    assert len(both.work_s) == 12 and both.clock_hz == pytest.approx(f)
    with pytest.raises(ValueError, match="spins"):
        b + gpu.ClockedBurst(b.work_s, b.short_s, b.long_s, (1, 2))
    with pytest.raises(ValueError, match="no clock"):
        gpu.ClockedBurst((1.0,), (2e-5,), (2e-5,), (50_000, 150_000)).clock_hz
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu.clocked_burst(lambda: None, "cpu")
    with pytest.raises(ValueError, match="short < long"):
        gpu.clocked_burst(lambda: None, "cuda", cycles=(150_000, 50_000))
    with pytest.raises(ValueError, match="pairs"):
        gpu.clocked_burst(lambda: None, "cuda", pairs=0)


def test_fact_rows_write_units_not_python_reprs():
    rows = dict(gpu.fact_rows({
        "name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "l2_bytes": 52428800,
        "memory_bytes": 85017493504, "shared_memory_per_sm": 233472,
        "sm_clock_hz": 1980000000.0, "memory_bus_width_bits": 5120, "power_w": 123.56,
        "temperature_c": 38, "pstate": 0, "utilization_pct": 0,
        "clock_event_reasons": [], "nvlinks_active": None}))
    assert rows["l2 size"] == "50 MiB" and rows["memory size"] == "79.2 GiB"
    assert rows["shared memory per sm"] == "228 KiB" and rows["sm count"] == "132"
    assert rows["sm clock"] == "1,980 MHz" and rows["memory bus width"] == "5,120 bits"
    assert rows["power"] == "124 W" and rows["temperature"] == "38 °C"
    assert rows["pstate"] == "P0" and rows["utilization"] == "0 %"
    assert rows["clock event reasons"] == "none" and rows["nvlinks active"] == "not reported"
    assert dict(gpu.fact_rows({"clock_event_reasons": ["sw power cap"]})) == {
        "clock event reasons": "sw power cap"}
    for value in rows.values():
        assert "[" not in value and "None" not in value and "e+" not in value
    with pytest.raises(ValueError, match="facts"):
        gpu.fact_rows([("sm_count", 132)])


def test_cycle_clock_is_the_cycles_over_the_event_timed_seconds(monkeypatch):
    """A kernel that spins 200,000 cycles and took 125 µs by the events ran at 1.6 GHz,
    whatever NVML sampled; the median of the reps, not the first."""
    seen = {}

    def fake_timer(fn, dev, warmup, reps):
        seen.update(dev=dev, warmup=warmup, reps=reps)
        return type("T", (), {"median_s": 125e-6})()

    monkeypatch.setattr(gpu, "event_timer", fake_timer)
    assert gpu.cycle_clock_hz("cuda", cycles=200_000) == pytest.approx(1.6e9)
    assert seen["reps"] == 3 and seen["warmup"] == 0 and seen["dev"].type == "cuda"
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu.cycle_clock_hz("cpu")
    with pytest.raises(ValueError, match="cycles"):
        gpu.cycle_clock_hz("cuda", cycles=0)


def test_cycle_clock_behind_queues_each_spin_right_behind_the_work(monkeypatch):
    """Work, then a spin timed by events with no warm-up (no synchronize before its start
    event), three times: the spins read the clock the work ran at. Spins of 400,000 cycles that
    took 250, 200 and 320 µs by their events ran at the median's 1.6 GHz."""
    log, took = [], iter([250e-6, 200e-6, 320e-6])

    def fake_timer(fn, dev, warmup, reps, behind=False):
        assert warmup == 0 and reps == 1 and dev.type == "cuda" and behind
        fn()
        log.append("timed")
        return type("T", (), {"median_s": next(took)})()

    monkeypatch.setattr(gpu, "event_timer", fake_timer)
    monkeypatch.setattr(gpu.torch.cuda, "_sleep", lambda c: log.append(f"spin {c}"))
    hz = gpu.cycle_clock_behind(lambda: log.append("work"), "cuda", cycles=400_000)
    assert hz == pytest.approx(400_000 / 250e-6)
    assert log == ["work", "spin 400000", "timed"] * 3
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu.cycle_clock_behind(lambda: None, "cpu")
    with pytest.raises(ValueError, match="reps"):
        gpu.cycle_clock_behind(lambda: None, "cuda", reps=0)
