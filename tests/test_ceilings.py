"""perflab.machine.ceilings (and the file format, perflab.record.ceilings): one ceilings file per
run and machine, re-measured for another host, GPU, torch or run."""

import json

import pytest
import torch

from perflab.machine import ceilings as C


def test_load_measures_writes_and_reuses(tmp_path, monkeypatch):
    path = tmp_path / "ceilings.json"
    calls = []
    real = C.measure_all

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(C, "measure_all", counting)
    first = C.load(path, quick=True)
    assert path.exists() and len(calls) == 1
    assert first.value("copy_bandwidth") > 0 and first.value("matmul_fp32") > 0
    assert first.value("matmul_bf16") is None          # not measured on a CPU
    again = C.load(path)
    assert len(calls) == 1, "a file from this machine must be reused, not re-measured"
    assert again.value("copy_bandwidth") == first.value("copy_bandwidth")
    assert "GB/s" in again.sentence("copy_bandwidth")
    assert "not measured" in again.sentence("matmul_bf16")
    C.load(path, fresh=True, quick=True)
    assert len(calls) == 2


def test_a_file_from_another_machine_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    C.load(path, quick=True)
    doc = json.loads(path.read_text())
    doc["machine"]["devices"] = ["NVIDIA H200"]
    doc["ceilings"]["copy_bandwidth"]["value"] = 4.2e12
    path.write_text(json.dumps(doc))
    got = C.load(path, quick=True)
    assert got.value("copy_bandwidth") < 4.2e12
    assert json.loads(path.read_text())["machine"]["devices"] != ["NVIDIA H200"]


@pytest.mark.parametrize("field, value", [
    ("host_id", "0123456789ab"),              # another H200 host: same name, torch and CPU
    ("gpu_ids", ["fedcba987654"]),            # the same host, another GPU
])
def test_the_fingerprint_tells_two_hosts_of_one_kind_apart(tmp_path, field, value):
    """The 4 December labs read another host's ceilings: device name, torch and CPU model
    string cannot tell two H200 hosts apart; the host id and the GPU UUIDs can."""
    path = tmp_path / "c.json"
    C.load(path, quick=True)
    doc = json.loads(path.read_text())
    assert doc["machine_id"]["host_id"] and "gpu_ids" in doc["machine_id"]
    assert C.stale_reason(doc) is None
    doc["machine_id"][field] = value
    assert "another machine" in C.stale_reason(doc)
    doc["ceilings"]["copy_bandwidth"]["value"] = 4.2e12
    path.write_text(json.dumps(doc))
    assert C.load(path, quick=True).value("copy_bandwidth") < 4.2e12   # measured again


def test_a_file_without_machine_ids_or_of_another_run_is_not_this_run_s(tmp_path):
    path = tmp_path / "c.json"
    first = C.load(path, quick=True, run="run-a")
    doc = json.loads(path.read_text())
    assert first.run == "run-a" and doc["run"] == "run-a"
    assert C.stale_reason(doc, "run-a") is None
    assert "run-b" in C.stale_reason(doc, "run-b")
    assert C.load(path, run="run-a").measured == first.measured        # reused within a run
    old = {k: v for k, v in doc.items() if k != "machine_id"}
    assert "which host" in C.stale_reason(old)
    assert C.stale_reason(None) == "no readable ceilings file"


def test_host_costs_are_measured_once_with_their_spread(tmp_path):
    c = C.load(tmp_path / "c.json", quick=True)
    h = c.host_cost("cpu")
    assert h is not None and h.n == 3 and 0 < h.lo <= h.median <= h.hi < 1e-3
    assert c.host_cost("cuda") is None or c.host_cost("cuda").n == 3
    again = C.load(tmp_path / "c.json")
    assert again.host_cost("cpu").values == h.values     # read back, not re-measured
    with pytest.raises(KeyError, match="host cost"):
        c.host_cost("gpu")


def test_unknown_names_are_errors(tmp_path):
    c = C.load(tmp_path / "c.json", quick=True)
    with pytest.raises(KeyError, match="unknown ceiling"):
        c.value("copy_bandwith")
    with pytest.raises(KeyError, match="not measured"):
        c["matmul_bf16"]


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(C.CEILINGS_ENV, str(tmp_path / "x.json"))
    assert C.default_path() == tmp_path / "x.json"
    monkeypatch.delenv(C.CEILINGS_ENV)
    assert C.default_path().name == "ceilings.json" and ".cache" in str(C.default_path())


