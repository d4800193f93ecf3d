#!/usr/bin/env python3
"""The reference run: execute the course's MyST notebooks and write their ``.ipynb`` with provenance.

    python scripts/execute.py [PATHS ...]    # default: every notebook in _toc.yml
    python scripts/execute.py --check        # execute nothing; list what is missing or stale
    python scripts/execute.py --sync         # copy prose edits from .md into .ipynb (no execution)
    python scripts/execute.py --out DIR ...  # write the executed .ipynb files under DIR instead
    python scripts/execute.py --pack T.tgz   # also pack what the run wrote, after each notebook

Each ``.md`` (jupytext ``md:myst``) is executed with nbclient in its own folder, cell by cell,
under a per-notebook time limit, and its paired ``.ipynb`` is written with outputs and
``metadata.reference_run`` (a :class:`perflab.record.runs.ReferenceRun`; docs/ARCHITECTURE.md). A failing
cell stops that notebook, prints the cell's error, leaves the old ``.ipynb`` untouched, and makes
the exit status 1; the other notebooks still run. A missing path, a file that is not a notebook
or contradictory options: one line on stderr, exit 2.

**Imports ahead** (:mod:`preimport`, ``scripts/preimport.py``). A page's first code cell is its
imports, which measure nothing. ``--preimport N`` pages at a time (default: every page of the
call where there is a CUDA device; 2 elsewhere, since each idle kernel holds ~0.3-0.5 GB; 1 with
``--record-cpu``, whose durations are each page's own) have their kernels started together, each
in its page's folder, and run the import statements their first cells begin with, side by side
and silently; the first of them runs its first cell only once every one has replied, so no cell
runs beside import work. Each first cell then runs as written and is recorded as before, without
the imports' seconds (``cell_seconds`` and ``duration_s`` leave them out; the page's log line
gives them). A pre-run that fails or prints is one line of the log; a page whose imports failed
runs its first cell in a fresh kernel, where the error shows. Each kernel is shut down in order
(its exit handlers run) after its page, and those not used yet when the call ends, fails or gets
SIGTERM. ``--preimport 1`` runs nothing ahead (the next page's kernel starts while this page runs
its first cell).

On a GPU machine the run also records, in ``reference_run``, ``gpu_memory_peak_bytes`` (the
largest rise of any GPU's used memory, NVML sampled every 0.2 s, which the instructor page quotes
as the memory a lab needs), ``cell_seconds`` (each code cell's duration) and ``ceilings`` (the
run's ceilings file as the notebook read it). ``--record-cpu`` (on a machine without a GPU)
executes as usual, writes no ``.ipynb``, and stores each notebook's duration in
``labs/cpu_runs.json`` (with the CPU and core count), for the instructor page's CPU column.

``--pack TGZ`` writes, after each notebook, every file the run has written so far under
``book/``, ``labs/``, ``perflab/data/`` (and ``--out`` where it lies in the clone) to one gzip
tar: a run stopped at its time limit still brings back what it finished (a device machine
returns a few files only). Notebooks are written atomically, so the archive never holds half
of one.

Each page declares how many GPUs its reference run needs (front matter ``perflab: {gpus: N}``,
:func:`perflab.record.runs.required_gpus`). A run refuses, in one line, to write the reference run of a
page on a machine with fewer GPUs than it declares (exit 2 for a page named on the command line;
in a run of the whole table of contents such a page is skipped with that line): ``--out DIR``
writes a scratch run elsewhere instead. On a machine without CUDA it also refuses (one line,
exit 2) to overwrite an ``.ipynb`` that holds a GPU reference run, unless ``--allow-cpu`` is
given or ``--out`` sends the output elsewhere.

Sources that wait for a machine kind that is not lent live in ``pending/`` (outside the table of
contents, :func:`perflab.record.runs.pending_sources`); ``pending/book/X.md`` runs with ``book/`` as its
working folder (where it will live) and writes ``pending/book/X.ipynb``. ``--check`` lists them,
and the pages that need more GPUs than one, with what they wait for, without failing on them.

``--check`` lists each one-GPU notebook of the table of contents (and any other page the course
download ships, :data:`SHIPPED_PAGES`) that is not current (:func:`perflab.record.runs.status`: missing, stale, no metadata, not from a CUDA device) or
whose prose or presentation cell metadata (tags, figure captions) differs (fix that with
``--sync``; the others need a run on a GPU machine), saying why. A run records, beside the hash of
the notebook's code cells, a hash of each perflab module that code imports (found statically and
transitively, :func:`perflab.record.runs.perflab_sha256`): **page code and package code are
stale alike**, so an edit to either marks the page stale and ``--check`` names the cells or the
modules. It also refuses a book whose current pages read different ceilings files (the pages of
one run come from one machine: :func:`mixed_ceilings`). Exit status of ``--check``: 0 when every
one-GPU notebook is current; 3 when the only problems are runs that only a GPU machine can
make: stale runs (the pages show their stale banner) and pages awaiting their first run (a page
added or split off since the last reference run: the book leaves it out and the status page
lists it as not executed yet); CI warns on 3. 1 for anything else (a run from a CPU, a run
without metadata, prose drift, mixed ceilings). A page that
needs several GPUs is listed with what it waits for and fails the check only when its code or
prose no longer matches the run it shows.

**One run, one machine.** ``--run-id ID`` (or ``$PERFLAB_RUN_ID``) names the reference run a
call belongs to; a run split over several calls passes the same id to each. The run's ceilings
(and the host's per-call costs, :mod:`perflab.machine.ceilings`) are measured fresh at the
start of every run and reused by a later call only on the same host and GPU (host id and GPU
UUID); when a call lands on another machine they are measured again and the line printed says
that the host changed. A call gets the file an earlier call of its run measured only if the
tree still holds it: on the device machine, whose every call brings a fresh tree,
``scripts/reference_run.sh`` puts back what the run's earlier calls wrote. One run on one host
whose pages read several ceilings files is stale (exit 3), not another machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # perflab, without requiring an install

try:
    import jupytext
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
except ImportError as err:  # the script's one dependency check: say which environment to use
    print(f"execute.py: {err.name} is not installed in {sys.executable}; run it with the course's "
          "environment (`make test` creates .venv; then .venv/bin/python scripts/execute.py), "
          "or pip install -e '.[book]'", file=sys.stderr)
    sys.exit(2)

import torch  # noqa: E402

from perflab.core.device import cpu_name  # noqa: E402
from perflab.core.sampler import MemoryPeak  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402
from perflab.machine import ceilings  # noqa: E402
from perflab.record import runs  # noqa: E402
from perflab.record.ceilings import read as read_ceilings  # noqa: E402
import preimport  # noqa: E402  (scripts/preimport.py, beside this file)


class NotANotebook(Exception):
    """A path that does not exist or is not a jupytext MyST notebook."""


# ---------------------------------------------------------------------------------------------
# Finding notebooks
# ---------------------------------------------------------------------------------------------

def resolve(path: str) -> Path:
    """The ``.md`` source for a path given on the command line (``.md``, ``.ipynb`` or no suffix).

    Raises:
        NotANotebook: no such file, or not a jupytext MyST notebook.
    """
    p = Path(path)
    candidates = [p] if p.suffix == ".md" else [p.with_suffix(".md")] if p.suffix in ("", ".ipynb") else [p]
    md = candidates[0]
    if not md.exists():
        if not p.exists():
            raise NotANotebook(f"{path}: no such file")
        raise NotANotebook(f"{path}: not a notebook source (expected a MyST .md beside it)")
    if md.suffix != ".md" or not runs.is_myst_notebook(md):
        raise NotANotebook(f"{path}: not a jupytext MyST notebook (no 'format_name: myst' front matter)")
    return md.resolve()


#: the notebook sources the course download ships (``_ext/reader_pages.BUNDLE_FILES``; a test
#: keeps the two alike): ``--check`` covers each, in the table of contents or not
SHIPPED_PAGES = ("book/*.md", "labs/*.md")


def default_notebooks(pending: bool = False, shipped: bool = False) -> list[Path]:
    """Every entry of ``_toc.yml`` that is a MyST notebook source, in book order; with
    ``shipped``, then every other source the course download ships (:data:`SHIPPED_PAGES`); with
    ``pending``, then every source waiting in ``pending/``."""
    out = []
    for entry in runs.toc_files(ROOT / "_toc.yml"):
        md = ROOT / (entry if entry.endswith(".md") else entry + ".md")
        if md.exists() and runs.is_myst_notebook(md):
            out.append(md.resolve())
    if shipped:
        out += [p.resolve() for g in SHIPPED_PAGES for p in sorted(ROOT.glob(g))
                if runs.is_myst_notebook(p) and p.resolve() not in out]
    if pending:
        out += [p.resolve() for p in runs.pending_sources(ROOT)]
    return out


def gpus_here() -> int:
    """CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def too_few_gpus(md: Path) -> str | None:
    """One line when this machine has fewer GPUs than ``md`` declares, else None."""
    need, have = runs.required_gpus(md), gpus_here()
    if have >= need or (have == 0 and need == 1):
        return None  # a CPU machine: the GPU-run guard in main() decides
    return (f"{_rel(md)} needs {need} GPU(s) and this machine has {have}: its reference run is "
            "not written here (use --out DIR for a scratch run)")


