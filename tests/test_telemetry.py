"""perflab.core.telemetry: clocks, power and throttle reasons read inside a measurement's timed
window, and sentences that say what they cover."""

import time

import pytest
import torch

from perflab.core import telemetry as T
from perflab.core.timing import event_timer, seconds_per_call, timed_window


def _gpu(monkeypatch, readings):
    """Feed Telemetry's NVML branch from ``readings()`` (perflab.core.nvml's units: Hz, W)."""
    monkeypatch.setattr(T.nvml, "readings", lambda index=0, links=True: readings())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def _reading(sm_mhz=1590.0, power_w=197.0, instant=None, reasons=("software power cap",)):
    return {"sm_clock_hz": sm_mhz * 1e6, "sm_clock_max_hz": 1980e6, "mem_clock_hz": 3201e6,
            "power_w": power_w, "power_instant_w": instant, "power_limit_w": 700.0,
            "temperature_c": 50, "clock_event_reasons": list(reasons)}


def _steady(monkeypatch, **kw):
    _gpu(monkeypatch, lambda: _reading(**kw))


def _busy(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.001)


def test_cpu_summary_states_duration_and_what_is_missing():
    with T.Telemetry(interval_s=0.005) as tel:
        time.sleep(0.05)
    s = tel.summary()
    assert s.duration_s >= 0.05 and s.scope == "whole block"
    assert s.source in ("/proc/cpuinfo", "none")
    assert "power" in s.unavailable and "throttle reasons" in s.unavailable
    assert s.clock_fraction is None
    assert f"{s.duration_s:.2f} s" in s.sentence() and "whole" in s.sentence()
    d = s.as_dict()
    assert d["sentence"] == s.sentence() and isinstance(d["unavailable"], list)


def test_summary_before_the_block_ends_is_an_error():
    tel = T.Telemetry()
    with pytest.raises(RuntimeError, match="after the with-block"):
        tel.summary()


@pytest.mark.parametrize("kwargs, word", [({"interval_s": 0}, "interval_s"), ({"index": -1}, "index"),
                                          ({"device": "gpu7"}, "device"), ({"work": "disk"}, "work")])
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ValueError, match=word):
        T.Telemetry(**kwargs)


def test_only_readings_inside_the_timed_window_count(monkeypatch):
    """Idle readings before and after the timed repetitions (here 1,980 MHz at 120 W) must not
    caption work that ran at 1,500 MHz and 690 W: the old sampler mixed them."""
    state = {"busy": False}
    _gpu(monkeypatch, lambda: _reading(1500.0, 690.0) if state["busy"]
         else _reading(1980.0, 120.0, reasons=("idle",)))
    with T.Telemetry(interval_s=0.002) as tel:
        _busy(0.05)                                   # set-up and warm-up: idle readings
        with tel.window():
            state["busy"] = True
            _busy(0.05)
            state["busy"] = False
        _busy(0.05)                                   # after the work
    s = tel.summary()
    assert s.scope == "timed window" and s.windows == 1
    assert s.sm_clock_mhz_median == s.sm_clock_mhz_highest == 1500.0
    assert s.reasons == ("software power cap",)
    assert s.power_w_max is None and s.power_short   # 0.05 s: shorter than power's 1 s
    assert 0.04 < s.duration_s < 0.1                 # the window, not the 0.15 s block
    assert "timed window" in s.sentence() and "1,980" in s.sentence()   # chip max only
    assert "1,500 MHz" in s.sentence()


def test_a_window_with_too_few_readings_reads_no_clock(monkeypatch):
    _steady(monkeypatch, sm_mhz=1980.0)
    with T.Telemetry(interval_s=0.05) as tel:
        _busy(0.12)
        with tel.window():
            pass                                     # a burst far shorter than one interval
        _busy(0.12)
    s = tel.summary()
    assert s.too_short and s.samples < T.MIN_SAMPLES
    assert s.sm_clock_hz is None and s.sm_clock_mhz_median is None and s.power_w_max is None
    assert "too short to read a clock" in s.sentence() and "50 ms" in s.sentence()
    assert "1,980 MHz" not in s.sentence().replace("chip max 1,980", "")


