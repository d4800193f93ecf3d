"""scripts/execute.py: the reference run and its --check, on tiny notebooks in a temporary folder.

Most tests call the script's ``main(argv)`` in this process (``run``): the exit status, stdout and
stderr are what ``python scripts/execute.py ARGS`` gives (its last line is
``sys.exit(main())``), without starting a Python and importing torch for each of the ~20 calls.
The command line itself is run as a process (``run_script``) where that is the point: a missing
path's exit status and one-line message, a real execution with provenance, a Python without
jupytext.
"""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "execute.py"
sys.path.insert(0, str(ROOT / "scripts"))
import execute  # noqa: E402
import preimport  # noqa: E402

from myst_source import HEADER  # noqa: E402


def write_nb(path: Path, *cells: str, prose: str = "# A notebook") -> Path:
    body = HEADER + "\n" + prose + "\n"
    for src in cells:
        body += "\n```{code-cell} ipython3\n" + src + "\n```\n"
    path.write_text(body)
    return path


def run_script(*args):
    """``python scripts/execute.py ARGS`` in a process of its own."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def run(*args):
    """``execute.main(ARGS)`` in this process: its exit status, stdout and stderr, as ``run_script``
    returns them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = execute.main([str(a) for a in args])
    return subprocess.CompletedProcess([str(SCRIPT), *map(str, args)], code, out.getvalue(), err.getvalue())


def test_missing_path_is_one_clear_line_and_exit_2(tmp_path):
    r = run_script(tmp_path / "nope.md")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr


def test_a_plain_markdown_file_is_not_a_notebook(tmp_path):
    p = tmp_path / "plain.md"
    p.write_text("# just prose\n")
    r = run(p)
    assert r.returncode == 2 and "not a jupytext MyST notebook" in r.stderr


def test_executes_in_the_notebooks_folder_and_writes_provenance(tmp_path):
    (tmp_path / "data.txt").write_text("42")
    md = write_nb(tmp_path / "nb.md", "print(open('data.txt').read())", "from perflab.record.provenance import glue\nglue('answer', 42)")
    r = run_script(md)
    assert r.returncode == 0, r.stderr
    assert "[1/1]" in r.stdout and "ok on" in r.stdout
    nb = json.loads(md.with_suffix(".ipynb").read_text())
    run_meta = nb["metadata"]["reference_run"]
    for key in ("devices", "driver", "cuda", "torch", "python", "started", "duration_s", "source_sha256", "git"):
        assert key in run_meta
    assert "42" in "".join(nb["cells"][1]["outputs"][0]["text"])


def test_a_failing_cell_stops_its_notebook_but_not_the_others(tmp_path):
    bad = write_nb(tmp_path / "bad.md", "x = 1", "raise ValueError('broken on purpose')", "print('never')")
    good = write_nb(tmp_path / "good.md", "print('fine')")
    r = run(bad, good)
    assert r.returncode == 1
    assert "ValueError: broken on purpose" in r.stdout
    assert "code cell 2" in r.stdout
    assert not bad.with_suffix(".ipynb").exists()
    assert good.with_suffix(".ipynb").exists()
    # the log carries the traceback's end, and the notebook as it stopped is kept for reading
    assert "raise ValueError" in r.stdout and "as it stopped" in r.stdout
    kept = execute.ROOT / r.stdout.split("as it stopped: ")[1].split(")")[0]
    outputs = json.loads(kept.read_text())["cells"][2]["outputs"]
    assert outputs[0]["output_type"] == "error"