# ---------------------------------------------------------------------------------------------
# Comparing a source with its executed notebook
# ---------------------------------------------------------------------------------------------

def _cells(nb, kind: str) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == kind]


# Keys of a code cell's metadata that a run writes; every other key (tags, mystnb's figure
# options, perflab.measured_on, nbgrader) is presentation, copied from the source by --sync.
RUN_METADATA = ("execution",)


def _presentation(nb) -> list[dict]:
    """Each code cell's metadata that says how the book shows it (not what the run wrote)."""
    return [{k: v for k, v in c.metadata.items() if k not in RUN_METADATA}
            for c in nb.cells if c.cell_type == "code"]


def _drifted(md: Path) -> bool:
    """True when the ``.md``'s prose or its code cells' presentation metadata differ from its
    ``.ipynb`` (what ``--sync`` copies without a run)."""
    src = jupytext.read(md)
    out = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    return (_cells(src, "markdown") != _cells(out, "markdown")
            or _presentation(src) != _presentation(out))


STALE = "stale: "     # every line about a stale run (page code or perflab code) starts so
AWAITING = "awaiting its first reference run: "   # and every line about a page never run
STATUS_WORDS = {
    "missing": AWAITING + "no executed .ipynb (run scripts/execute.py on a GPU machine)",
    "no-metadata": "the .ipynb has no reference_run metadata (re-run on a GPU machine)",
    "stale": STALE + "its code differs from the executed .ipynb (re-run on a GPU machine)",
    "cpu": "the reference run was not on a CUDA device",
}
PERFLAB_STALE = STALE + "perflab modules it imports changed since the run (re-run on a GPU machine): "
RE_MEASURED = ("stale: one run, one host, several ceilings files (each call measured them "
               "again; re-run the pages in one sequence of calls): ")
