"""The machine report card: the CLI end to end on this machine (quick), the page, ratios, failures."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perflab import report
from perflab.hardware import gpu_count

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """``python -m perflab.report --quick`` run once, as a user would, with no reference card."""
    tmp = tmp_path_factory.mktemp("card")
    out = tmp / "card.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "perflab.report", "--quick", "--json", str(out),
                           "--reference", str(tmp / "missing.json"), "--disk-dir", str(tmp)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    return done, out


def test_cli_measures_prints_one_page_and_writes_json(cli_run):
    done, out = cli_run
    assert done.returncode == 0, done.stdout + done.stderr
    page = done.stdout
    assert page.startswith("$ python -m perflab.report --quick")
    assert "Machine report card (quick" in page
    (line,) = [ln for ln in page.splitlines() if "no reference card at" in ln]
    assert line.endswith("ratios omitted")                                # one line says why
    assert "JSON written to" in page
    assert "report card" in done.stderr                                  # the progress bar
    card = json.loads(out.read_text())
    assert card["schema"] == report.SCHEMA and card["failures"] == [] and card["quick"] is True
    for name in ("cpu_memory_bandwidth_GBps", "cpu_memory_bandwidth_1thread_GBps", "cpu_matmul_gflops_fp32",
                 "disk_seq_cold_GBps", "disk_rand_cold_iops", "allreduce_busbw_GBps", "allreduce_latency_us"):
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
    done = subprocess.run([sys.executable, "-c", "import sys, perflab.report as r; "
                           "r.measure = None; sys.exit(r.main())", "--json", str(target)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "nothing measured" in done.stderr
    assert not (tmp_path / "nope").exists()
