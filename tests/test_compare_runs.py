"""scripts/compare_runs.py and perflab.record.verdicts: two runs of the same pages, compared."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.formatters import format_display_data

from perflab.record import claims, verdicts

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "application/papermill.record/"


def _glue(name, value):
    bundle, _ = format_display_data(value)
    return {"output_type": "display_data",
            "metadata": {"scrapbook": {"name": name, "mime_prefix": PREFIX}},
            "data": {PREFIX + k: v for k, v in bundle.items()}}


def _claim(name, verdict, bound, text, measured=None):
    record = {"verdict": verdict, "bound": bound}
    if measured is not None:
        record.update(measured=measured, lo=measured, hi=measured)
    return _glue(name, claims._Claimed(text, record))


def _notebook(folder: Path, page: str, outputs, started="2026-12-05T10:00:00Z",
              device=None, source=None):
    path = folder / f"{page}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {"started": started, "git": "abc"}
    if device:
        run["devices"] = [device]
    if source:
        run.update(source_sha256=source, perflab_sha256={"perflab/x.py": "1"})
    path.write_text(json.dumps({"metadata": {"reference_run": run},
                                "cells": [{"cell_type": "code", "outputs": outputs}]}))


def _run(folder: Path, *, rung_verdict="true", host_verdict="true", knee=True, ratio=1.0,
         extra_page=False, started="2026-12-05T10:00:00Z", device=None, source=None,
         same_host=False):
    _notebook(folder, "book/06_speed", [
        _claim("rung_vs_prediction", rung_verdict, "device", "within 25 %", 1.1),
        _claim("loader_vs_prediction", host_verdict, "host", "within 25 %", 0.9),
        *([_glue(verdicts.SAME_HOST_PREFIX + "loader_vs_prediction", True)]
          if same_host else []),
        _glue("expect_knee", knee), _glue("speedup", 10.0 * ratio),
        _glue("old_style_sentence", "the run was faster" if ratio < 2 else "the run was slower"),
        _glue("clock", "measured over 0.5 s on X: SM clock 1,980 MHz")], started, device,
        source)
    if extra_page:
        _notebook(folder, "labs/06_speed", [_glue("x", 1)], started)
    return folder


def _record(root: Path, name: str) -> None:
    """``compare_runs.py --record root/runs/NAME.json --root root/NAME``, which must succeed: its
    ``main`` in this process (the command line itself is run by the tests below; a fresh
    interpreter per record cost ~4 s of CI each)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("compare_runs_cli", ROOT / "scripts" / "compare_runs.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--record", str(root / "runs" / f"{name}.json"), "--root", str(root / name)]) == 0