INPUT_STALE = STALE + "a page it reads was run after it (re-run it after them on a GPU machine): "
PROSE_DRIFT = "prose or cell metadata (tags, figure captions) differs from the .ipynb"
EXIT_STALE_ONLY = 3   # --check: only runs a GPU machine must make: stale (page code or perflab
#                       alike) or awaiting their first run (module docstring)


def _rel(md: Path) -> Path:
    return md.relative_to(ROOT) if md.is_relative_to(ROOT) else md


def waiting(md: Path) -> str | None:
    """One line saying what a page that needs several GPUs (or waits in ``pending/``) waits for,
    or None for a one-GPU page of the table of contents (those must be current)."""
    gpus = runs.required_gpus(md)
    pending = md.is_relative_to(ROOT / runs.PENDING)
    if gpus <= 1 and not pending:
        return None
    st = runs.status(md)
    kind = f"a machine with {gpus} GPUs" if gpus > 1 else "its run"
    if pending:
        shown = "no reference run yet" if st.state == "missing" else f"run: {st.words}"
        return f"{_rel(md)}: needs {gpus} GPU(s), waits in pending/ for {kind} ({shown})"
    later = runs.pending_replacement(md)
    run = st.run
    shown = (f"shows the run of {run.started[:10]} on {run.devices_text}" if run and run.started
             else st.words)
    if later is not None:
        n = runs.required_gpus(later)
        kind = f"a machine with {n} GPUs" if n > 1 else "its run on one GPU"
        return (f"{_rel(md)}: needs {gpus} GPUs; {shown} of an older source; its revised "
                f"source {_rel(later)} waits for {kind}")
    return f"{_rel(md)}: needs {gpus} GPUs; {shown} ({st.words})"


def problems(md: Path) -> list[str]:
    """Why ``md``'s ``.ipynb`` is not a current reference run (empty list: it is): the staleness
    decision of :func:`perflab.record.runs.status`, plus prose that ``--sync`` would copy. Every
    line about a stale run (page code or perflab) contains :data:`STALE`. For a page that needs several GPUs
    or waits in ``pending/`` (:func:`waiting`), only a run that no longer matches the page's code
    or prose is a problem: the rest waits for its machine."""
    rel = _rel(md)
    st = runs.status(md)
    if waiting(md) is not None:
        found = []
        if st.state == "stale" and st.cause == "code" and runs.pending_replacement(md) is not None:
            found.append(f"{rel}: {STATUS_WORDS['stale']}; the run it shows must stay the run of "
                         "its code (revise the source in pending/ instead)")
        if st.state not in ("missing",) and _drifted(md):
            found.append(f"{rel}: {PROSE_DRIFT} (python scripts/execute.py --sync {rel})")
        return found
    if st.ok:
        found = []
    elif st.cause == "perflab":
        found = [f"{rel}: {PERFLAB_STALE}{', '.join(st.changed)}"]
    elif st.cause == "input":
        found = [f"{rel}: {INPUT_STALE}{', '.join(st.changed)}"]
    else:
        found = [f"{rel}: {STATUS_WORDS[st.state]}"
                 + (f" (devices={list(st.run.devices)})" if st.state == "cpu" else "")]
    # a page whose code changed also gets its prose from the run that makes it current
    if st.state not in ("missing", "stale") and _drifted(md):
        found.append(f"{rel}: {PROSE_DRIFT} (python scripts/execute.py --sync {rel})")
    return found


