"""perflab.record.ceilings: one ceilings file per run, re-measured only for another machine."""

import json

import pytest

from perflab.record import ceilings as C


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
