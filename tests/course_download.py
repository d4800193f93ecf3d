"""Test helper: the course download, unpacked and installed in a fresh environment, as its README says.

One home for what ``tests/test_reader.py`` (the zip the book's build writes) and the executions
of chapter 8 and lab 8 (``tests/test_chapters.py``, ``tests/lab_runs.py``) need: unpack a course
zip, make a virtual environment that sees this interpreter's packages (torch, jupyter) but not the
repository's own ``perflab``, and ``pip install`` the unpacked course into it without network.

Chapter 8 and lab 8 (:data:`FROM_DOWNLOAD`) are executed from such an install instead of from the
repository (issue 39: "the download, unzipped on a fresh CPU machine and installed as its README
says, runs chapter 8 and lab 8 (reference answers) without error; CI proves it"). Their zip is
the one the book's build writes (``_ext/reader_pages.write_bundle`` of ``bundle_members``), made
here from the repository without a book build, so that the executions the tests already make are
the download's: no page runs twice, and CI pays only the unpacking and the install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
import venv
import zipfile
from pathlib import Path

import background

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import reader_pages  # noqa: E402

#: pages executed from the installed course download rather than from the repository (stems)
FROM_DOWNLOAD = ("08_distributed_training", "08_distributed")


def from_download(page: Path) -> bool:
    """Whether ``page`` (a chapter or lab source) is executed from the installed download."""
    return Path(page).stem in FROM_DOWNLOAD


def fresh_env(tmp: Path) -> Path:
    """A virtual environment (without pip or setuptools of its own) that sees this test's
    packages (torch, jupyter, setuptools ...) but not the repository's own perflab: a ``.pth``
    adds this interpreter's site-packages as plain paths, so the editable install's hook (a
    ``.pth`` of its own) is not run. Returns its python."""
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "course_test_parent.pth").write_text("\n".join(ours) + "\n")
    return python


def clean_env(tmp: Path) -> dict[str, str]:
    """The environment a reader's run starts from: no PYTHONPATH or virtual environment of the
    session's, no user kernelspec that could stand in for the fresh environment's, CPU sizes."""
    env = {k: v for k, v in background.environ().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH")}
    env["JUPYTER_DATA_DIR"] = str(tmp / "jupyter-data")   # no user kernelspec can stand in for ours
    env["PERFLAB_FORCE_CPU_SIZES"] = "1"
    return env


def install(bundle: Path, tmp: Path, drop: str | None = None) -> tuple[Path, Path, dict[str, str]]:
    """Unpack ``bundle`` under ``tmp`` (without the folder ``drop``, to prove it is needed) and
    install it in a fresh environment without network (``pip install --no-deps
    --no-build-isolation --no-index``). Returns ``(course folder, its python, environment)``;
    raises AssertionError when the install fails or (unless ``drop == "perflab"``) the
    environment's ``perflab`` is not the download's."""
    tmp = Path(tmp).resolve()
    course = tmp / "course"
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(course)
    if drop:
        import shutil

        shutil.rmtree(course / drop)
    python = fresh_env(tmp)
    env = clean_env(tmp)
    # this interpreter's pip installs into the fresh environment (pip >= 22.3: --python)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", str(course)],
                          capture_output=True, text=True, env=env, cwd=tmp)
    assert done.returncode == 0, f"pip could not install the course download:\n{done.stderr[-2000:]}"
    where = subprocess.run([str(python), "-c", "import perflab, sys; print(perflab.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp)
    if drop != "perflab":
        assert where.returncode == 0 and str(tmp / "venv") in where.stdout, (
            f"perflab in the fresh environment is not the course download's: {where.stdout}{where.stderr}")
    env["PERFLAB_EXPECT_INSTALLED_IN"] = str(tmp / "venv")   # tests/lab_runs.py checks its kernel
    return course, python, env


def write_course_zip(target: Path) -> Path:
    """The course zip of this repository, as the book's build writes it (reader edition)."""
    return reader_pages.write_bundle(target, reader_pages.bundle_members(ROOT))


_INSTALLED: dict[str, tuple[Path, Path, dict[str, str]]] = {}
_LOCK = threading.Lock()


def installed(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    """This repository's course download, written, unpacked and installed under ``tmp`` the
    first time in this process (the jobs of chapter 8 and lab 8 run in threads of the test
    session: they share one install, ~15 s of a loaded CI machine each); later calls return
    that install."""
    with _LOCK:
        if "course" not in _INSTALLED:
            tmp = Path(tmp)
            tmp.mkdir(parents=True, exist_ok=True)
            _INSTALLED["course"] = install(write_course_zip(tmp / reader_pages.BUNDLE_NAME), tmp)
        course, python, env = _INSTALLED["course"]
        return course, python, dict(env)


def execute(md: Path, out: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """``scripts/execute.py --out OUT/executed PAGE`` run by the installed download (in
    ``OUT/download``) on its own copy of ``md``: the execution of a page of
    :data:`FROM_DOWNLOAD`. The returned process's ``args`` hold ``--out`` and its folder."""
    course, python, env = installed(Path(out) / "download")
    rel = Path(md).resolve().relative_to(ROOT)
    return background.run([str(python), "scripts/execute.py", "--out", str(Path(out) / "executed"),
                           "--timeout", str(int(timeout_s)), str(rel)], timeout_s + 300, env=env, cwd=course)
