from pathlib import Path
import nbformat
import pytest

from perflab.record import provenance


def _notebook_with_glue(tmp_path, values):
    """Execute a tiny notebook that glues values, the way a chapter does."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "from perflab.record.provenance import glue\n" +
        "\n".join(f"glue({k!r}, {v!r})" for k, v in values.items())))
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_glue_round_trip_through_an_executed_notebook(tmp_path):
    path = _notebook_with_glue(tmp_path, {"copy_bandwidth_TBps": 4.125, "knee": 64, "device_name": "H200"})
    got = provenance.read_glued(path)
    assert got == {"copy_bandwidth_TBps": 4.125, "knee": 64, "device_name": "H200"}


def test_glue_converts_numpy_and_torch_scalars_and_rejects_bad_values(monkeypatch):
    import numpy as np
    import torch

    seen = {}
    monkeypatch.setattr("myst_nb.glue", lambda name, value, display: seen.__setitem__(name, value))
    assert provenance.glue("a", np.float64(1.5)) is None      # nothing for a cell to display twice
    provenance.glue("b", torch.tensor(3))
    assert type(seen["a"]) is float and type(seen["b"]) is int
    with pytest.raises(ValueError, match="measurement failed"):
        provenance.glue("c", float("nan"))
    with pytest.raises(ValueError, match="identifier"):
        provenance.glue("not a name", 1)


def test_code_sha256_depends_on_code_only():
    from perflab.record.runs import code_sha256

    a = code_sha256(["x = 1", "print(x)"])
    assert a == code_sha256(["x = 1\n", "  print(x)"])
    assert a != code_sha256(["x = 2", "print(x)"])


def test_environment_names_the_host_cpu():
    env = provenance.environment()
    assert env["devices"] and env["torch"] and env["python"]
    host = env["host"]
    assert host["cpu"] == env["cpu"] and host["logical_cores"] >= host["usable_cores"] >= 1


def test_reference_run_records_the_host_and_reads_runs_without_it():
    from perflab.record.runs import ReferenceRun

    run = ReferenceRun.now("2026-12-01T00:00:00Z", 1.0, "abc", None)
    meta = run.as_metadata()
    assert meta["host"]["cpu"] and meta["host"]["logical_cores"] >= 1
    assert ReferenceRun.from_metadata(meta).host == meta["host"]
    older = {k: v for k, v in meta.items() if k != "host"}          # a run before the field
    assert ReferenceRun.from_metadata(older).host is None
    assert "host" not in ReferenceRun.from_metadata(older).as_metadata()


def test_reference_run_reads_metadata(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["reference_run"] = {"devices": ["NVIDIA H200"]}
    path = tmp_path / "a.ipynb"
    nbformat.write(nb, path)
    assert provenance.reference_run(path) == {"devices": ["NVIDIA H200"]}
    nb.metadata.pop("reference_run")
    nbformat.write(nb, path)
    assert provenance.reference_run(path) is None


def test_artifacts_are_the_books_in_a_reference_run_and_scratch_removed_at_exit(tmp_path, monkeypatch):
    import subprocess
    import sys

    from perflab.record import provenance

    monkeypatch.setenv(provenance.REFERENCE_RUN_ENV, "1")
    monkeypatch.chdir(tmp_path)
    assert provenance.artifacts("_static_chXX") == Path("_static_chXX")
    assert (tmp_path / "_static_chXX").is_dir()
    # elsewhere: a scratch folder that the process removes when it exits
    code = ("from perflab.record import provenance; d = provenance.artifacts('_static_chXX', 'chXX_');"
            "(d / 'trace.json').write_text('{}'); print(d)")
    env = {k: v for k, v in __import__("os").environ.items() if k != provenance.REFERENCE_RUN_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(Path(__file__).resolve().parent.parent), check=True)
    folder = Path(out.stdout.strip())
    assert folder.name.startswith("chXX_") and not folder.exists()


def test_lab_reference_reads_the_labs_own_run_or_nothing():
    glued, run = provenance.lab_reference("no_such_lab")
    assert glued == {} and run is None
    glued, run = provenance.lab_reference("03_internals")    # committed with the repository
    assert isinstance(glued, dict) and (run is None or "devices" in run)
    assert glued or run is not None                   # found through the package's location


def test_the_host_id_tells_two_containers_of_one_image_on_two_hosts_apart(tmp_path, monkeypatch):
    """Same /etc/machine-id (one image), another kernel boot id (another host): another host id;
    the same two files: the same id."""
    machine = tmp_path / "machine-id"
    machine.write_text("5bce98f73f3e0000\n")
    ids = []
    for boot in ("1111-aaaa", "2222-bbbb", "1111-aaaa"):
        (tmp_path / "boot_id").write_text(boot + "\n")
        monkeypatch.setattr(provenance, "HOST_ID_FILES", (str(machine), str(tmp_path / "boot_id")))
        ids.append(provenance.machine_id()["host_id"])
    assert ids[0] != ids[1] and ids[0] == ids[2] and len(ids[0]) == 12
    monkeypatch.setattr(provenance, "HOST_ID_FILES", (str(tmp_path / "none"),))
    assert provenance.machine_id()["host_id"]           # the hostname stands in