def test_pack_holds_every_file_written_since_the_start_and_is_rewritten_after_each_notebook(tmp_path):
    import os
    import tarfile
    root = tmp_path / "clone"
    for rel in ("book/old.ipynb", "book/new.ipynb", "book/traces/t.json", "labs/l.ipynb.tmp",
                "elsewhere/x.ipynb"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    since = (root / "book" / "new.ipynb").stat().st_mtime
    os.utime(root / "book" / "old.ipynb", (since - 60, since - 60))
    archive = tmp_path / "out" / "executed.tgz"
    archive.parent.mkdir()
    assert execute.pack(archive, since, root=root, folders=("book", "labs", "missing")) == 2
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["book/new.ipynb", "book/traces/t.json"]
    assert [p.name for p in archive.parent.iterdir()] == ["executed.tgz"]   # no temporary left
    # through main: packed after each notebook, the failing one too
    bad = write_nb(tmp_path / "bad.md", "raise ValueError('broken on purpose')")
    good = write_nb(tmp_path / "good.md", "print('fine')")
    r = run("--pack", archive, bad, good)
    assert r.returncode == 1 and r.stdout.count(f"file(s) into {archive}") == 2
    assert tarfile.is_tarfile(archive)


def test_keep_copies_what_the_run_wrote_so_a_stopped_call_loses_nothing(tmp_path):
    import os
    root = tmp_path / "clone"
    for rel in ("book/old.ipynb", "book/new.ipynb", "perflab/data/reference_ceilings.json",
                "labs/l.ipynb.tmp", "elsewhere/x.ipynb"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    since = (root / "book" / "new.ipynb").stat().st_mtime
    os.utime(root / "book" / "old.ipynb", (since - 60, since - 60))
    kept = tmp_path / "kept"
    folders = ("book", "labs", "perflab/data", "missing")
    assert execute.keep(kept, since, root=root, folders=folders) == 2
    got = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
    assert got == ["book/new.ipynb", "perflab/data/reference_ceilings.json"]
    # called again after the next notebook: rewritten, never a temporary left behind
    (root / "book" / "new.ipynb").write_text("second")
    assert execute.keep(kept, since, root=root, folders=folders) == 2
    assert (kept / "book" / "new.ipynb").read_text() == "second"
    assert not list(kept.rglob("*.tmp"))
    # through main: accepted beside --pack, and the run goes on as usual
    good = write_nb(tmp_path / "good.md", "print('fine')")
    assert run("--keep", tmp_path / "kept2", good).returncode == 0
    sh = (ROOT / "scripts" / "reference_run.sh").read_text()
    assert '--keep "$keep"' in sh     # the script keeps after each notebook, not at its end


def test_per_notebook_time_limit(tmp_path):
    slow = write_nb(tmp_path / "slow.md", "import time\ntime.sleep(30)")
    r = run("--timeout", "3", slow)
    assert r.returncode == 1 and "timed out" in r.stdout.lower()


@pytest.mark.parametrize("ahead", ["1", "2"])
def test_per_notebook_time_limit_in_a_kernel_started_ahead(tmp_path, ahead):
    """The time limit holds in a kernel started ahead of its page, with its imports
    (``--preimport 2``) or during the page before (``1``): with a plain KernelManager's blocking
    client, nbclient's wait for output blocked its event loop and a 30 s cell ran under a 3 s
    limit."""
    fast = write_nb(tmp_path / "fast.md", "import os")
    slow = write_nb(tmp_path / "slow.md", "import time\ntime.sleep(30)")
    r = run("--preimport", ahead, "--timeout", "3", fast, slow)
    assert r.returncode == 1 and "slow.md: timed out" in r.stdout, r.stdout


def test_check_reports_missing_stale_cpu_and_prose_drift(tmp_path):
    md = write_nb(tmp_path / "nb.md", "x = 1")
    r = run("--check", md)     # a page never run waits for the GPU machine, as a stale one (3)
    assert r.returncode == 3 and "awaiting its first reference run" in r.stdout

    assert run(md).returncode == 0            # executed here, on a CPU
    r = run("--check", md)
    assert r.returncode == 1 and "not on a CUDA device" in r.stdout

    ipynb = md.with_suffix(".ipynb")
    nb = json.loads(ipynb.read_text())
    nb["metadata"]["reference_run"].update(devices=["NVIDIA H200"], cuda="13.0")
    ipynb.write_text(json.dumps(nb))
    assert run("--check", md).returncode == 0

    write_nb(md, "x = 2")                      # code changed: stale (exit 3, as perflab)
    r = run("--check", md)
    assert r.returncode == 3 and "stale" in r.stdout

    write_nb(md, "x = 1", prose="# A notebook, reworded")   # prose only: fixable without a GPU
    r = run("--check", md)
    assert r.returncode == 1 and "prose or cell metadata" in r.stdout
    assert run("--sync", md).returncode == 0
    assert run("--check", md).returncode == 0
    nb = json.loads(ipynb.read_text())
    assert "".join(nb["cells"][0]["source"]).startswith("# A notebook, reworded")
    assert nb["metadata"]["reference_run"]["devices"] == ["NVIDIA H200"]


def test_sync_copies_a_code_cell_s_presentation_and_keeps_what_the_run_wrote(tmp_path):
    """A figure caption or a tag is presentation: --check sees it drift, --sync copies it
    without a run, and the cell's outputs and execution record stay the run's."""
    md = write_nb(tmp_path / "nb.md", "print(6 * 7)")
    assert run(md).returncode == 0
    ipynb = md.with_suffix(".ipynb")
    nb = json.loads(ipynb.read_text())
    nb["metadata"]["reference_run"].update(devices=["NVIDIA H200"], cuda="13.0")
    nb["cells"][1]["metadata"]["execution"] = {"iopub.status.busy": "the run's"}
    ipynb.write_text(json.dumps(nb))
    outputs = nb["cells"][1]["outputs"]
    assert run("--check", md).returncode == 0

    text = md.read_text().replace(
        "```{code-cell} ipython3\n",
        "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: Forty-two\n"
        "tags: [hide-input]\n---\n")
    md.write_text(text)
    r = run("--check", md)
    assert r.returncode == 1 and "prose or cell metadata" in r.stdout
    assert run("--sync", md).returncode == 0
    assert run("--check", md).returncode == 0
    cell = json.loads(ipynb.read_text())["cells"][1]
    assert cell["metadata"]["mystnb"] == {"figure": {"caption": "Forty-two"}}
    assert cell["metadata"]["tags"] == ["hide-input"]
    assert cell["metadata"]["execution"] == {"iopub.status.busy": "the run's"}
    assert cell["outputs"] == outputs and "42" in json.dumps(outputs)


def test_check_and_sync_together_is_an_error(tmp_path):
    md = write_nb(tmp_path / "nb.md", "x = 1")
    r = run("--check", "--sync", md)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "exclude" in r.stderr


def test_without_cuda_a_gpu_reference_run_is_not_overwritten(tmp_path):
    md = write_nb(tmp_path / "nb.md", "x = 1")
    assert run(md).returncode == 0
    ipynb = md.with_suffix(".ipynb")
    nb = json.loads(ipynb.read_text())
    nb["metadata"]["reference_run"].update(devices=["NVIDIA H200"], cuda="13.0")
    ipynb.write_text(json.dumps(nb))
    before = ipynb.read_text()

    r = run(md)                                  # this machine has no CUDA device
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--allow-cpu" in r.stderr
    assert ipynb.read_text() == before

    out = tmp_path / "elsewhere"
    assert run("--out", out, md).returncode == 0  # writing elsewhere is fine
    # (at the same path relative to the clone: tmp_path is inside it, under .cache/tmp)
    assert len(list(out.rglob("nb.ipynb"))) == 1 and ipynb.read_text() == before
    assert run("--allow-cpu", md).returncode == 0  # asked explicitly
    assert json.loads(ipynb.read_text())["metadata"]["reference_run"]["cuda"] is None


def test_the_run_metadata_is_a_versioned_reference_run(tmp_path):
    from perflab.record import runs

    md = write_nb(tmp_path / "nb.md", "x = 1")
    assert run(md).returncode == 0
    run_ = runs.read(md.with_suffix(".ipynb"))
    assert run_.schema == runs.SCHEMA_VERSION and not run_.is_gpu
    assert run_.source_sha256 == runs.source_code_sha256(md)
    assert runs.status(md).state == "cpu"
    with pytest.raises(ValueError, match="newer"):
        runs.ReferenceRun.from_metadata({"schema": runs.SCHEMA_VERSION + 1})


def test_a_python_without_jupytext_is_told_which_environment_to_use(tmp_path):
    (tmp_path / "jupytext.py").write_text("raise ImportError('hidden', name='jupytext')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "jupytext is not installed" in r.stderr and ".venv" in r.stderr


def _script_with_fake_python(tmp_path, body):
    """reference_run.sh copied into a clone of its own (a developer's .whl/ folder, wheels for
    the GPU machine, would otherwise make the script install them first), a fake python3 that
    passes the preflight's imports and then runs the shell ``body``, and an empty $OUT:
    ``(script, out, env)``."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\n[ \"$1\" = -c ] && exit 0   # the preflight\n" + body)
    (fake / "python3").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "clone" / "scripts").mkdir(parents=True)
    script = tmp_path / "clone" / "scripts" / "reference_run.sh"
    script.write_text((ROOT / "scripts" / "reference_run.sh").read_text())
    return script, out, {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(out)}


def test_reference_run_sh_keeps_its_log_when_stopped_at_a_time_limit(tmp_path):
    """A run killed by `timeout` still leaves every line it printed in $OUT/reference_run.log."""
    script, out, env = _script_with_fake_python(
        tmp_path, "for i in $(seq 1 200); do echo \"line $i\"; sleep 0.05; done\n")
    r = subprocess.run(["timeout", "-s", "TERM", "2", "bash", str(script)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 124
    lines = (out / "reference_run.log").read_text().splitlines()
    assert len(lines) >= 5 and lines[0] == "line 1"


def test_reference_run_sh_twice_in_one_call_keeps_both_archives_and_logs(tmp_path):
    """Two invocations in one device call share $OUT (the chapters, then some labs): the second
    writes executed-2.tgz and reference_run-2.log beside the first's, never over them (on 6
    December the labs' archive replaced the chapters', and five executed chapters were lost)."""
    # the fake execute.py "packs" by writing the pages it was given to the --pack path
    script, out, env = _script_with_fake_python(
        tmp_path,
        "shift; while [ $# -gt 0 ]; do case $1 in --pack) shift; out=$1;; *) pages=\"$pages $1\";;"
        " esac; shift; done\necho \"ran$pages\"; echo \"$pages\" > \"$out\"\n")
    for page in ("book/a.md", "labs/b.md"):
        r = subprocess.run(["bash", str(script), page], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 0, r.stderr
    assert (out / "executed.tgz").read_text().split() == ["book/a.md"]
    assert (out / "executed-2.tgz").read_text().split() == ["labs/b.md"]
    assert "ran book/a.md" in (out / "reference_run.log").read_text()
    assert "ran labs/b.md" in (out / "reference_run-2.log").read_text()


def test_reference_run_sh_stops_before_the_ceilings_when_the_jupyter_stack_is_missing(tmp_path):
    """The preflight: a machine where the pages' imports fail is told so at once (the first call
    of 5 December measured the ceilings, then ran ten pages into a missing docutils)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\n[ \"$1\" = -c ] && { echo 'No module named docutils' >&2;"
                                  " exit 1; }\necho 'executed pages'\n")
    (fake / "python3").chmod(0o755)
    (tmp_path / "clone" / "scripts").mkdir(parents=True)
    script = tmp_path / "clone" / "scripts" / "reference_run.sh"
    script.write_text((ROOT / "scripts" / "reference_run.sh").read_text())
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert r.returncode == 2 and "docutils" in r.stderr and "executed pages" not in r.stdout


def test_a_later_call_of_a_run_finds_what_the_earlier_calls_wrote(tmp_path):
    """Each call of the device tool gets a fresh tree: the second call of one run (same
    PERFLAB_RUN_ID, same machine) gets back the notebooks the first call wrote (lab 9 reads
    chapter 9's), kept outside the tree; another run does not."""
    fake = tmp_path / "bin"
    fake.mkdir()
    # the fake execute.py: the first call "executes" chapter 9 and packs it; any call reports
    # whether chapter 9's new notebook is in its tree
    (fake / "python3").write_text(
        "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\n"
        "grep -q new book/09.ipynb 2>/dev/null && echo 'chapter 9: new' || echo 'chapter 9: old'\n"
        "if [ \"$FIRST\" = 1 ]; then echo new > book/09.ipynb;"
        " tar czf \"$OUT/executed.tgz\" book/09.ipynb; fi\n")
    (fake / "python3").chmod(0o755)

    def call(first, run_id):
        clone = tmp_path / f"clone-{first}-{run_id}"
        (clone / "scripts").mkdir(parents=True)
        (clone / "book").mkdir()
        (clone / "book" / "09.ipynb").write_text("old\n")     # the committed notebook
        script = clone / "scripts" / "reference_run.sh"
        script.write_text((ROOT / "scripts" / "reference_run.sh").read_text())
        out = tmp_path / f"out-{first}-{run_id}"
        out.mkdir()
        env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(out), "FIRST": str(first),
               "PERFLAB_RUN_ID": run_id, "PERFLAB_RUN_COPIES": str(tmp_path / "kept")}
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                           env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "chapter 9: old" in call(1, "r1")
    later = call(0, "r1")
    assert "chapter 9: new" in later and "restored" in later
    assert "chapter 9: old" in call(0, "r2")