def test_command_line_rejects_a_directory(tmp_path, capsys):
    assert C.main(["--json", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err


def _h200_file(tmp_path, gpu=True):
    """The reference run's ceilings (bf16 691.8 TFLOP/s at a median 1,590 MHz), with or without
    the GPU facts the clock model needs."""
    ref = json.loads(C.REFERENCE_PATH.read_text())
    # the 2026-12-01 run's bf16 product, fixed here: a new reference run changes the file
    bf16 = ref["ceilings"]["matmul_bf16"]
    bf16["value"], bf16["telemetry"]["sm_clock_mhz_median"] = 691.8e12, 1590.0
    bf16["telemetry"].pop("sm_clock_mhz", None)     # a file from before the weighted clock
    ref["gpu"] = ({"sm_count": 132, "compute_capability": [9, 0], "max_sm_clock_hz": 1.98e9,
                   "memory_peak_bandwidth": 4.917e12} if gpu else None)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(ref))
    return C._from_doc(json.loads(path.read_text()), path)


def test_per_clock_takes_the_time_weighted_clock_where_the_file_has_it(tmp_path):
    """A median of readings that the warm-up crowded (1,590 MHz) is not the clock the SMs ran
    at; the time-weighted clock over the timed window (1,500 MHz) is, and per_clock uses it."""
    c = _h200_file(tmp_path)
    c["matmul_bf16"].telemetry["sm_clock_mhz"] = 1500.0
    assert c["matmul_bf16"].sm_clock_hz == pytest.approx(1.5e9)
    assert c.per_clock("matmul_bf16") == pytest.approx(691.8e12 / (132 * 4096 * 1.5e9))
    c["matmul_bf16"].telemetry["sm_clock_mhz"] = None           # too short to read a clock
    c["matmul_bf16"].telemetry["sm_clock_mhz_median"] = None
    assert c["matmul_bf16"].sm_clock_hz is None and c.per_clock("matmul_bf16") is None


def test_headline_ceilings_time_half_a_second_on_a_gpu(monkeypatch):
    """The copy and the products, whose clocks the pages quote, get >= 0.5 s of repetitions."""
    seen = {}

    def fake(fn, device, min_run_time_s, work):
        seen[work, len(seen)] = min_run_time_s
        summary = type("S", (), {"as_dict": lambda self: {}})()
        return type("M", (), {"seconds": 1.0, "telemetry": summary,
                              "rate": lambda self, w: w})()

    monkeypatch.setattr(C, "_measure", fake)
    c = C._one("copy_bandwidth", lambda: None, 8.0, "8 B", C.torch.device("cpu"),
               C.HEADLINE_RUN_S)
    assert c.value == 8.0 and list(seen.values()) == [0.5] and C.HEADLINE_RUN_S >= 0.5


def test_roofs_come_from_the_clock_model_and_nothing_exceeds_them(tmp_path):
    c = _h200_file(tmp_path)
    assert c.peak("bf16") == pytest.approx(132 * 4096 * 1.98e9)
    assert c.peak("bf16", 1.83e9) == pytest.approx(989.5e12, rel=1e-3)
    # the figure: 691.8 TFLOP/s at 1,590 MHz is 80 % per clock, not 87 %
    assert c.per_clock("matmul_bf16") == pytest.approx(0.805, abs=0.002)
    assert c["matmul_bf16"].sm_clock_hz == pytest.approx(1.59e9)
    for name in ("matmul_fp32", "matmul_tf32", "matmul_bf16", "copy_bandwidth"):
        assert c.value(name) < c.roof(name)
    # chapter 4's trace reached 795 TFLOP/s, 114.9 % of the measured product: below the roof
    assert 795e12 < c.roof("matmul_bf16")
    # one definition per ridge: roof over roof, or measured over measured
    assert c.ridge("bf16") == pytest.approx(132 * 4096 * 1.98e9 / c.roof("copy_bandwidth"))
    assert c.achieved_ridge("bf16") == pytest.approx(c.value("matmul_bf16") / c.value("copy_bandwidth"))
    assert c.compute_roof("fp32") == pytest.approx(132 * 256 * 1.98e9)
    with pytest.raises(KeyError, match="per_clock"):
        c.per_clock("copy_bandwidth")


def test_without_gpu_facts_the_measured_product_is_the_roof(tmp_path, monkeypatch):
    monkeypatch.setattr(C.torch.cuda, "is_available", lambda: False)
    c = _h200_file(tmp_path, gpu=False)
    assert c.peak("bf16") is None and c.roof("matmul_bf16") is None
    assert c.per_clock("matmul_bf16") is None
    assert c.compute_roof("fp32") == c.value("matmul_fp32")
    assert c.ridge("fp32") == pytest.approx(c.value("matmul_fp32") / c.value("copy_bandwidth"))
    assert c.ridge("fp32") == c.achieved_ridge("fp32")


def test_sizes_are_set_once_and_read_by_lab4(monkeypatch):
    """measure_all's sizes come from sizes(); lab 4's CPU ceilings read the same quick sizes
    instead of typing them again (a change there reaches both)."""
    import perflab.labs.lab04 as lab04
    assert C.sizes("cpu", quick=True)["matmul_n"] == 512
    assert C.sizes("cuda")["copy_numel"] == 2**28 and C.sizes("cuda")["matmul_n"] == 8192
    assert C.sizes("cpu", quick=True)["copy_numel"] >= 2**22
    asked = []

    def small(device, quick=False):
        asked.append((torch.device(device).type, quick))
        return {"copy_numel": 1024, "matmul_n": 8}

    monkeypatch.setattr(C, "sizes", small)
    rates = lab04.cpu_ceilings("cpu")
    assert asked == [("cpu", True)]
    assert rates["copy_bandwidth"]() > 0 and rates["matmul_fp32"]() > 0