def sync_prose(md: Path) -> bool:
    """Copy the ``.md``'s markdown cells, and its code cells' presentation metadata (tags,
    figure captions, the measuring device; not what the run wrote), into its ``.ipynb``,
    keeping outputs; True if written.

    Refuses (returns False) when the code differs: then the notebook needs a real run.
    """
    ipynb = md.with_suffix(".ipynb")
    if not ipynb.exists():
        return False
    src = jupytext.read(md)
    out = nbformat.read(ipynb, as_version=4)
    if _cells(src, "code") != _cells(out, "code"):
        return False
    executed = iter([c for c in out.cells if c.cell_type == "code"])
    # keep the markdown cells' ids where the cells line up (jupytext makes new random ones),
    # so a reworded sentence is a one-line diff
    old_ids = [c.get("id") for c in out.cells if c.cell_type == "markdown"]
    new_md = [c for c in src.cells if c.cell_type == "markdown"]
    if len(old_ids) == len(new_md):
        for cell, old_id in zip(new_md, old_ids):
            if old_id:
                cell["id"] = old_id
    cells = []
    for cell in src.cells:
        if cell.cell_type == "code":
            ran = next(executed)
            ran.metadata = nbformat.from_dict({
                **{k: v for k, v in cell.metadata.items() if k not in RUN_METADATA},
                **{k: v for k, v in ran.metadata.items() if k in RUN_METADATA}})
            cells.append(ran)
        else:
            cells.append(cell)
    out.cells = cells
    _write(out, ipynb)
    return True


# ---------------------------------------------------------------------------------------------
# Executing
# ---------------------------------------------------------------------------------------------