def _package(root: Path) -> Path:
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""lazy package"""\n')
    (pkg / "a.py").write_text("from . import b\nfrom .sub.deep import f\n\ndef g():\n    return b.x\n")
    (pkg / "b.py").write_text("x = 1\n")
    (pkg / "c.py").write_text("y = 2\n")
    (pkg / "lazy.py").write_text("z = 3\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("def f():\n    return 0\n")
    return pkg


def test_perflab_hash_follows_imported_modules_transitively_and_only_them(tmp_path):
    from perflab.record import runs

    pkg = _package(tmp_path)
    cells = ["%matplotlib inline\nfrom pkg import a", "import pkg\npkg.lazy.z"]
    mods = runs.perflab_modules(cells, pkg, package="pkg")
    assert mods == ["pkg", "pkg.a", "pkg.b", "pkg.lazy", "pkg.sub", "pkg.sub.deep"]
    before = runs.perflab_sha256(cells, pkg, package="pkg")
    assert set(before) == {"pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/lazy.py",
                           "pkg/sub/__init__.py", "pkg/sub/deep.py"}

    (pkg / "c.py").write_text("y = 3  # a module the notebook never imports\n")
    assert runs.perflab_sha256(cells, pkg, package="pkg") == before

    (pkg / "b.py").write_text("x = 2  # imported through pkg.a\n")
    after = runs.perflab_sha256(cells, pkg, package="pkg")
    assert after != before
    assert runs.changed_modules(before, after) == ["pkg/b.py"]
    assert runs.changed_modules(None, after) == ["the run recorded no perflab hashes"]
    assert runs.perflab_sha256(["x = 1"], pkg, package="pkg") == {}


def test_check_names_the_perflab_modules_a_stale_run_depends_on(tmp_path):
    from perflab.record import runs

    md = write_nb(tmp_path / "nb.md", "from perflab.record.provenance import glue\nglue('x', 1)")
    assert run(md).returncode == 0
    ipynb = md.with_suffix(".ipynb")
    nb = json.loads(ipynb.read_text())
    meta = nb["metadata"]["reference_run"]
    assert "perflab/record/provenance.py" in meta["perflab_sha256"]
    assert "perflab/core/fits.py" not in meta["perflab_sha256"]
    meta.update(devices=["NVIDIA H200"], cuda="13.0")
    ipynb.write_text(json.dumps(nb))
    assert run("--check", md).returncode == 0

    meta["perflab_sha256"]["perflab/record/provenance.py"] = "0" * 64   # as if provenance.py changed
    ipynb.write_text(json.dumps(nb))
    st = runs.status(md)
    assert st.state == "stale" and st.cause == "perflab" and st.changed == ("perflab/record/provenance.py",)
    r = run("--check", md)
    assert r.returncode == 3 and "perflab/record/provenance.py" in r.stdout and "stale" in r.stdout

    del meta["perflab_sha256"]                                     # a run from before the hash
    ipynb.write_text(json.dumps(nb))
    r = run("--check", md)
    assert r.returncode == 3 and "recorded no perflab hashes" in r.stdout


def declare(md: Path, gpus: int) -> Path:
    """Give a test notebook the front matter ``perflab: {gpus: N}``."""
    text = md.read_text()
    end = text.index("\n---", 3)
    md.write_text(text[:end] + f"\nperflab:\n  gpus: {gpus}" + text[end:])
    return md


def test_a_page_is_not_run_on_a_machine_with_fewer_gpus_than_it_declares(tmp_path, monkeypatch):
    two = declare(write_nb(tmp_path / "two.md", "x = 1"), 2)
    one = declare(write_nb(tmp_path / "one.md", "x = 1"), 1)
    monkeypatch.setattr(execute, "gpus_here", lambda: 1)
    monkeypatch.setattr(execute.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(execute, "prepare_ceilings", lambda fresh, run: None)
    r = run(two)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "needs 2 GPU(s) and this machine has 1" in r.stderr and "--out" in r.stderr
    assert not two.with_suffix(".ipynb").exists()
    monkeypatch.setattr(execute, "gpus_here", lambda: 2)   # enough GPUs: it runs
    assert execute.too_few_gpus(two) is None and execute.too_few_gpus(one) is None
    monkeypatch.setattr(execute, "gpus_here", lambda: 0)   # a CPU: the CPU guard decides
    assert execute.too_few_gpus(one) is None and execute.too_few_gpus(two) is not None


def test_a_bad_gpu_declaration_is_refused_naming_the_page(tmp_path):
    from perflab.record import runs

    md = declare(write_nb(tmp_path / "bad.md", "x = 1"), 0)
    with pytest.raises(ValueError, match="bad.md.*gpus"):
        runs.required_gpus(md)
    md.write_text(md.read_text().replace("gpus: 0", "gpus: two"))
    with pytest.raises(ValueError, match="gpus"):
        runs.required_gpus(md)
    assert runs.required_gpus(write_nb(tmp_path / "plain.md", "x = 1")) == 1
    assert not runs.declares_gpus(tmp_path / "plain.md")


def test_check_lists_multi_gpu_pages_with_what_they_wait_for_without_failing(tmp_path):
    one = write_nb(tmp_path / "one.md", "x = 1")
    two = declare(write_nb(tmp_path / "two.md", "y = 1"), 2)
    for md in (one, two):
        assert run("--out", tmp_path / "o", "--allow-cpu", md).returncode == 0
        ipynb = (tmp_path / "o").rglob(md.stem + ".ipynb").__next__()
        nb = json.loads(ipynb.read_text())
        nb["metadata"]["reference_run"].update(devices=["NVIDIA H200"] * (2 if md is two else 1),
                                               cuda="13.0")
        md.with_suffix(".ipynb").write_text(json.dumps(nb))
    write_nb(two, "y = 2")       # its code moved on: a page that needs 2 GPUs waits, it does not fail
    declare(two, 2)
    r = run("--check", one, two)
    assert r.returncode == 0, r.stdout
    assert "waiting: " in r.stdout and "needs 2 GPUs" in r.stdout
    write_nb(one, "x = 2")       # a one-GPU page whose code changed is stale: exit 3, as perflab
    r = run("--check", one, two)
    assert r.returncode == 3 and "stale: its code differs" in r.stdout


def _gpu_run(md: Path, out: Path, ceilings: dict | None = None) -> None:
    """Execute ``md`` on this CPU into ``out`` and store it beside ``md`` as if a GPU ran it,
    having read the ceilings file ``ceilings`` (its recorded summary)."""
    assert run("--out", out, "--allow-cpu", md).returncode == 0
    ipynb = next(out.rglob(md.stem + ".ipynb"))
    nb = json.loads(ipynb.read_text())
    nb["metadata"]["reference_run"].update(devices=["NVIDIA H200"], cuda="13.0",
                                           ceilings=ceilings)
    md.with_suffix(".ipynb").write_text(json.dumps(nb))


def test_page_code_and_package_code_are_stale_alike_and_a_cpu_run_is_not(tmp_path):
    """Issue 38: an edit of the page's code must cost no more than an edit of perflab: both
    make the page stale (exit 3: CI warns, the page shows its banner); a run from a CPU or a
    missing run is a failure (exit 1)."""
    md = write_nb(tmp_path / "p.md", "x = 1")
    _gpu_run(md, tmp_path / "o")
    assert run("--check", md).returncode == 0
    write_nb(md, "x = 2")
    r = run("--check", md)
    assert r.returncode == 3 and "stale" in r.stdout
    nb = json.loads(md.with_suffix(".ipynb").read_text())
    write_nb(md, "x = 1")
    nb["metadata"]["reference_run"].update(devices=["cpu: x"], cuda=None)
    md.with_suffix(".ipynb").write_text(json.dumps(nb))
    assert run("--check", md).returncode == 1


def test_pages_of_one_book_must_read_one_ceilings_file(tmp_path):
    """Issue 37: on 4 December the labs read the committed ceilings of another host; --check
    now refuses current pages whose runs read different ceilings files."""
    a, b = write_nb(tmp_path / "a.md", "x = 1"), write_nb(tmp_path / "b.md", "y = 1")
    same = {"copy_bandwidth": 4.2e12, "measured": "2026-12-05T10:00:00Z", "run": "r1",
            "machine_id": {"host_id": "aaa", "gpu_ids": ["g1"]}}
    _gpu_run(a, tmp_path / "o", same)
    _gpu_run(b, tmp_path / "o", same)
    assert run("--check", a, b).returncode == 0
    other = {**same, "measured": "2026-12-05T10:20:00Z", "machine_id": {"host_id": "bbb",
                                                                        "gpu_ids": ["g2"]}}
    _gpu_run(b, tmp_path / "o", other)
    r = run("--check", a, b)
    assert r.returncode == 1 and "different ceilings" in r.stdout and "host bbb" in r.stdout
    again = {**same, "measured": "2026-12-05T10:20:00Z", "copy_bandwidth": 4.3e12}
    _gpu_run(b, tmp_path / "o", again)   # one run, one host: each call measured them again
    r = run("--check", a, b)
    assert r.returncode == 3 and "several ceilings files" in r.stdout, r.stdout


def test_a_run_s_ceilings_are_reused_only_on_its_own_machine(tmp_path, monkeypatch, capsys):
    """A later call of one run reuses the run's ceilings on the same host and GPU, and measures
    them again, saying the host changed, on another machine."""
    calls = []

    class Fake:
        machine_id = {"host_id": "h"}
        measured, items, host = "t", {}, {}

    # prepare_ceilings points $PERFLAB_CEILINGS at the committed reference file: undone after
    # the test (left set, every later kernel of the session measured this CPU's ceilings into
    # perflab/data/reference_ceilings.json)
    monkeypatch.setenv(execute.ceilings.CEILINGS_ENV, str(tmp_path / "ceilings.json"))
    monkeypatch.setattr(execute.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(execute, "read_ceilings", lambda p: {"run": "r1"})
    monkeypatch.setattr(execute.ceilings, "load",
                        lambda path, fresh, run: calls.append((fresh, run)) or Fake())
    monkeypatch.setattr(execute.ceilings, "stale_reason", lambda doc, run: None)
    execute.prepare_ceilings(False, "r1")
    assert calls[-1] == (False, "r1") and "reused" in capsys.readouterr().out
    monkeypatch.setattr(execute.ceilings, "stale_reason",
                        lambda doc, run: "the file comes from another machine")
    execute.prepare_ceilings(False, "r1")
    assert calls[-1] == (True, "r1") and "THE HOST CHANGED" in capsys.readouterr().out
    monkeypatch.setattr(execute.ceilings, "stale_reason",
                        lambda doc, run: "the file belongs to run 'r1', not to this run 'r2'")
    execute.prepare_ceilings(False, "r2")
    out = capsys.readouterr().out
    assert calls[-1] == (True, "r2") and "measured now" in out and "HOST CHANGED" not in out


def test_pack_splits_what_would_not_come_back_in_one_file(tmp_path):
    import tarfile

    root = tmp_path / "clone"
    (root / "book").mkdir(parents=True)
    for k in range(5):
        (root / "book" / f"f{k}.bin").write_bytes(bytes(400))
    archive = tmp_path / "out" / "executed.tgz"
    archive.parent.mkdir()
    assert execute.pack(archive, 0, root=root, folders=("book",), part_bytes=1000) == 5
    parts = sorted(archive.parent.glob("executed*.tgz"))
    assert [p.name for p in parts] == ["executed-2.tgz", "executed-3.tgz", "executed.tgz"]
    names = [n for p in parts for n in tarfile.open(p).getnames()]
    assert sorted(names) == [f"book/f{k}.bin" for k in range(5)]


def test_reference_run_sh_refuses_labs_beside_chapters_of_another_run(tmp_path):
    """Labs quote the chapters' notebooks: a labs call on a machine that lost the run's chapters
    (5 December: the labs quoted the previous run's H200 beside their own H100) stops at once,
    unless told that any chapters will do."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(
        "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\n"
        f"[ \"$1\" = - ] && exec {sys.executable} \"$@\"\necho 'executed pages'\n")
    (fake / "python3").chmod(0o755)
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "book").mkdir()
    script = clone / "scripts" / "reference_run.sh"
    script.write_text((ROOT / "scripts" / "reference_run.sh").read_text())

    def chapter(run):
        (clone / "book" / "01.ipynb").write_text(json.dumps(
            {"metadata": {"reference_run": {"ceilings": {"run": run}}}}))

    def call(*pages, **extra):
        env = {"PATH": f"{fake}:/usr/bin:/bin", "PERFLAB_RUN_ID": "r2", **extra}
        return subprocess.run(["bash", str(script), *pages], capture_output=True, text=True,
                              timeout=60, env=env)

    chapter("r1")
    r = call("labs/01.md")
    assert r.returncode == 2 and "not from run r2" in r.stderr
    assert "executed pages" not in r.stdout
    assert "executed pages" in call("book/01.md").stdout          # chapters are not refused
    assert "executed pages" in call("labs/01.md", PERFLAB_LABS_ANY_CHAPTERS="1").stdout
    chapter("r2")
    assert "executed pages" in call("labs/01.md").stdout


