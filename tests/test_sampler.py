"""perflab.core.sampler: one sampling thread; utilization and memory peaks record what the
machine exposes and say what it cannot."""

import time

import pytest

from perflab.core import sampler as T
from perflab.core.device import has_gpu


def test_sampler_keeps_timed_readings_skips_none_and_reads_once_more_at_the_end():
    calls = []

    def read():
        calls.append(len(calls))
        return None if len(calls) == 2 else len(calls)

    with T.Sampler(read, interval_s=0.01) as s:
        time.sleep(0.06)
    values = [v for _, v in s.samples]
    assert 2 not in values and values == sorted(values) and values[-1] == len(calls)
    times = [t for t, _ in s.samples]
    assert times == sorted(times) and times[-1] >= s.duration_s >= 0.06
    assert len(calls) >= 3                       # several thread readings plus the last one
    with pytest.raises(ValueError, match="interval_s"):
        T.Sampler(read, interval_s=0)


def test_memory_peak_is_the_largest_rise_over_the_start(monkeypatch):
    used = {0: iter([100, 150, 400, 120, 120]), 1: iter([50, 900, 60, 60, 60])}
    monkeypatch.setattr(T.nvml, "device_count", lambda: 2)
    monkeypatch.setattr(T.nvml, "memory_used_bytes", lambda i: next(used[i], 120 if i == 0 else 60))
    with T.MemoryPeak(interval_s=0.005) as m:
        time.sleep(0.05)
    assert m.peak == 850                          # GPU 1: 900 - 50, the larger of the two rises


def test_memory_peak_without_nvml_is_none(monkeypatch):
    monkeypatch.setattr(T.nvml, "device_count", lambda: 0)
    with T.MemoryPeak() as m:
        pass
    assert m.peak is None and m.samples == []


def test_cpu_state_reads_cores_and_load():
    state = T.cpu_state()
    assert state["cores"] >= 1
    assert state["governor"] is None or isinstance(state["governor"], str)
    assert state["cur_mhz"] is None or all(f > 0 for f in state["cur_mhz"])


def test_machine_state_has_both_parts():
    state = T.machine_state()
    assert set(state) == {"gpu", "cpu"}
    if not has_gpu():
        assert state["gpu"] is None
    with pytest.raises(ValueError, match="index"):
        T.machine_state(-1)


@pytest.mark.skipif(has_gpu(), reason="checks the message on a machine without NVML")
def test_utilization_sampler_needs_nvml():
    with pytest.raises(RuntimeError, match="NVML"):
        with T.UtilizationSampler():
            pass


def test_utilization_sampler_arguments_and_values():
    with pytest.raises(ValueError, match="interval_s"):
        T.UtilizationSampler(interval_s=0)
    sampler = T.UtilizationSampler()
    sampler.samples.extend([(0.0, 90), (0.5, 95), (1.2, 40), (1.5, 60)])
    assert sampler.values(skip_s=1.0) == [40, 60]
    assert sampler.median_pct == 50
    empty = T.UtilizationSampler()
    with pytest.raises(ValueError, match="readings"):
        empty.median_pct