def test_identical_runs_agree(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    pages, only_a, only_b = verdicts.compare(verdicts.load(a), verdicts.load(b))
    (page,) = pages
    # two claims and one expectation; the plain sentence is a text, not a verdict
    assert page.verdicts == 3 and page.agreeing == 3 and not page.changes
    assert only_a == only_b == []


def test_a_device_bound_flip_is_a_defect_and_a_host_bound_one_is_not(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", rung_verdict="undecided", host_verdict="false", ratio=1.5)
    (page,), _, _ = verdicts.compare(verdicts.load(a), verdicts.load(b))
    assert {c.name for c in page.changes} == {"rung_vs_prediction", "loader_vs_prediction"}
    assert [c.name for c in page.defects] == ["rung_vs_prediction"]   # undecided counts
    assert page.moved and page.moved[0][1] == "speedup"
    r = subprocess.run([sys.executable, "scripts/compare_runs.py", str(a), str(b)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CHANGED [DEFECT] rung_vs_prediction" in r.stdout
    assert "CHANGED [host-bound] loader_vs_prediction" in r.stdout
    assert "(measured 0.9 -> 0.9)" in r.stdout
    only_host = _run(tmp_path / "c", host_verdict="false")
    r = subprocess.run([sys.executable, "scripts/compare_runs.py", str(a), str(only_host)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 exempt host-bound verdict(s) changed" in r.stdout


def test_a_host_bound_flip_against_a_prediction_from_the_same_host_is_a_defect(tmp_path):
    # the host-bound label exempts a host figure, not a ratio to a prediction built from the
    # same host's parts: the page's declaration (samehost_<claim>) takes the exemption away
    a = _run(tmp_path / "a", same_host=True)
    b = _run(tmp_path / "b", host_verdict="undecided", same_host=True)
    rec = verdicts.load(a)["pages"]["book/06_speed"]
    assert rec["verdicts"]["loader_vs_prediction"]["prediction"] == "this host"
    assert "prediction" not in rec["verdicts"]["rung_vs_prediction"]
    assert not any(k.startswith(verdicts.SAME_HOST_PREFIX) for k in rec["sentences"])
    (page,), _, _ = verdicts.compare(verdicts.load(a), verdicts.load(b))
    assert [c.name for c in page.defects] == ["loader_vs_prediction"]
    r = subprocess.run([sys.executable, "scripts/compare_runs.py", str(a), str(b)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("CHANGED [DEFECT (host-bound, predicted from the same host)] "
            "loader_vs_prediction") in r.stdout
    assert "1 verdict(s) changed that are not exempt (of them 1 host-bound" in r.stdout
    # declared in the newer run only (a page newly declared): still counted
    c = _run(tmp_path / "c", host_verdict="false")
    (page,), _, _ = verdicts.compare(verdicts.load(c), verdicts.load(b))
    assert [x.name for x in page.defects] == ["loader_vs_prediction"]


@pytest.mark.parametrize("names", [(), ("not a name",), (3,)])
def test_a_same_host_declaration_needs_claim_names(names):
    with pytest.raises(ValueError, match="name"):
        verdicts.same_host_prediction(*names)


def test_runs_on_two_devices_or_of_two_sources_list_their_changes_but_count_no_defect(
        tmp_path):
    """A verdict that changes between an H200 and an H100, or after the page's code changed,
    says nothing about the noise of one measurement: listed, not a defect (the status page
    then looks further back for a run of the same source on the same device)."""
    a = _run(tmp_path / "a", device="H200", source="s1")
    b = _run(tmp_path / "b", rung_verdict="false", device="H100", source="s1")
    (page,), _, _ = verdicts.compare(verdicts.load(a), verdicts.load(b))
    assert page.changes and page.defects == [] and "different devices" in page.not_comparable
    r = subprocess.run([sys.executable, "scripts/compare_runs.py", str(a), str(b)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHANGED [runs differ] rung_vs_prediction" in r.stdout
    c = _run(tmp_path / "c", rung_verdict="false", device="H200", source="s2")
    (page,), _, _ = verdicts.compare(verdicts.load(a), verdicts.load(c))
    assert page.defects == [] and "different source" in page.not_comparable
    d = _run(tmp_path / "d", rung_verdict="false", device="H200", source="s1")
    (page,), _, _ = verdicts.compare(verdicts.load(a), verdicts.load(d))
    assert page.not_comparable is None and [x.name for x in page.defects] == [
        "rung_vs_prediction"]


def test_the_status_compares_each_page_with_its_latest_run_of_one_source_on_one_device(
        tmp_path):
    root = tmp_path / "repo"
    _run(root / "x", started="2026-12-01T00:00:00Z", device="H200", source="s1")
    _run(root / "y", started="2026-12-02T00:00:00Z", rung_verdict="false", device="H200",
         source="s2")
    _run(root / "z", started="2026-12-03T00:00:00Z", rung_verdict="false", device="H100",
         source="s1")
    for name in ("x", "y", "z"):
        _record(root, name)
    newest, found = verdicts.latest_comparable(root)
    assert newest == "z" and found == {}          # no earlier run on an H100
    _run(root / "w", started="2026-12-04T00:00:00Z", device="H200", source="s1")
    _record(root, "w")
    newest, found = verdicts.latest_comparable(root)
    (run, against, page), = found.values()
    assert newest == "w" and against == "x"       # skips y (other source) and z (other device)
    assert run == "w" and page.agreeing == page.verdicts
    # a partial re-run (another page only) is the newest record, yet this page keeps its
    # comparison of w with x: the newest run of each page is compared, not the newest record
    _run(root / "v", started="2026-12-05T00:00:00Z", device="H200", source="s1")
    _record(root, "v")
    doc = json.loads((root / "runs" / "v.json").read_text())
    doc["pages"] = {f"other/{k}": v for k, v in doc["pages"].items()}
    (root / "runs" / "v.json").write_text(json.dumps(doc))
    newest, found = verdicts.latest_comparable(root)
    assert newest == "v" and {k: v[:2] for k, v in found.items()} == {
        page_name: ("w", "x") for page_name in found if not page_name.startswith("other/")}
    assert any(not k.startswith("other/") for k in found)
    assert verdicts.latest_comparable(tmp_path / "nowhere") == (None, {})


def test_expectations_old_sentences_and_pages_in_one_run_only(tmp_path):
    a = _run(tmp_path / "a", extra_page=True)
    b = _run(tmp_path / "b", knee=False, ratio=3.0)
    pages, only_a, only_b = verdicts.compare(verdicts.load(a), verdicts.load(b))
    names = {c.name: c for c in pages[0].changes}
    assert "expect_knee" in names and names["expect_knee"].defect
    # both runs store their claims' verdicts: a text that is no claim is listed, not counted
    assert "old_style_sentence" not in names
    assert [c.name for c in pages[0].texts] == ["old_style_sentence"]
    assert "clock" not in names                     # telemetry states readings, not verdicts
    assert only_a == ["labs/06_speed"] and only_b == []


def test_an_older_run_without_stored_verdicts_compares_its_sentences(tmp_path):
    for name, ratio in (("a", 1.0), ("b", 3.0)):
        _notebook(tmp_path / name, "book/06_speed", [
            _glue("old_style_sentence",
                  "the run was faster" if ratio < 2 else "the run was slower"),
            _glue("same_words", f"{ratio:.1f} ms, {100 * ratio:.0f} µs")])
    pages, _, _ = verdicts.compare(verdicts.load(tmp_path / "a"),
                                   verdicts.load(tmp_path / "b"))
    names = {c.name: c for c in pages[0].changes}
    assert set(names) == {"old_style_sentence"} and names["old_style_sentence"].bound is None
    assert pages[0].verdicts == 2 and pages[0].texts == []


@pytest.mark.parametrize("a, b", [("took 25.6 µs to 1.37 ms", "took -3.11 ms to 2.11 s"),
                                  ("588.4k tokens/s, 50.9 %", "41,726 tokens/s, 7 %"),
                                  ("1.85x at 1,551 MHz", "0.5x at 1,980 MHz"),
                                  ("691.3 TFLOP/s, 3.0 GB/s", "51 TFLOP/s, 54 GB/s")])
def test_a_text_masks_numbers_with_their_units(a, b):
    assert verdicts._masked(a) == verdicts._masked(b)


@pytest.mark.parametrize("a, b", [("the idle time rose by 3 ms", "the idle time fell by 3 ms"),
                                  ("agrees with the model (1.1x)", "is 0.5x the model's")])
def test_a_text_whose_words_changed_is_a_changed_text(a, b):
    assert verdicts._masked(a) != verdicts._masked(b)


def test_a_record_round_trips_and_the_last_two_are_found(tmp_path):
    root = tmp_path / "repo"
    _run(root / "x", started="2026-12-01T00:00:00Z")
    _run(root / "y", started="2026-12-03T00:00:00Z")
    _run(root / "z", started="2026-12-02T00:00:00Z")
    for name in ("x", "y", "z"):
        _record(root, name)
    older, newer = verdicts.last_two(root)
    assert (older["run"], newer["run"]) == ("z", "y")
    assert newer == verdicts.load(root / "runs" / "y.json")
    assert verdicts.last_two(tmp_path / "nowhere") is None


@pytest.mark.parametrize("args", [["only-one"], ["a", "b", "--moved", "-1"], ["x", "y"]])
def test_bad_arguments_exit_2(args, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts/compare_runs.py"), *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "compare_runs.py" in r.stderr


def test_the_committed_records_are_run_records():
    """The repository keeps at least the last two runs' records, readable."""
    pair = verdicts.last_two(ROOT)
    assert pair is not None, "runs/ must hold the records of the last two runs"
    for record in pair:
        assert record["pages"] and record["schema"] == verdicts.SCHEMA


def test_a_run_s_record_leaves_out_the_older_notebooks_of_pages_that_failed_in_it(tmp_path):
    """A page that failed in a run keeps its older notebook in the tree; the record of the run
    (--record with --run) holds the run's own pages only and names the others."""
    root = _run(tmp_path / "tree", extra_page=True)
    for page, run in (("book/06_speed", "r5"), ("labs/06_speed", "r3")):
        path = root / f"{page}.ipynb"
        nb = json.loads(path.read_text())
        nb["metadata"]["reference_run"]["ceilings"] = {"run": run}
        path.write_text(json.dumps(nb))
    doc = verdicts.snapshot(root, run="r5", only_run=True)
    assert list(doc["pages"]) == ["book/06_speed"] and doc["left_out"] == {"labs/06_speed": "r3"}
    assert set(verdicts.snapshot(root, run="folder")["pages"]) == {"book/06_speed",
                                                                   "labs/06_speed"}
    with pytest.raises(ValueError, match="run"):
        verdicts.snapshot(root, only_run=True)


def test_a_record_keeps_the_band_apart_from_the_measured_spread(tmp_path):
    """lo/hi are the spread of the rounds; a reader of the record (the status page, a review)
    who takes them for the band reads a verdict 'outside' while the median sits in lo..hi."""
    rec = {"verdict": "false", "bound": "host", "measured": 1.2, "lo": 1.18, "hi": 1.24,
           "predicted": 1.0, "tolerance": 0.1}
    _notebook(tmp_path, "book/06_speed", [_glue("sync_vs_prediction",
                                                claims._Claimed("1.2x, outside", rec))])
    v = verdicts.load(tmp_path)["pages"]["book/06_speed"]["verdicts"]["sync_vs_prediction"]
    assert (v["lo"], v["hi"]) == (1.18, 1.24)
    assert v["band_lo"] == pytest.approx(0.9) and v["band_hi"] == pytest.approx(1.1)


def test_a_change_is_shown_as_measured_over_predicted_without_a_unit():
    c = verdicts.Change("x", "true", "undecided", "host", (5.1e-05, 7.0e-05), (5.0e-05, 5.0e-05))
    assert c.over_predicted == pytest.approx((1.02, 1.4))
    assert verdicts.Change("x", "true", "false", "host", (1.0, 2.0), None).over_predicted is None
    assert verdicts.Change("x", "true", "false", "host", (1.0, 2.0), (0, 1.0)).over_predicted is None


def test_near_edges_lists_agreeing_device_verdicts_close_to_a_band_edge():
    sys.path.insert(0, str(ROOT / "scripts"))
    import compare_runs

    def doc(**claims_):
        return {"pages": {"book/x": {"verdicts": claims_}}}

    def rec(lo, hi, verdict="true", bound="device"):
        return {"verdict": verdict, "bound": bound, "lo": lo, "hi": hi, "measured": lo,
                "band_lo": 0.9, "band_hi": 1.1}

    a = doc(near=rec(0.905, 1.0), far=rec(0.95, 1.05), host=rec(0.901, 1.0, bound="host"),
            flipped=rec(0.905, 1.0), bare={"verdict": "true", "bound": "device"})
    b = doc(near=rec(0.95, 1.0), far=rec(0.96, 1.04), host=rec(0.901, 1.0, bound="host"),
            flipped=rec(0.85, 0.95, verdict="undecided"), bare={"verdict": "true",
                                                               "bound": "device"})
    got = compare_runs.near_edges(a, b, 0.03)
    assert [(p, n) for p, n, _ in got] == [("book/x", "near")]   # host, flips, far, bare: no
    assert "A: true 0.6%" in got[0][2]
    assert compare_runs.near_edges(a, b, 0.001) == []


def test_a_claim_s_spread_sentence_is_no_text_of_its_own(tmp_path):
    """compare() glues ``<name>_spread`` for the page's folded note: the claim's numbers again
    in words, recorded with the claim; a glued text of that shape that belongs to no claim
    stays a sentence of the record."""
    _notebook(tmp_path, "book/06_speed", [
        _claim("rung_vs_prediction", "true", "device", "as predicted (1.10x)", 1.1),
        _glue("rung_vs_prediction" + claims.SPREAD_SUFFIX, "1.10x the prediction (1.0–1.2x)"),
        _glue("lonely_spread", "a sentence of its own")])
    sentences = verdicts.load(tmp_path)["pages"]["book/06_speed"]["sentences"]
    assert sentences == {"lonely_spread": "a sentence of its own"}


def test_a_claim_in_one_run_only_is_a_changed_verdict_not_an_agreeing_one(tmp_path):
    """A device-bound claim one run glued and the other did not (run 439fc20 lost
    burst_vs_clock_ratio when NVML read no clock in its window) counts as a defect."""
    a = _run(tmp_path / "a")
    b = tmp_path / "b"
    _notebook(b, "book/06_speed", [
        _claim("loader_vs_prediction", "true", "host", "within 25 %", 0.9),
        _glue("expect_knee", True), _glue("speedup", 10.0),
        _glue("old_style_sentence", "the run was faster"),
        _glue("clock", "measured over 0.5 s on X: SM clock 1,980 MHz")])
    r = subprocess.run([sys.executable, "scripts/compare_runs.py", str(a), str(b)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ONE RUN ONLY [DEFECT] rung_vs_prediction: A: true, B: none" in r.stdout
    assert "1 verdict(s) changed that are not exempt" in r.stdout