def test_a_page_that_reads_another_goes_stale_when_that_page_is_run_after_it(tmp_path):
    """The roofline explorer draws chapter 1's measured roofs from chapter 1's executed
    notebook: once chapter 1 is run again, the explorer shows an older run than chapter 1
    does, and --check calls it stale (exit 3), naming the page."""
    from perflab.record import runs

    a = write_nb(tmp_path / "a.md", "x = 1")
    b = write_nb(tmp_path / "b.md", "y = 2")
    b.write_text(b.read_text().replace(
        "  name: python3\n---", "  name: python3\nperflab:\n  reads: [a]\n---", 1))
    assert runs.reads(b) == ("a",) and runs.reads(a) == ()
    for md, started in ((a, "2026-12-06T01:00:00Z"), (b, "2026-12-06T02:00:00Z")):
        assert run(md).returncode == 0
        ipynb = md.with_suffix(".ipynb")
        nb = json.loads(ipynb.read_text())
        nb["metadata"]["reference_run"].update(devices=["NVIDIA H100"], cuda="13.0",
                                               started=started)
        ipynb.write_text(json.dumps(nb))
    assert runs.status(b).ok                          # read after a's run: current
    assert run("--check", a, b).returncode == 0

    ipynb = a.with_suffix(".ipynb")                   # a is run again, after b
    nb = json.loads(ipynb.read_text())
    nb["metadata"]["reference_run"]["started"] = "2026-12-06T03:00:00Z"
    ipynb.write_text(json.dumps(nb))
    st = runs.status(b)
    assert st.state == "stale" and st.cause == "input" and st.changed == ("a",)
    r = run("--check", a, b)
    assert r.returncode == 3 and "b.md: stale: a page it reads was run after it" in r.stdout

    b.write_text(b.read_text().replace("reads: [a]", "reads: a"))
    with pytest.raises(ValueError, match="perflab: reads"):
        runs.reads(b)


