"""The machine report card: the CLI end to end on this machine (quick), the page, ratios, failures."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perflab.machine import report
from perflab.core.device import gpu_count

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """``python -m perflab.machine.report --quick`` run once, as a user would, with no reference card."""
    tmp = tmp_path_factory.mktemp("card")
    out = tmp / "card.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "perflab.machine.report", "--quick", "--json", str(out),
                           "--reference", str(tmp / "missing.json"), "--disk-dir", str(tmp)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    return done, out


def test_cli_measures_prints_one_page_and_writes_json(cli_run):
    done, out = cli_run
    assert done.returncode == 0, done.stdout + done.stderr
    page = done.stdout
    assert page.startswith("$ python -m perflab.machine.report --quick")
    assert "Machine report card (quick" in page
    (line,) = [ln for ln in page.splitlines() if "no reference card at" in ln]
    assert line.endswith("ratios omitted")                                # one line says why
    assert "JSON written to" in page
    assert "report card" in done.stderr                                  # the progress bar
    card = json.loads(out.read_text())
    assert card["schema"] == report.SCHEMA and card["failures"] == [] and card["quick"] is True
    for name in ("cpu_memory_bandwidth_GBps", "cpu_memory_bandwidth_1thread_GBps", "cpu_matmul_gflops_fp32",
                 "disk_seq_cold_GBps", "disk_rand_cold_iops", "allreduce_busbw_GBps", "allreduce_latency_us",
                 "allreduce_fit_busbw_GBps"):
        value = card["metrics"][name]["value"]
        assert math.isfinite(value) and value > 0, name
        assert card["metrics"][name]["label"] in page or card["metrics"][name]["label"][:50] in page
    assert card["curves"]["cpu_cache"]["nbytes"] and card["curves"]["allreduce"]["backend"]
    assert [p for p in Path(out.parent.parent).glob("perflab-disk-*")] == []   # the disk test cleaned up


@pytest.mark.skipif(gpu_count() > 0, reason="checks the lines a machine without a GPU prints")
def test_cli_says_in_one_line_what_a_cpu_machine_cannot_measure(cli_run):
    done, out = cli_run
    card = json.loads(out.read_text())
    assert any(n.startswith("no CUDA GPU") for n in card["notes"])
    assert any("gloo" in n for n in card["notes"])
    assert card["metrics"]["allreduce_busbw_GBps"]["context"] == "gloo"
    assert not any(name.startswith(("gpu_", "h2d_", "p2p_", "matmul_tflops")) for name in card["metrics"])
    assert "GPU: none" in done.stdout


def test_ratios_against_a_reference_and_contexts_that_must_match(cli_run):
    _, out = cli_run
    card = json.loads(out.read_text())
    r = report.ratios(card, card)
    assert r and all(v == pytest.approx(1.0) for v in r.values())
    other = json.loads(out.read_text())
    other["metrics"]["allreduce_busbw_GBps"]["context"] = "nccl"
    other["metrics"]["cpu_memory_bandwidth_GBps"]["value"] *= 2
    r = report.ratios(card, other)
    assert "allreduce_busbw_GBps" not in r
    assert r["cpu_memory_bandwidth_GBps"] == pytest.approx(0.5)
    page = report.render(card, other, "reference: test")
    assert "reference: test" in page and "0.50" in page
    assert report.ratios(card, None) == {}


def test_load_reference_explains_in_one_line_why_there_is_none(tmp_path):
    ref, line = report.load_reference(tmp_path / "missing.json")
    assert ref is None and "no reference card" in line and "\n" not in line
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert report.load_reference(bad)[0] is None
    alien = tmp_path / "alien.json"
    alien.write_text(json.dumps({"schema": "something-else"}))
    ref, line = report.load_reference(alien)
    assert ref is None and "schema" in line
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema": report.SCHEMA, "created": "2026-11-30T10:00:00Z",
                                "environment": {"devices": ["NVIDIA H200", "NVIDIA H200"]}, "metrics": {}}))
    ref, line = report.load_reference(good)
    assert ref is not None and "2× NVIDIA H200" in line and "2026-11-30" in line


def test_a_failing_measurement_is_a_line_and_an_exit_status(monkeypatch, tmp_path, capsys):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    for step in ("_cpu_memory", "_cpu_matmul", "_cpu_caches", "_allreduce", "_gpu_info", "_gpu_memory",
                 "_gpu_matmul", "_host_device", "_peer"):
        monkeypatch.setattr(report, step, lambda *a, **k: None)
    monkeypatch.setattr(report, "_disk", boom)
    status = report.main(["--quick", "--no-progress", "--json", str(tmp_path / "c.json"),
                          "--reference", str(tmp_path / "none.json")])
    assert status == 1
    page = capsys.readouterr().out
    assert "FAILURES" in page and "disk: OSError: disk full" in page
    assert json.loads((tmp_path / "c.json").read_text())["failures"] == ["disk: OSError: disk full"]


def test_card_refuses_a_non_finite_metric():
    card = report.Card()
    with pytest.raises(ValueError, match="failed"):
        card.add("x", "CPU", "x", float("nan"), "GB/s")
    card.add("y", "CPU", "y", 2, "GB/s", datasheet=4.0)
    assert card.metrics["y"].value == 2.0


@pytest.mark.parametrize("where", ["dir", "missing_folder", "under_a_file", "read_only"])
def test_a_bad_json_path_is_one_line_and_exit_2_before_measuring(tmp_path, where, monkeypatch):
    target = {"dir": tmp_path, "missing_folder": tmp_path / "nope" / "card.json",
              "under_a_file": tmp_path / "file.txt" / "card.json", "read_only": tmp_path / "ro.json"}[where]
    (tmp_path / "file.txt").write_text("x")
    if where == "read_only":
        target.write_text("{}")
        monkeypatch.setattr(report.os, "access", lambda path, mode: False)
    monkeypatch.setattr(report, "measure", lambda **kw: pytest.fail("measured before checking --json"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if where == "read_only":  # os.access patched in-process: root may write anywhere
        status = report.main(["--json", str(target)])
        assert status == 2
        return
    done = subprocess.run([sys.executable, "-c", "import sys, perflab.machine.report as r; "
                           "r.measure = None; sys.exit(r.main())", "--json", str(target)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "nothing measured" in done.stderr
    assert not (tmp_path / "nope").exists()


def test_l2_row_is_chapter_2s_replayed_probe_with_the_start_up_out(monkeypatch):
    """The card's L2 / HBM ratio comes from perflab.machine.replay.replay_sweep, the code chapter 2
    shows, with the start-up measured on the tiny working set taken out (a synthetic GPU: 1 us
    start-up per kernel, 10 TB/s in L2, 4 TB/s from HBM), not from a second implementation."""
    from perflab.core.rounds import Spread
    from perflab.machine.caches import geometric_sizes

    l2, asked = 60 * 2**20, {}

    def fake_sweep(sizes, device, rounds=5, **kwargs):
        asked["sizes"], asked["rounds"] = list(sizes), rounds
        t = {8192: Spread((1e-6,) * rounds)}
        t.update({n: Spread((1e-6 + n / (10e12 if n <= l2 / 2 else 4e12),) * rounds) for n in sizes})
        return t

    monkeypatch.setattr(report.replay, "replay_sweep", fake_sweep)
    card = report.Card()
    report._l2(card, report._sizes(quick=False), "cpu", l2)
    assert asked["sizes"] == geometric_sizes(4 * 2**20, 2**30, per_octave=3)   # chapter 2's sweep
    assert asked["rounds"] == 5
    assert card.metrics["l2_bandwidth_ratio"].value == pytest.approx(2.5, rel=1e-6)
    assert card.curves["gpu_l2"]["startup_s"] == pytest.approx(1e-6)
    # the stored curve has the start-up taken out: the in-L2 points read 10 TB/s
    inside = [b for n, b in zip(card.curves["gpu_l2"]["nbytes"], card.curves["gpu_l2"]["bytes_per_s"])
              if n <= l2 / 2]
    assert inside and all(b == pytest.approx(10e12, rel=1e-6) for b in inside)
    # ... and leaves out the sizes whose bytes take less than the start-up
    assert min(card.curves["gpu_l2"]["nbytes"]) > 8 * 2**20
    step = card.metrics["gpu_l2_from_curve_MiB"]
    assert 15 <= step.value <= 60 and step.datasheet == 60
    assert len(card.metrics["l2_bandwidth_ratio"].label) <= 35
    assert card.metrics["l2_bandwidth_ratio"].context == step.context == report.L2_METHOD


def _sweep(alpha, busbw, sizes=(4096, 2**16, 2**20, 2**24)):
    """A gloo sweep on 2 ranks whose times follow t = alpha + S / busbw exactly (alpha may be < 0)."""
    from perflab.machine import interconnect

    pts = tuple(interconnect.AllReducePoint(s, alpha + s / busbw, 10, s / (alpha + s / busbw), s / (alpha + s / busbw))
                for s in sizes)
    return interconnect.AllReduceResult("gloo", 2, "cpu", pts, {}, "perf_counter")


def test_allreduce_latency_is_the_alpha_beta_intercept_not_the_first_size(monkeypatch):
    """Chapter 2 glues alpha of the alpha-beta fit as the all-reduce latency; the card reports the same."""
    monkeypatch.setattr(report, "gpu_count", lambda: 0)
    monkeypatch.setattr(report.interconnect, "allreduce_sweep", lambda *a, **k: _sweep(50e-6, 2e9))
    card = report.Card()
    report._allreduce(card, report._sizes(quick=True))
    first = card.curves["allreduce"]["seconds"][0]
    assert card.metrics["allreduce_latency_us"].value == pytest.approx(50.0, rel=1e-6)
    assert first * 1e6 > 50.0 * 1.01                   # the first size's time is not the latency
    assert card.metrics["allreduce_fit_busbw_GBps"].value == pytest.approx(2.0, rel=1e-6)
    assert card.metrics["allreduce_latency_us"].context == "gloo, alpha-beta fit"
    # a reference card whose latency was read off the smallest size (context "gloo") is not compared
    old = {"metrics": {"allreduce_latency_us": {"value": 60.0, "context": "gloo"}}}
    assert report.ratios({"metrics": {k: vars(m) for k, m in card.metrics.items()}}, old) == {}
    assert all(len(m.label) <= 35 for m in card.metrics.values())
    assert card.notes == []


def test_a_fit_without_a_positive_latency_is_a_note_not_a_metric(monkeypatch):
    monkeypatch.setattr(report, "gpu_count", lambda: 0)
    monkeypatch.setattr(report.interconnect, "allreduce_sweep",
                        lambda *a, **k: _sweep(-5e-6, 2e9, (2**20, 2**22, 2**24)))
    card = report.Card()
    report._allreduce(card, report._sizes(quick=True))
    assert "allreduce_latency_us" not in card.metrics
    assert any("no latency reported" in n for n in card.notes)
