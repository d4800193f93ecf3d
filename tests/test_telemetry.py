"""perflab.core.sampler: the sampler records what the machine exposes and says what it cannot."""

import time

import pytest
import torch

from perflab.core import sampler as T


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