def _reader_clone(tmp_path, chapter_run):
    """A clone with a page that reads another's notebook (book/x.md reads y) and y's notebook
    from run ``chapter_run``; the real python3 (the guard needs yaml), a fake execute.py."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "book").mkdir()
    (clone / "scripts" / "reference_run.sh").write_text(
        (ROOT / "scripts" / "reference_run.sh").read_text())
    (clone / "scripts" / "execute.py").write_text("import sys; print('ran', *sys.argv[1:])\n")
    (clone / "book" / "x.md").write_text("---\nperflab:\n  gpus: 1\n  reads: [y]\n---\n# x\n")
    (clone / "book" / "y.md").write_text("---\nperflab:\n  gpus: 1\n---\n# y\n")
    (clone / "book" / "y.ipynb").write_text(json.dumps(
        {"metadata": {"reference_run": {"ceilings": {"run": chapter_run}}}}))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (fake / "python3").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(out), "PERFLAB_RUN_ID": "run-b",
           "PERFLAB_RUN_COPIES": str(tmp_path / "keep")}
    return clone, env


def test_reference_run_sh_refuses_a_page_before_the_pages_it_reads(tmp_path):
    """On 6 December the roofline explorer ran two calls before chapter 1, whose notebook it
    draws, and came back stale by order: the script refuses such a page unless the page it
    reads runs first in the same call or is already this run's."""
    clone, env = _reader_clone(tmp_path, chapter_run="run-a")
    sh = ["bash", "scripts/reference_run.sh"]
    r = subprocess.run(sh + ["book/x.md"], cwd=clone, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and "book/y.ipynb" in r.stderr and "run-b" in r.stderr
    r = subprocess.run(sh + ["book/y.md", "book/x.md"], cwd=clone, capture_output=True,
                       text=True, timeout=60, env=env)
    assert "reads" not in r.stderr, r.stderr


def test_reference_run_sh_runs_a_reader_whose_inputs_are_this_runs(tmp_path):
    clone, env = _reader_clone(tmp_path, chapter_run="run-b")
    r = subprocess.run(["bash", "scripts/reference_run.sh", "book/x"], cwd=clone,
                       capture_output=True, text=True, timeout=60, env=env)
    assert "reads" not in r.stderr, r.stderr


def test_reference_run_sh_stops_when_the_tree_is_not_its_head_and_no_commit_is_named(tmp_path):
    """The device copy's .git can be the session's first checkout: HEAD there is not the commit
    that runs (run 439fc20 stamped 752cc28). A tracked file that differs from HEAD stops the run
    unless PERFLAB_GIT_COMMIT names the commit; a tree equal to its HEAD runs as before."""
    script, out, env = _script_with_fake_python(tmp_path, "echo ran\n")
    clone = tmp_path / "clone"
    (clone / "book").mkdir()
    (clone / "book" / "a.md").write_text("one\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run(git + args, check=True, capture_output=True)
    run = lambda e: subprocess.run(["bash", str(script), "book/a.md"], capture_output=True,
                                   text=True, timeout=60, env=e)
    assert run(env).returncode == 0                        # the tree is its HEAD
    (clone / "book" / "a.md").write_text("two\n")         # the copy moved on, .git did not
    r = run(env)
    assert r.returncode == 2 and "PERFLAB_GIT_COMMIT" in r.stderr, r.stderr
    assert run({**env, "PERFLAB_GIT_COMMIT": "0" * 40}).returncode == 0


def _live_children(under: Path) -> set[int]:
    """This process's live descendants' pids, read from /proc (zombies left out), that work in
    ``under`` or a folder in it: the kernels of a test's own pages (a kernel works in its page's
    folder), not the suite's background jobs, which start and end beside the test."""
    import os
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found & set(_working_in(under.resolve()))


def test_the_next_page_s_kernel_starts_during_this_page_in_its_own_folder(tmp_path, monkeypatch):
    """With ``--preimport 1`` (nothing run ahead), execute.py starts page k+1's kernel as page
    k's first cell runs: that kernel works in page k+1's folder, runs nothing of page k's, and
    no kernel outlives the run, a failed page's neither."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_nb(tmp_path / "a" / "first.md", "leak = 'first page'", "raise ValueError('on purpose')")
    second = write_nb(tmp_path / "b" / "second.md",
                      "import os\nprint(os.getcwd())\nprint('leak' in dir())")
    before = _live_children(tmp_path)
    started, real = [], preimport.prestart
    monkeypatch.setattr(preimport, "prestart", lambda md: started.append(md) or real(md))
    r = run("--preimport", 1, first, second)
    assert r.returncode == 1 and "on purpose" in r.stdout
    assert started == [second] and "[imports]" not in r.stdout
    outputs = json.loads(second.with_suffix(".ipynb").read_text())["cells"]
    text = "".join("".join(o.get("text", "")) for c in outputs if c["cell_type"] == "code"
                   for o in c["outputs"])
    assert text.split() == [str(tmp_path / "b"), "False"]
    assert _live_children(tmp_path) <= before


def test_leading_imports_are_the_imports_a_cell_begins_with_and_nothing_else():
    cell = ("import os\nfrom pathlib import (Path,\n    PurePath)  # two lines\n"
            "import json as j; import re\n\nx = os.getcwd()\nimport sys\nprint(x)")
    assert preimport.leading_imports(cell) == (
        "import os\nfrom pathlib import (Path,\n    PurePath)\nimport json as j\nimport re")
    # a statement before an import ends them: the import may depend on it (sys.path, environ)
    assert preimport.leading_imports("import sys\nsys.path.insert(0, 'x')\nimport mine") == \
        "import sys"
    assert preimport.leading_imports("%matplotlib inline\nimport torch") == ""
    assert preimport.leading_imports("import torch\n%time x = 1") == "import torch"
    assert preimport.leading_imports("if True:\n    import torch") == ""
    assert preimport.leading_imports("import torch\nx = (") == ""
    assert preimport.leading_imports("") == ""


def _stamping_module(folder: Path, name: str, log: Path, sleep_s: float = 1.0) -> None:
    """A module that, when imported, sleeps ``sleep_s`` and appends 'import NAME START END' to
    ``log``, and whose process appends 'exit NAME' there when it exits in order."""
    (folder / f"{name}.py").write_text(
        "import atexit, time\n"
        f"_t0 = time.time(); time.sleep({sleep_s})\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        f"    f.write(f'import {name} {{_t0}} {{time.time()}}\\n')\n"
        f"atexit.register(lambda: open({str(log)!r}, 'a').write('exit {name}\\n'))\n")


def _stamping_page(folder: Path, name: str, log: Path, sleep_s: float = 1.0) -> Path:
    """A page in ``folder`` whose first cell imports its own stamping module (``sleep_s``) and
    then stamps its own start, and whose second cell stamps its start and end."""
    folder.mkdir(parents=True, exist_ok=True)
    _stamping_module(folder, f"mod_{name}", log, sleep_s)
    stamp = f"with open({str(log)!r}, 'a') as f:\n    f.write(f'cellN {name} {{time.time()}}\\n')"
    cell2 = stamp.replace("cellN", "cell2")
    return write_nb(folder / f"{name}.md",
                    f"import os\nimport time\nimport mod_{name}\n" + stamp.replace("cellN", "cell1")
                    + "\nprint(os.getcwd())",
                    cell2 + "\ntime.sleep(0.3)\n" + cell2)


def _stamps(log: Path) -> dict:
    out = {}
    for line in log.read_text().splitlines():
        kind, name, *times = line.split()
        out.setdefault(kind, {}).setdefault(name.removeprefix("mod_"), []).append(
            [float(t) for t in times])
    return out


def test_imports_run_ahead_side_by_side_once_and_no_cell_runs_beside_them(tmp_path, monkeypatch):
    """``--preimport 2`` on three pages: pages 1 and 2 start their kernels together, each in its
    own folder, and import side by side; page 3, alone in its group, imports in its first cell,
    after page 2's last cell. Every
    cell, the first included, starts after every import it could overlap has ended; each module
    is imported once (the first cell finds it in sys.modules), what follows the imports in the
    first cell runs once, in the page, and every kernel exits in order."""
    log = tmp_path / "stamps.log"
    pages = [_stamping_page(tmp_path / f"d{i}", f"p{i}", log, sleep_s)   # p2's imports last
             for i, sleep_s in ((1, 1.5), (2, 3.0), (3, 1.0))]           # past p1's
    before = _live_children(tmp_path)
    r = run("--preimport", 2, *pages)
    assert r.returncode == 0, r.stdout + r.stderr
    stamps = _stamps(log)
    imports, cell1, cell2 = stamps["import"], stamps["cell1"], stamps["cell2"]
    assert {k: len(v) for k, v in imports.items()} == {"p1": 1, "p2": 1, "p3": 1}
    assert {k: len(v) for k, v in cell1.items()} == {"p1": 1, "p2": 1, "p3": 1}
    (s1, e1), (s2, e2), (s3, e3) = (imports[p][0] for p in ("p1", "p2", "p3"))
    assert max(s1, s2) < min(e1, e2)                       # side by side
    cells = [t for c in (cell1, cell2) for v in c.values() for ts in v for t in ts]
    for start, end in ((s1, e1), (s2, e2), (s3, e3)):
        assert not [t for t in cells if start <= t <= end]   # no cell beside an import
    assert max(e1, e2) < min(cell1["p1"][0][0], cell1["p2"][0][0])
    assert max(t for ts in cell2["p2"] for t in ts) < s3 < e3 < cell1["p3"][0][0]
    assert sorted(stamps["exit"]) == ["p1", "p2", "p3"]    # exit handlers ran
    for i, p in enumerate(pages, 1):                         # each kernel in its page's folder
        nb = json.loads(p.with_suffix(".ipynb").read_text())
        assert nb["cells"][1]["outputs"][0]["text"] == [str(tmp_path / f"d{i}") + "\n"]
    assert r.stdout.count("[imports] 2 page(s)") == 1 and r.stdout.count("[imports]") == 1
    assert r.stdout.count("its imports ran ahead in") == 2    # p3, alone in its group: none
    assert _live_children(tmp_path) <= before


def test_a_failed_or_printing_pre_import_hides_nothing(tmp_path):
    """An import that fails ahead is one line of the log, and the page runs its first cell in a
    fresh kernel, where the real error stops it as before; what an import prints ahead is a
    line of the log too."""
    (tmp_path / "broken.py").write_text("raise ValueError('broken at import')\n")
    (tmp_path / "chatty.py").write_text("print('hello from chatty')\n")
    bad = write_nb(tmp_path / "bad.md", "import broken\nprint('never')")
    good = write_nb(tmp_path / "good.md", "import chatty", "print('fine')")
    r = run("--preimport", 2, bad, good)
    assert r.returncode == 1
    assert "bad.md: its imports failed ahead (ValueError: broken at import); the page runs its " \
           "first cell in a fresh kernel" in r.stdout
    assert "code cell 1 ('import broken') failed: ValueError: broken at import" in r.stdout
    assert "good.md: its imports, run ahead, printed: hello from chatty" in r.stdout
    assert good.with_suffix(".ipynb").exists() and not bad.with_suffix(".ipynb").exists()


def test_an_interrupted_call_shuts_every_kernel_down_in_order(tmp_path, monkeypatch):
    """A call stopped in its second page (Ctrl-C) shuts down the first page's kernel, the
    second's and the third's, never used, in order: each one's exit handlers run, none outlives
    the call."""
    log = tmp_path / "stamps.log"
    pages = [_stamping_page(tmp_path / f"d{i}", f"p{i}", log) for i in (1, 2, 3)]
    real = execute.execute

    def interrupt():
        raise KeyboardInterrupt

    def stop_in_page_2(md, *args, **kw):     # Ctrl-C as page 2's first cell begins
        return real(md, *args, **{**kw, "then": interrupt} if md == pages[1] else kw)
    monkeypatch.setattr(execute, "execute", stop_in_page_2)
    before = _live_children(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run("--preimport", 3, *pages)
    stamps = _stamps(log)
    assert sorted(stamps["exit"]) == ["p1", "p2", "p3"] and sorted(stamps["cell1"]) == ["p1"]
    assert _live_children(tmp_path) <= before


#: runs the imports it is given with CUDA faked present and every call that would initialize it
#: refused and recorded, and records every file opened that is not code; prints both as JSON
_IMPORT_PROBE = r'''
import json, sys
import torch
refused = []
def refuse(name):
    def call(*args, **kwargs):
        refused.append(name)
        raise RuntimeError(name + " called at import time")
    return call
for name in ("_lazy_init", "init", "get_device_properties", "mem_get_info", "set_device",
             "current_device", "synchronize", "get_device_name", "get_device_capability",
             "memory_allocated", "reset_peak_memory_stats"):
    setattr(torch.cuda, name, refuse("torch.cuda." + name))
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
opened = []
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and not args[0].endswith((".py", ".pyc", ".so")):
        opened.append(args[0])
sys.addaudithook(audit)
exec(compile(sys.stdin.read(), "<the pages' imports>", "exec"), {})
print(json.dumps({"refused": refused, "opened": sorted(set(opened))}))
'''


def test_what_runs_ahead_initializes_no_gpu_and_reads_nothing_a_page_writes():
    """The imports every page's first cell begins with (what execute.py runs ahead, in idle
    kernels beside other pages' measurements), run together with CUDA faked present: no call
    initializes the device (an idle kernel holding a CUDA context would shift chapter 7's
    ``torch.cuda.mem_get_info`` and take ~0.5 GiB from the page measuring), and no file is
    opened that a page writes or reads from another page's run (the pages' folders and
    notebooks, perflab's data and its data cache): such a file would be read before the page
    that writes it has run."""
    pages = [p for g in ("book/*.md", "labs/*.md", "pending/*/*.md") for p in sorted(ROOT.glob(g))
             if p.name != "README.md"]
    code = "\n".join(preimport.leading_imports(src) for p in pages
                     if (src := preimport.first_cell(p)))
    assert code.count("import torch") >= len(pages) - 2       # the pages' imports, all read
    r = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], input=code, cwd=ROOT / "book",
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.splitlines()[-1])
    assert found["refused"] == []
    import os
    written = [ROOT / d for d in ("book", "labs", "pending", "perflab", ".cache/perflab")]
    written += [Path(os.environ["PERFLAB_DATA_DIR"])] if os.environ.get("PERFLAB_DATA_DIR") else []
    bad = [p for p in found["opened"] if p.endswith(".ipynb")
           or any(Path(p).resolve().is_relative_to(w) for w in written)]
    assert bad == [], bad


def test_sigterm_shuts_every_kernel_down_in_order(tmp_path):
    """SIGTERM (a time limit's ``timeout``) while a page runs: execute.py exits with 143 after
    shutting down the running page's kernel and the next page's, imported ahead and idle, in
    order (their exit handlers run); none outlives it."""
    import os
    import signal
    import time
    log = tmp_path / "stamps.log"
    first, second = (_stamping_page(tmp_path / f"d{i}", f"p{i}", log, 0.1) for i in (1, 2))
    first.write_text(first.read_text().replace(
        "time.sleep(0.3)", f"open({str(tmp_path / 'running')!r}, 'w').close()\ntime.sleep(300)", 1))
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--preimport", "2", str(first), str(second)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "running").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the first page's second cell never began"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert sorted(_stamps(log)["exit"]) == ["p1", "p2"], out
    assert _working_in(tmp_path) == []                     # no kernel left in the pages' folders


def _working_in(folder: Path) -> list[int]:
    """The live processes whose working folder is ``folder`` or under it (/proc)."""
    import os
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(folder) and \
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_record_cpu_runs_nothing_ahead_so_a_duration_is_its_page_s_own(tmp_path, monkeypatch):
    """``--record-cpu`` stores each page's duration for the instructor page's CPU column: by
    default it runs no imports ahead, so each duration holds its own page's imports."""
    recorded = []
    monkeypatch.setattr(execute, "record_cpu_run", lambda md, s: recorded.append(md))
    pages = [write_nb(tmp_path / f"{n}.md", "import os", "x = 1") for n in ("a", "b")]
    r = run("--record-cpu", *pages)
    assert r.returncode == 0 and recorded == pages and "[imports]" not in r.stdout, r.stdout


@pytest.mark.parametrize("group", [1, 2])
def test_a_kernel_that_fails_to_start_ahead_is_a_log_line_and_the_call_goes_on(
        tmp_path, monkeypatch, group):
    """A kernel that cannot start ahead (ports, a file limit) stops nothing: the log says so, the
    page starts its own kernel and runs, and so do the pages after it."""
    pages = [write_nb(tmp_path / f"p{i}.md", "import os", f"print('page {i}')") for i in range(3)]
    real = preimport.prestart

    def flaky(md):
        if md.name == "p1.md":
            raise OSError("no ports left")
        return real(md)
    monkeypatch.setattr(preimport, "prestart", flaky)
    before = _live_children(tmp_path)
    r = run("--preimport", group, *pages)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "p1.md: its kernel did not start ahead (OSError: no ports left); the page starts " \
           "its own" in r.stdout
    assert all(p.with_suffix(".ipynb").exists() for p in pages)
    assert _live_children(tmp_path) <= before


def test_a_kernel_started_ahead_keeps_its_history_in_memory(tmp_path):
    """As nbclient's own kernels: no IPython history database written to disk."""
    page = write_nb(tmp_path / "h.md", "import os",
                    "print(get_ipython().history_manager.hist_file)")
    other = write_nb(tmp_path / "o.md", "import os", "print('o')")
    r = run("--preimport", 2, page, other)
    assert r.returncode == 0, r.stdout + r.stderr
    cells = json.loads(page.with_suffix(".ipynb").read_text())["cells"]
    text = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                   for o in c["outputs"])
    assert text.strip() == ":memory:"
