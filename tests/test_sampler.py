"""perflab.core.sampler: one sampling thread; telemetry, utilization and memory peaks record what
the machine exposes and say what it cannot."""

import time

import pytest
import torch

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


def test_cpu_summary_states_duration_and_what_is_missing():
    with T.Telemetry(interval_s=0.01) as tel:
        time.sleep(0.05)
    s = tel.summary()
    assert s.duration_s >= 0.05
    assert s.source in ("/proc/cpuinfo", "none")
    assert "power" in s.unavailable and "throttle reasons" in s.unavailable
    assert s.clock_fraction is None
    assert f"{s.duration_s:.2f} s" in s.sentence()
    d = s.as_dict()
    assert d["sentence"] == s.sentence() and isinstance(d["unavailable"], list)


def test_summary_before_the_block_ends_is_an_error():
    tel = T.Telemetry()
    with pytest.raises(RuntimeError, match="after the with-block"):
        tel.summary()


@pytest.mark.parametrize("kwargs, word", [({"interval_s": 0}, "interval_s"), ({"index": -1}, "index"),
                                          ({"device": "gpu7"}, "device")])
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ValueError, match=word):
        T.Telemetry(**kwargs)


def test_gpu_summary_from_nvml_readings(monkeypatch):
    """The NVML branch, fed recorded readings of perflab.core.nvml (Hz): median/min clock in MHz,
    reasons without 'idle'."""
    readings = iter([
        {"sm_clock_hz": 1980e6, "sm_clock_max_hz": 1980e6, "mem_clock_hz": 3201e6, "power_w": 400.0,
         "power_limit_w": 700.0, "temperature_c": 40, "clock_event_reasons": ["idle"]},
        {"sm_clock_hz": 1500e6, "sm_clock_max_hz": 1980e6, "mem_clock_hz": 3201e6, "power_w": 699.0,
         "power_limit_w": 700.0, "temperature_c": 55, "clock_event_reasons": ["software power cap"]},
        {"sm_clock_hz": 1515e6, "sm_clock_max_hz": 1980e6, "mem_clock_hz": 3201e6, "power_w": 690.0,
         "power_limit_w": 700.0, "temperature_c": 56, "clock_event_reasons": ["software power cap"]},
    ])
    last = {}

    def fake_readings(index=0, links=True):
        try:
            last["r"] = dict(next(readings))
        except StopIteration:
            pass
        return dict(last["r"])

    monkeypatch.setattr(T.nvml, "readings", fake_readings)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    tel = T.Telemetry(interval_s=10)  # the thread reads once; __exit__ reads once more
    with tel:
        time.sleep(0.01)
    s = tel.summary()
    assert s.source == "NVML" and s.device == "NVIDIA H200"
    assert s.sm_clock_mhz_max == 1980 and s.sm_clock_mhz_min in (1500, 1515)
    assert s.reasons == ("software power cap",)
    assert s.power_limit_w == 700.0 and s.temperature_c_max >= 55
    assert 0.7 < s.clock_fraction < 0.8
    assert "software power cap" in s.sentence() and "1,980" in s.sentence()


def test_measure_returns_seconds_and_telemetry():
    x = torch.ones(1000)
    m = T.measure(lambda: x * 2, "cpu", min_run_time_s=0.05)
    assert m.seconds > 0 and m.telemetry.duration_s >= m.seconds
    assert m.rate(8000) == pytest.approx(8000 / m.seconds)
    with pytest.raises(ValueError, match="work"):
        m.rate(-1)


def test_work_on_the_cpu_samples_the_cpu_even_beside_a_gpu(monkeypatch):
    """On a GPU machine, Telemetry(device="cpu") reads the CPU clock, not the idle GPU's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(T, "_gpu_reading", lambda index=0: {"sm_clock_mhz": 1980.0})
    monkeypatch.setattr(T, "_cpu_mhz", lambda: 2400.0)
    monkeypatch.setattr(T, "_cpu_reading", lambda: {"sm_clock_mhz": 2400.0, "cpu_mhz": [2400.0],
                                                    "clock_source": "cpufreq"})
    for device, source in ((None, "NVML"), ("cuda", "NVML"), ("cuda:0", "NVML"),
                           ("cpu", "/proc/cpuinfo"), (torch.device("cpu"), "/proc/cpuinfo")):
        with T.Telemetry(interval_s=10, device=device) as tel:
            pass
        assert tel._source == source, device
    s = tel.summary()
    assert s.sm_clock_mhz_median == 2400.0 and "core clock" in s.sentence()
    # measure() passes the device it benchmarks on
    seen = []
    real = T.Telemetry

    def spy(**kw):
        seen.append(kw.get("device"))
        return real(**kw)

    monkeypatch.setattr(T, "Telemetry", spy)
    monkeypatch.setattr(T, "benchmark", lambda fn, dev, min_run_time_s: 1.0)
    m = T.measure(lambda: None, "cpu")
    assert seen == [torch.device("cpu")] and m.telemetry.source == "/proc/cpuinfo"


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


def _fake_nvml(monkeypatch, power_instant_w=None):
    def fake_readings(index=0, links=True):
        return {"sm_clock_hz": 1590e6, "sm_clock_max_hz": 1980e6, "mem_clock_hz": 3201e6,
                "power_w": 197.0, "power_instant_w": power_instant_w, "power_limit_w": 700.0,
                "temperature_c": 50, "clock_event_reasons": ["software power cap"]}

    monkeypatch.setattr(T.nvml, "readings", fake_readings)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")


@pytest.mark.parametrize("instant, kind, words", [
    (None, "1 s average", "one-second average"), (612.0, "instantaneous", "(instantaneous)")])
def test_power_is_stated_as_what_nvml_gives(monkeypatch, instant, kind, words):
    """The instantaneous field where the driver has it, else the one-second average, named."""
    _fake_nvml(monkeypatch, instant)
    with T.Telemetry(interval_s=10) as tel:
        pass
    s = tel.summary()
    assert s.power_kind == kind and words in s.sentence()
    assert s.power_w_max == (instant if instant is not None else 197.0)


def test_an_sm_clock_is_stated_only_for_sm_work(monkeypatch):
    _fake_nvml(monkeypatch, 600.0)
    sentences = {}
    for work in ("sm", "memory", "link"):
        with T.Telemetry(interval_s=10, work=work) as tel:
            pass
        sentences[work] = tel.summary().sentence()
        assert tel.summary().sm_clock_hz == pytest.approx(1590e6)
    assert "SM clock median 1,590" in sentences["sm"] and "software power cap" in sentences["sm"]
    assert "memory clock (3,201 MHz)" in sentences["memory"]
    assert "SM clock median" not in sentences["memory"] + sentences["link"]
    assert "no GPU clock" in sentences["link"] and "power cap" not in sentences["link"]
    with pytest.raises(ValueError, match="work"):
        T.Telemetry(work="disk")


@pytest.mark.parametrize("source, values, readable", [
    ("/proc/cpuinfo", [2596.1, 2596.1, 2596.1], False),   # a VM's constant nominal figure
    ("/proc/cpuinfo", [2596.1, 3100.0], True),
    ("cpufreq", [2400.0, 2400.0], True)])
def test_a_constant_cpuinfo_clock_is_said_to_be_unreadable(monkeypatch, source, values, readable):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(T, "_cpu_reading", lambda: {"sm_clock_mhz": values[0], "cpu_mhz": values,
                                                    "clock_source": source})
    with T.Telemetry(interval_s=10) as tel:
        pass
    s = tel.summary()
    assert s.cpu_clock_readable is readable
    assert ("cannot be read" in s.sentence()) is (not readable)