def test_timing_primitives_mark_their_own_windows(monkeypatch):
    """event_timer, seconds_per_call (and benchmark, hot_and_cold, paired_ratio) open a window
    around their timed repetitions; nested windows count once."""
    with T.Telemetry(interval_s=0.01, device="cpu") as tel:
        time.sleep(0.03)                             # before: not timed
        event_timer(lambda: time.sleep(0.002), "cpu", warmup=2, reps=3)
        with timed_window():
            seconds_per_call(lambda: time.sleep(0.002), calls=2)   # nested: one window
    assert len(tel.windows) == 2
    (a0, a1), (b0, b1) = tel.windows
    assert 0.025 < a0 and a1 - a0 >= 0.006 and b0 >= a1 and b1 - b0 >= 0.004
    # a window opened outside any Telemetry block is heard by nobody and harms nothing
    with timed_window():
        pass


def test_clock_range_and_median_are_stated(monkeypatch):
    clocks = iter([1980.0, 1575.0, 1590.0, 1605.0] * 100)
    _gpu(monkeypatch, lambda: _reading(next(clocks)))
    with T.Telemetry(interval_s=0.002) as tel:
        with tel.window():
            _busy(0.05)
    s = tel.summary()
    assert s.sm_clock_mhz_min == 1575.0 and s.sm_clock_mhz_highest == 1980.0
    assert "time-weighted over the window, readings 1,575–1,980 MHz" in s.sentence()
    assert s.sm_clock_hz == pytest.approx(s.sm_clock_mhz_weighted * 1e6)
    assert 1575.0 < s.sm_clock_mhz_weighted < 1980.0


def test_measure_returns_seconds_and_telemetry_of_its_window():
    x = torch.ones(1000)
    m = T.measure(lambda: x * 2, "cpu", min_run_time_s=0.05)
    assert m.seconds > 0 and m.telemetry.scope == "timed window"
    assert m.telemetry.duration_s >= 0.04            # blocked_autorange's window
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
    with T.Telemetry(interval_s=0.002, device="cpu") as tel:
        time.sleep(0.02)
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


@pytest.mark.parametrize("instant, kind, words", [
    (None, "1 s average", "one-second average"), (612.0, "instantaneous", ", instantaneous)"),
    (745.0, "instantaneous", "one may exceed the 700 W limit")])
def test_power_is_stated_as_what_nvml_gives(monkeypatch, instant, kind, words):
    """The instantaneous field where the driver has it, else the one-second average, named; an
    instantaneous reading above the limit is explained, not left as a contradiction."""
    trace = [{**T._gpu_reading_from(_reading(instant=instant)), "t": 0.1 * i}
             for i in range(16)]
    s = T.summarize(trace, [(0.05, 1.45)], source="NVML", interval_s=0.1, block_s=1.6,
                    device="NVIDIA H200")
    assert s.power_kind == kind and words in s.sentence() and not s.power_short
    assert s.power_w_max == (instant if instant is not None else 197.0)


def test_an_sm_clock_is_stated_only_for_sm_work(monkeypatch):
    _steady(monkeypatch, instant=600.0)
    sentences = {}
    for work in ("sm", "memory", "link"):
        with T.Telemetry(interval_s=0.002, work=work) as tel:
            with tel.window():
                _busy(0.02)
        sentences[work] = tel.summary().sentence()
        assert tel.summary().sm_clock_hz == pytest.approx(1590e6)
    assert "SM clock 1,590 MHz" in sentences["sm"] and "software power cap" in sentences["sm"]
    assert "memory clock (3,201 MHz)" in sentences["memory"]
    assert "SM clock 1,590" not in sentences["memory"] + sentences["link"]
    assert "no GPU clock" in sentences["link"] and "power cap" not in sentences["link"]