def _git_commit() -> str | None:
    env = os.environ.get("PERFLAB_GIT_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _error_text(cell) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename')}: {output.get('evalue')}"
    return "unknown error"


FAILED = ".cache/failed"   # a failed notebook, as it stopped (packed with the run's files)


def _keep_failed(nb, md: Path) -> str:
    """Write the notebook that failed, with its outputs and the error, under :data:`FAILED`
    (a run on a device machine brings it back in its pack), so the failure can be read."""
    rel = md.relative_to(ROOT) if md.is_relative_to(ROOT) else Path(md.name)
    path = (ROOT / FAILED / rel).with_suffix(".ipynb")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(nb, path)
    return str(path.relative_to(ROOT))


def _traceback_tail(cell, lines: int = 12) -> str:
    """The last ``lines`` lines of the cell's traceback, without terminal colours."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            text = "\n".join(output.get("traceback", []))
            text = re.sub(r"\x1b\[[0-9;]*m", "", text)
            return "\n".join("    " + t for t in text.splitlines()[-lines:])
    return ""


def execute(md: Path, timeout_s: float, index: str, target: Path | None = None,
            write: bool = True, km: KernelManager | None = None,
            then=None) -> tuple[bool, float, str]:
    """Execute one notebook; write its ``.ipynb`` (to ``target``, default beside ``md``) on
    success unless ``write`` is false. Returns (ok, seconds, message). ``km``: a kernel started
    for this page ahead of it (:class:`preimport.Ahead`; shut down here); ``then``: called once,
    just before the first code cell runs (:meth:`preimport.Ahead.then`)."""
    try:
        return _execute(md, timeout_s, index, target, write, km, then)
    finally:
        if km is not None and km.has_kernel:    # in order: its exit handlers run
            km.shutdown_kernel()


def _execute(md, timeout_s, index, target, write, km, then):
    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    client = NotebookClient(nb, km=km, timeout=int(timeout_s), kernel_name="python3",
                            resources={"metadata": {"path": str(runs.home(md))}},
                            store_widget_state=True)
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    cell_seconds = []
    try:
        with MemoryPeak(interval_s=0.2) as memory, client.setup_kernel():
            for n, i in enumerate(code_cells, 1):
                left = timeout_s - (time.monotonic() - t0)
                if left <= 0:
                    raise CellTimeoutError(f"notebook time limit of {timeout_s:.0f} s reached before cell {i}")
                client.timeout = max(1, int(left))
                if sys.stderr.isatty():
                    print(f"\r{index} {md.name}: cell {n}/{len(code_cells)}", end="", file=sys.stderr, flush=True)
                if n == 1 and then is not None:
                    then()
                t_cell = time.monotonic()
                client.execute_cell(nb.cells[i], i)
                cell_seconds.append(round(time.monotonic() - t_cell, 2))
            client.set_widgets_metadata()
    except CellExecutionError:
        cell = nb.cells[i]
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        kept = _keep_failed(nb, md)
        return False, time.monotonic() - t0, (
            f"code cell {n} ({first[:60]!r}) failed: {_error_text(cell)}\n"
            f"{_traceback_tail(cell)}\n(the notebook as it stopped: {kept})")
    except CellTimeoutError as err:
        return False, time.monotonic() - t0, f"timed out: {err}"
    finally:
        if km is not None and client.kc is not None:   # not nbclient's to stop
            client.kc.stop_channels()
        if sys.stderr.isatty():
            print("\r" + " " * 80 + "\r", end="", file=sys.stderr, flush=True)
    duration = time.monotonic() - t0
    if not write:
        return True, duration, "ok (not written)"
    extra = {"cell_seconds": tuple(cell_seconds), "ceilings": _ceilings_used()}
    if memory.peak is not None:
        extra["gpu_memory_peak_bytes"] = int(memory.peak)
    extra["perflab_sha256"] = runs.perflab_sha256(_cells(nb, "code"))
    run = runs.ReferenceRun.now(started.strftime("%Y-%m-%dT%H:%M:%SZ"), duration,
                                runs.code_sha256(_cells(nb, "code")), _git_commit(), **extra)
    nb.metadata["reference_run"] = run.as_metadata()
    nb.metadata.setdefault("jupytext", {})["formats"] = "ipynb,md:myst"
    target = target or md.with_suffix(".ipynb")
    target.parent.mkdir(parents=True, exist_ok=True)
    _write(nb, target)
    return True, duration, f"ok on {', '.join(run.devices)}"


def _write(nb, path: Path) -> None:
    """Write ``nb`` to ``path`` atomically: a copy taken meanwhile (``--pack``) never holds
    half a notebook."""
    tmp = path.with_name(path.name + ".tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


PACKED = ("book", "labs", "pending", "perflab/data", FAILED)


#: the most raw bytes one archive of ``--pack`` holds: a device machine returns files of at most
#: 16 MiB each (eight at most), so a run that writes more is packed into several parts
PACK_PART_BYTES = 15 * 2**20


def written_since(since: float, root: Path = ROOT, folders=PACKED) -> list[Path]:
    """Every file under ``root / folder`` (for each of ``folders``) modified at or after
    ``since`` (seconds since the epoch), sorted; temporaries (``*.tmp``) left out. What
    :func:`pack` and :func:`keep` carry."""
    return sorted(p for folder in folders if (root / folder).is_dir()
                  for p in (root / folder).rglob("*")
                  if p.is_file() and not p.name.endswith(".tmp") and p.stat().st_mtime >= since)


def pack(archive: Path, since: float, root: Path = ROOT, folders=PACKED,
         part_bytes: int = PACK_PART_BYTES) -> int:
    """Write every file under ``root / folder`` (for each of ``folders``) modified at or after
    ``since`` (seconds since the epoch) into the gzip tar ``archive``, named relative to
    ``root``; atomically (a temporary file, then a rename). Returns the number of files.

    The reference run calls it after each notebook, so a run stopped at a time limit still
    leaves the notebooks it finished (and the files they wrote) in one archive: the device
    machine returns at most eight files of 16 MiB. When the files hold more than
    ``part_bytes`` (uncompressed), the rest goes into ``<archive stem>-2.tgz``, ``-3`` ...
    beside it (a file larger than ``part_bytes`` gets a part of its own).
    """
    files = written_since(since, root, folders)
    parts: list[list[Path]] = [[]]
    size = 0
    for f in files:
        n = f.stat().st_size
        if parts[-1] and size + n > part_bytes:
            parts.append([])
            size = 0
        parts[-1].append(f)
        size += n
    stem = archive.name.removesuffix(".tgz").removesuffix(".tar.gz")
    for k, chunk in enumerate(parts, 1):
        target = archive if k == 1 else archive.with_name(f"{stem}-{k}.tgz")
        tmp = target.with_name(target.name + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for f in chunk:
                tar.add(f, arcname=f.relative_to(root).as_posix())
        os.replace(tmp, target)
    return len(files)


def keep(folder: Path, since: float, root: Path = ROOT, folders=PACKED) -> int:
    """Copy every file under ``root / folder`` (for each of ``folders``) modified at or after
    ``since`` into ``folder``, at the same relative path (atomically, file by file). Returns
    the number of files.

    A run split over several calls on one machine keeps what each call wrote outside the tree
    the device tool replaces (``scripts/reference_run.sh``, ``$PERFLAB_RUN_ID``), and the next
    call puts it back: the run's ceilings file above all, so the next call reuses it. The run
    calls this right after the ceilings are ready and after each notebook, so a call stopped at
    its time limit loses nothing it finished (on 6 December the first call of a run was stopped
    in its twelfth page; the script kept the tree only at its end, so the next call measured the
    ceilings again and the run's pages read two ceilings files).
    """
    files = written_since(since, root, folders)
    for f in files:
        target = folder / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copy2(f, tmp)
        os.replace(tmp, target)
    return len(files)


def _holds_gpu_run(ipynb: Path) -> bool:
    try:
        run = runs.read(ipynb)
    except (OSError, ValueError):
        return False
    return run is not None and run.is_gpu


RUN_ID_ENV = "PERFLAB_RUN_ID"


def run_id(given: str | None = None) -> str:
    """The reference run this call belongs to: ``--run-id``, else ``$PERFLAB_RUN_ID``, else a
    new run named by the time now (one call, one run)."""
    return (given or os.environ.get(RUN_ID_ENV)
            or dt.datetime.now(dt.timezone.utc).strftime("run-%Y%m%dT%H%M%SZ"))


def prepare_ceilings(fresh: bool, run: str) -> None:
    """One set of ceilings per reference run and machine, measured before the first notebook.

    On a GPU the run's ceilings file is ``perflab/data/reference_ceilings.json`` (committed with
    the notebooks). It is reused only when it was measured in this run (``run``) on this very
    host and GPU (host id and GPU UUID, not only the device's name); otherwise it is measured
    now, and the line printed says why: the first call of a run, or a run whose calls landed on
    another machine (whose pages then read other ceilings, which ``--check`` refuses). Every
    notebook reads it through ``perflab.machine.ceilings.load()`` (``$PERFLAB_CEILINGS``).
    Elsewhere the notebooks measure and cache their own (``.cache/perflab/ceilings.json``).
    """
    if not torch.cuda.is_available():
        return
    doc = read_ceilings(ceilings.REFERENCE_PATH)
    why = "--fresh-ceilings" if fresh else ceilings.stale_reason(doc, run)
    if why is not None and doc is not None and doc.get("run") == run:
        why = f"THE HOST CHANGED between calls of run {run!r}: {why}; measured again"
    c = ceilings.load(ceilings.REFERENCE_PATH, fresh=why is not None, run=run)
    os.environ[ceilings.CEILINGS_ENV] = str(ceilings.REFERENCE_PATH)
    state = f"measured now ({why})" if why else "this run's, reused (same run, host and GPU)"
    print(f"ceilings of run {run!r}, host {c.machine_id.get('host_id')}: {state}; "
          f"{c.measured}, {ceilings.REFERENCE_PATH.relative_to(ROOT)}", flush=True)
    for name in c.items:
        print("  " + c.sentence(name), flush=True)
    for kind, h in c.host.items():
        print(f"  host cost h, {ceilings.HOST_COSTS[kind]}: {h.median * 1e6:.2f} us per call "
              f"({h.lo * 1e6:.2f}-{h.hi * 1e6:.2f}, {h.kind})", flush=True)


def record_cpu_run(md: Path, seconds: float) -> None:
    """Store a CPU execution's duration in ``labs/cpu_runs.json`` (``{stem: {...}}``)."""
    path = ROOT / "labs" / "cpu_runs.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    cpu = cpu_name()
    table[md.stem] = {"duration_s": round(seconds, 1), "cpu": cpu, "cores": os.cpu_count(),
                     "started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "source_sha256": runs.code_sha256(_cells(jupytext.read(md), "code"))}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def _ceilings_used() -> dict | None:
    """The ceilings file this run's notebooks read (``$PERFLAB_CEILINGS``), as ``{name: value}``
    plus ``measured`` (when), ``run`` and ``machine_id`` (which host and GPU): what ``--check``
    compares between the pages of one run."""
    path = os.environ.get(ceilings.CEILINGS_ENV)
    doc = read_ceilings(path) if path else None
    if doc is None:
        return None
    out = {k: v["value"] for k, v in doc.get("ceilings", {}).items()}
    out.update(measured=doc.get("measured"), run=doc.get("run"),
               machine_id=doc.get("machine_id"),
               host_cost_us={k: v["median_s"] * 1e6
                             for k, v in (doc.get("host_costs") or {}).items()})
    return out


def ceilings_of(md: Path) -> tuple | None:
    """Which ceilings file a page's run read: ``(measured, run, host id, GPU ids)``, or None
    (no run, or a run that recorded no ceilings)."""
    try:
        run = runs.read(md.with_suffix(".ipynb"))
    except (OSError, ValueError):
        return None
    c = run.ceilings if run is not None else None
    if not c:
        return None
    ident = c.get("machine_id") or {}
    return (c.get("measured"), c.get("run"), ident.get("host_id"),
            tuple(ident.get("gpu_ids") or ()))


def mixed_ceilings(notebooks: list[Path]) -> str | None:
    """One line when the current one-GPU pages among ``notebooks`` read different ceilings
    files (several runs, or one run whose calls landed on different machines); else None."""
    groups: dict[tuple, list[str]] = {}
    for md in notebooks:
        if waiting(md) is not None or not runs.status(md).ok:
            continue
        key = ceilings_of(md)
        if key is not None:
            groups.setdefault(key, []).append(md.stem)
    if len(groups) <= 1:
        return None
    parts = [f"{len(pages)} page(s) read ceilings measured {k[0]} (run {k[1]}, host {k[2]})"
             f": {', '.join(pages[:3])}{' ...' if len(pages) > 3 else ''}"
             for k, pages in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    if len({k[1:] for k in groups}) == 1:
        # one run on one host and GPU whose calls each measured the ceilings again: the pages
        # are honest but do not share one file; the next run makes them one (exit 3, as stale)
        return (RE_MEASURED + f"{len(groups)} measurements, values up to "
                f"{_ceilings_spread(groups):.1%} apart: " + "; ".join(parts))
    return ("pages of the book read different ceilings files (one run, one machine, one file: "
            "re-run the others): " + "; ".join(parts))


def _ceilings_spread(groups: dict[tuple, list[str]]) -> float:
    """The largest relative difference of one ceiling between the files ``groups`` read."""
    docs = []
    for pages in groups.values():
        md = next(ROOT.glob(f"*/{pages[0]}.md"), None)
        run = runs.read(md.with_suffix(".ipynb")) if md is not None else None
        if run is not None and run.ceilings:
            docs.append(run.ceilings)
    worst = 0.0
    for name in ceilings.NAMES:
        vals = [d[name] for d in docs if isinstance(d.get(name), (int, float))]
        if len(vals) > 1 and min(vals) > 0:
            worst = max(worst, max(vals) / min(vals) - 1)
    return worst


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="notebook sources (.md); default: every notebook in _toc.yml")
    parser.add_argument("--check", action="store_true",
                        help="execute nothing; list missing or stale notebooks and why (exit 0: all "
                             "current, 3: only perflab modules changed, 1: anything else)")
    parser.add_argument("--sync", action="store_true", help="copy prose from .md into .ipynb; execute nothing")
    parser.add_argument("--record-cpu", action="store_true",
                        help="on a CPU: write no .ipynb; store each duration in labs/cpu_runs.json")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per notebook (default 600)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write executed notebooks under this folder (same relative paths) instead of beside "
                             "their sources")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="without CUDA, overwrite .ipynb files that hold a GPU reference run anyway")
    parser.add_argument("--pack", type=Path, default=None, metavar="TGZ",
                        help="after each notebook, write every file the run has written under "
                             "book/, labs/ and perflab/data (and --out) to this gzip tar")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="after the ceilings and after each notebook, copy every file the run "
                             "has written (as --pack) into DIR, which a later call of the run "
                             "restores (scripts/reference_run.sh)")
    parser.add_argument("--pending", action="store_true",
                        help="with no paths: also the sources waiting in pending/ (CI runs them on CPU)")
    parser.add_argument("--fresh-ceilings", action="store_true",
                        help="on a GPU, measure the run's ceilings again even if "
                             "perflab/data/reference_ceilings.json is from this run and machine")
    parser.add_argument("--run-id", default=None,
                        help="the reference run this call belongs to (default $PERFLAB_RUN_ID, "
                             "else a new run): calls of one run on one machine share its ceilings")
    parser.add_argument("--preimport", type=int, default=None, metavar="N",
                        help="start the kernels of N pages at a time and run the imports their "
                             "first cells begin with side by side, before the first of them runs "
                             "(default: every page of the call with a CUDA device, "
                             f"{preimport.ELSEWHERE} elsewhere, 1 with --record-cpu; 1: none, "
                             "each page's kernel starts while the page before runs its first "
                             "cell)")
    args = parser.parse_args(argv)
    if args.check and args.sync:
        print("execute.py: --check and --sync exclude each other (--check only reads; run --sync, then --check)",
              file=sys.stderr)
        return 2
    if (args.check or args.sync) and (args.out or args.allow_cpu):
        print("execute.py: --out and --allow-cpu apply to execution, not to --check or --sync", file=sys.stderr)
        return 2

    try:
        notebooks = ([resolve(p) for p in args.paths] if args.paths
                     else default_notebooks(pending=args.pending or args.check, shipped=args.check))
    except NotANotebook as err:
        print(f"execute.py: {err}", file=sys.stderr)
        return 2
    if not notebooks:
        print("execute.py: no notebooks found in _toc.yml", file=sys.stderr)
        return 2

    if args.check:
        found = [p for md in notebooks for p in problems(md)]
        mixed = mixed_ceilings(notebooks)
        if mixed:
            found.append(mixed)
        for line in found:
            print(line)
        waits = [w for md in notebooks if (w := waiting(md)) is not None]
        for line in waits:
            print("waiting: " + line)
        if not found:
            print(f"{len(notebooks) - len(waits)} one-GPU notebook(s) carry a current reference "
                  f"run from a CUDA device" + (f"; {len(waits)} wait(s) for a machine" if waits
                                               else ""))
            return 0
        return EXIT_STALE_ONLY if all(STALE in line or AWAITING in line for line in found) else 1

    if args.sync:
        for md in notebooks:
            print(f"{md.name}: {'prose synced' if sync_prose(md) else 'not synced (missing, or code changed: run it)'}")
        return 0

    if args.out is None:
        short = [(md, why) for md in notebooks if (why := too_few_gpus(md)) is not None]
        for md, why in short:
            print(f"execute.py: {why}", file=sys.stderr)
        if short and args.paths:
            return 2
        notebooks = [md for md in notebooks if md not in dict(short)]
        if not notebooks:
            return 2

    def target(md: Path) -> Path:
        if args.out is None:
            return md.with_suffix(".ipynb")
        return (args.out / (md.relative_to(ROOT) if md.is_relative_to(ROOT) else md.name)).with_suffix(".ipynb")

    if not torch.cuda.is_available() and not args.allow_cpu and not args.record_cpu:
        guarded = [md for md in notebooks if _holds_gpu_run(target(md))]
        if guarded:
            names = ", ".join(str(md.relative_to(ROOT) if md.is_relative_to(ROOT) else md) for md in guarded[:3])
            print(f"execute.py: no CUDA device here, and {names}{' ...' if len(guarded) > 3 else ''} hold(s) a GPU "
                  "reference run: not overwritten (use --out DIR to write elsewhere, or --allow-cpu)", file=sys.stderr)
            return 2

    # tells notebooks that write files for the book (chapter 4's traces) that this run's files
    # are the reference; any other execution (tests, a reader's kernel) writes elsewhere
    if args.out is None and torch.cuda.is_available():
        os.environ["PERFLAB_REFERENCE_RUN"] = "1"
    started = time.time()
    prepare_ceilings(args.fresh_ceilings, run_id(args.run_id))
    folders = PACKED + ((str(args.out.resolve().relative_to(ROOT)),)
                        if args.out and args.out.resolve().is_relative_to(ROOT) else ())
    if args.keep:       # the ceilings first: a call stopped in its first page keeps them
        keep(args.keep, started, folders=folders)
    group = (args.preimport if args.preimport is not None
             else 1 if args.record_cpu    # a page's duration holds its imports, not others'
             else len(notebooks) if torch.cuda.is_available() else preimport.ELSEWHERE)
    failed = 0
    with preimport.terminate_as_exit(), preimport.Ahead(notebooks, group, timeout_s=args.timeout,
                                                        log=_log) as ahead:
        for k, md in enumerate(notebooks, 1):
            index = f"[{k}/{len(notebooks)}]"
            km, imports_s = ahead.kernel(k - 1)
            ok, seconds, message = execute(md, args.timeout, index, target(md),
                                           write=not args.record_cpu, km=km,
                                           then=ahead.then(k - 1))
            if ok and args.record_cpu:
                record_cpu_run(md, seconds)
            rel = md.relative_to(ROOT) if md.is_relative_to(ROOT) else md
            before = f"; its imports ran ahead in {imports_s:.1f} s" if imports_s else ""
            _log(f"{index} {rel}: {message} ({seconds:.1f} s{before})")
            failed += not ok
            if args.pack:
                _log(f"{index} packed {pack(args.pack, started, folders=folders)} file(s) into "
                     f"{args.pack}")
            if args.keep:
                keep(args.keep, started, folders=folders)
    if failed:
        print(f"{failed} of {len(notebooks)} notebook(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
