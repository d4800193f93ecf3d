"""pytest set-up for every test path (tests/, and the notebooks under book/ and labs/ that nbval
runs): every cache and scratch file stays inside the clone.

Tests, and the notebook kernels nbval starts (they inherit this environment), write only under
the clone's ``.cache/`` (git-ignored) or pytest's ``tmp_path`` (itself under ``.cache/tmp``).
``TMPDIR`` is the setting that matters most: Inductor keeps its precompiled C++ headers in
``tempfile.gettempdir()/torchinductor_<user>/precompiled_headers`` (torch/_inductor/codecache.py,
``_HEADER_DIR``), which ``TORCHINDUCTOR_CACHE_DIR`` does not move, and the notebooks' scratch
folders (``tempfile.mkdtemp``) go there too. The Makefile sets the same variables. This file sits
at the root so that ``pytest labs/04_profiling.ipynb`` gets it too (tests/conftest.py applies
only to tests/).
"""

import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache"
for name, sub in (("TMPDIR", "tmp"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                  ("TORCH_EXTENSIONS_DIR", "torch_extensions"), ("TRITON_CACHE_DIR", "triton"),
                  ("XDG_CACHE_HOME", "xdg"), ("MPLCONFIGDIR", "matplotlib"), ("IPYTHONDIR", "ipython"),
                  ("JUPYTER_RUNTIME_DIR", "jupyter_runtime")):
    path = Path(os.environ.get(name) or CACHE / sub)
    if not path.resolve().is_relative_to(ROOT.resolve()):
        path = CACHE / sub  # a setting outside the clone (the usual /tmp, ~/.cache) is what this prevents
    os.environ[name] = str(path)
    path.mkdir(parents=True, exist_ok=True)
tempfile.tempdir = None  # gettempdir() reads TMPDIR again

# A test session runs two to four torch processes on CI's two cores (the test process, two
# background jobs, their DataLoader workers and gloo ranks). libgomp's default lets a thread that
# finished its share of a parallel region spin for ~300,000 turns before it sleeps: with more
# busy threads than cores, that spinning takes the core from another process's work. Passive
# waiting gives it up at once: one page executed beside two busy loops (8 December, 2-core host,
# 06_4_ladder and 07_single_gpu_memory_reduce, two runs each) took 25-40 % fewer CPU seconds and
# ~25 % less wall time, with every cell run. Only the tests' processes are affected (a reader's
# or the GPU reference run's environment is theirs); a setting already made is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Pages of the book whose revised source waits in pending/ keep their older run on show (code and
# outputs frozen together, with a note of their known defects); their old code is not executed.
# tests/test_pending.py and the lab tests execute the revised sources instead (tests/pages.py).
_archived = []
for _folder in ("book", "labs"):
    for _md in sorted((ROOT / _folder).glob("*.md")):
        if (ROOT / "pending" / _folder / _md.name).exists():
            _archived.append(str(_md.with_suffix(".ipynb").relative_to(ROOT)))
collect_ignore = _archived


# Nothing outside the clone: a test run that leaves files in the system's temporary folder fails
# (torchrun's torchelastic_* logs, Inductor's torchinductor_* headers, Jupyter connection files,
# multiprocessing's pymp-* folders...). Every setting above points children into .cache/; this
# is the proof. Only names that this project's tools create are looked at: other programs may
# share /tmp (a browser, a package manager, another user's shell).
_SYSTEM_TMP = Path("/tmp")
_OURS = ("torchinductor_", "torchelastic_", "tmp", "perflab", "pytest-of-", "pymp-", "matplotlib",
         "kernel-", "triton", "jupyter", "ipython", "nbval")


def _tmp_entries() -> set[str]:
    try:
        return set(os.listdir(_SYSTEM_TMP))
    except OSError:
        return set()


_TMP_BEFORE = _tmp_entries()


# Nor may a test change a committed file: the tests once pointed every later kernel at
# perflab/data/reference_ceilings.json, and lab 1 wrote this CPU's ceilings into it.
def _modified() -> set[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.stdout.splitlines()) if out.returncode == 0 else set()


_MODIFIED_BEFORE = _modified()


def pytest_sessionfinish(session, exitstatus):
    changed = sorted(_modified() - _MODIFIED_BEFORE)
    if changed:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the test run changed {len(changed)} committed file(s): {', '.join(changed[:10])}",
            red=True)
        session.exitstatus = 1
    new = sorted(n for n in _tmp_entries() - _TMP_BEFORE if n.startswith(_OURS))
    if new:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the test run left {len(new)} new entr(y/ies) in {_SYSTEM_TMP} (nothing may "
            f"leave the clone): {', '.join(new[:10])}", red=True)
        session.exitstatus = 1