def test_brief_states_window_clock_and_reasons_in_a_few_words(monkeypatch):
    _steady(monkeypatch, instant=600.0)
    briefs = {}
    for work in ("sm", "link"):
        with T.Telemetry(interval_s=0.002, work=work) as tel:
            with tel.window():
                _busy(0.02)
        briefs[work] = tel.summary().brief()
    assert "SM clock 1,590 MHz" in briefs["sm"] and "software power cap" in briefs["sm"]
    assert " s, " in briefs["sm"] and len(briefs["sm"]) < 80
    assert "clock" not in briefs["link"].replace("power cap", "")   # no SM clock for a copy


@pytest.mark.parametrize("source, values, readable", [
    ("/proc/cpuinfo", [2596.1, 2596.1, 2596.1], False),   # a VM's constant nominal figure
    ("/proc/cpuinfo", [2596.1, 3100.0], True),
    ("cpufreq", [2400.0, 2400.0], True)])
def test_a_constant_cpuinfo_clock_is_said_to_be_unreadable(monkeypatch, source, values, readable):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(T, "_cpu_reading", lambda: {"sm_clock_mhz": values[0], "cpu_mhz": values,
                                                    "clock_source": source})
    with T.Telemetry(interval_s=0.002) as tel:
        time.sleep(0.02)
    s = tel.summary()
    assert s.cpu_clock_readable is readable
    assert ("cannot be read" in s.sentence()) is (not readable)


# ---- a fake sampler trace: the summary describes the timed window, time-weighted ----------

def _trace(points):
    """Readings as Telemetry keeps them, from ``(t, sm_mhz, power_w)``."""
    return [{"t": t, "sm_clock_mhz": mhz, "max_sm_clock_mhz": 1980.0,
             "memory_clock_mhz": 3201.0, "power_w": w, "power_kind": "1 s average",
             "power_limit_w": 700.0, "temperature_c": 60,
             "clock_event_reasons": ["software power cap"] if mhz < 1980 else []}
            for t, mhz, w in points]


def test_a_warm_up_at_a_high_clock_does_not_set_the_window_clock():
    """Warm-up read often at 1,980 MHz, then a 1.2 s window at ~1,500 MHz read unevenly: the
    old summary (median of every reading in the block, warm-up included) said 1,980 MHz; the
    clock is the window's, time-weighted, not the median of its readings."""
    warm = [(0.01 * i, 1980.0, 300.0) for i in range(50)]        # 0.00-0.49 s, 50 readings
    # inside the window [0.5, 1.7]: 1,600 MHz read 5 times in its first 0.1 s, then 1,500 MHz
    # read every 0.2 s for the remaining 1.1 s
    burst = [(0.5 + 0.02 * i, 1600.0, 650.0) for i in range(5)]
    held = [(0.7 + 0.2 * i, 1500.0, 690.0) for i in range(6)]     # 0.7 ... 1.7
    after = [(1.8 + 0.05 * i, 1980.0, 200.0) for i in range(4)]
    s = T.summarize(_trace(warm + burst + held + after), [(0.5, 1.7)], source="NVML",
                    interval_s=0.02, block_s=2.0, device="NVIDIA H200")
    assert s.samples == 11 and not s.too_short
    assert s.sm_clock_mhz_highest == 1600.0 and s.sm_clock_mhz_min == 1500.0
    # the 1,600 MHz readings stand for 0.50-0.64 s (the last of them, at 0.58 s, up to the
    # midpoint with the first 1,500 MHz reading at 0.70 s), 1,500 MHz for the other 1.06 s
    expected = (1600.0 * 0.14 + 1500.0 * 1.06) / 1.2
    assert s.sm_clock_mhz_weighted == pytest.approx(expected)
    assert s.sm_clock_hz == pytest.approx(expected * 1e6)
    assert s.sm_clock_mhz_median == 1500.0     # 6 readings of 1,500 against 5 of 1,600
    assert f"SM clock {expected:,.0f} MHz time-weighted" in s.sentence()
    assert "1,500–1,600 MHz" in s.sentence()
    # power: only readings 1 s or more into the window (1.5, 1.7 s), not the warm-up's 300 W
    assert s.power_w_max == 690.0 and not s.power_short and "690 W" in s.sentence()


def test_time_weighted_counts_each_reading_by_the_time_it_stands_for():
    assert T.time_weighted([(0.0, 1.0), (1.0, 3.0)], [(0.0, 1.0)]) == pytest.approx(2.0)
    # a reading at 0.1 s stands for 0.0-0.5, one at 0.9 s for 0.5-1.0 ... of [0, 1]
    assert T.time_weighted([(0.1, 1.0), (0.9, 3.0)], [(0.0, 1.0)]) == pytest.approx(2.0)
    # three crowded readings at 1,000 against one long one at 2,000: weight, not count
    got = T.time_weighted([(0.0, 1e3), (0.01, 1e3), (0.02, 1e3), (0.5, 2e3)], [(0.0, 1.0)])
    assert got == pytest.approx((1e3 * 0.26 + 2e3 * 0.74) / 1.0)
    # readings outside every window do not count; two windows add up
    assert T.time_weighted([(5.0, 9.0)], [(0.0, 1.0)]) is None
    assert T.time_weighted([(0.5, 1.0), (2.5, 3.0)], [(0.0, 1.0), (2.0, 5.0)]) == \
        pytest.approx((1.0 * 1 + 3.0 * 3) / 4)


def test_a_window_shorter_than_the_power_averaging_interval_quotes_no_power():
    """A 0.2 s copy read at 121 W (the idle board the power reading still averages) must not
    be captioned "at 121 W": the sentence says the window is too short for power."""
    points = [(0.5 + 0.02 * i, 1980.0, 121.0) for i in range(11)]       # 0.50-0.70 s
    s = T.summarize(_trace(points), [(0.5, 0.7)], source="NVML", interval_s=0.02,
                    block_s=1.0, work="memory", device="NVIDIA H200")
    assert not s.too_short and s.power_w_max is None and s.power_short
    assert "121 W" not in s.sentence()
    assert "shorter than the 1 s" in s.sentence() and "one-second average" in s.sentence()


def test_fewer_than_min_samples_readings_are_too_short():
    points = [(0.0, 1980.0, 120.0)] + [(0.5 + 0.02 * i, 1500.0, 690.0)
                                        for i in range(T.MIN_SAMPLES - 1)]
    s = T.summarize(_trace(points), [(0.49, 0.55)], source="NVML", interval_s=0.02,
                    block_s=1.0, device="NVIDIA H200")
    assert s.samples == T.MIN_SAMPLES - 1 and s.too_short
    assert s.sm_clock_hz is None and s.sm_clock_mhz_weighted is None
    assert s.power_w_max is None
    assert "too short to read a clock" in s.sentence() and "MHz" not in s.sentence().replace(
        "chip max 1,980 MHz", "")
    # enough readings crowded into less than MIN_SAMPLES intervals: too short as well
    crowded = [(0.5 + 0.001 * i, 1500.0, 690.0) for i in range(10)]
    s = T.summarize(_trace(crowded), [(0.5, 0.51)], source="NVML", interval_s=0.02,
                    block_s=1.0, device="NVIDIA H200")
    assert s.samples == 10 and s.too_short and s.sm_clock_hz is None


def test_window_clocks_are_each_windows_own_in_order(monkeypatch):
    from perflab.machine.gpu import window_clocks_hz
    """Two windows at two clocks, an idle stretch between and a window with no reading: one
    clock per window, in order, the idle readings in none of them."""
    state = {"mhz": 1980.0}
    _gpu(monkeypatch, lambda: _reading(state["mhz"], 300.0))
    with T.Telemetry(interval_s=0.002) as tel:
        for mhz in (1500.0, 1700.0):
            with tel.window():
                state["mhz"] = mhz
                _busy(0.04)
            state["mhz"] = 1980.0
            _busy(0.03)
        tel._hear("open")
        tel._hear("close")                       # a window too short for a reading
    clocks = window_clocks_hz(tel)
    assert len(clocks) == 3 and clocks[2] is None
    assert clocks[0] == pytest.approx(1500e6, rel=0.02)
    assert clocks[1] == pytest.approx(1700e6, rel=0.02)
    with pytest.raises(RuntimeError, match="after the with-block"):
        window_clocks_hz(T.Telemetry())
