"""Reference runs as data: what ``scripts/execute.py`` records, and whether a notebook is current.

A *reference run* executes a chapter's MyST source (``book/NN_x.md``) on the course's GPU machine
and writes the paired ``.ipynb`` with its outputs and ``metadata.reference_run``: one
:class:`ReferenceRun`. Three readers need the same answers and get them here, so they cannot
disagree: ``scripts/execute.py`` (which writes runs and, with ``--check``, lists the notebooks
that are not current), the Sphinx extension ``_ext/provenance_pages.py`` (page footers, captions,
the status page) and the tests (``tests/test_reference_runs.py``).

* :class:`ReferenceRun` (schema :data:`SCHEMA_VERSION`): the metadata, typed.
* :func:`status`: the one staleness decision: ``current``, ``cpu``, ``stale``, ``missing`` or
  ``no-metadata``, compared by :func:`source_code_sha256` (a hash of the ``.md``'s code cells).
* :func:`toc_files`, :func:`is_myst_notebook`: which files are notebooks of the book.

Needs jupytext and PyYAML (the ``book`` extra); notebooks never import this module.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable

import jupytext
import yaml

from .provenance import environment, reference_run, short_devices

__all__ = [
    "SCHEMA_VERSION",
    "ReferenceRun",
    "RunStatus",
    "code_sha256",
    "is_myst_notebook",
    "read",
    "source_code_sha256",
    "status",
    "toc_files",
]

#: Version of the ``reference_run`` layout. 1: the fields of :class:`ReferenceRun`. Notebooks
#: written before the field existed carry no ``schema`` and are read as version 1.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReferenceRun:
    """``metadata.reference_run`` of an executed notebook.

    Attributes:
        devices: one name per visible GPU, or ``["cpu: <model>"]``.
        driver: NVIDIA driver version, or None.
        cuda: torch's CUDA version, or None (a CPU run).
        torch: torch version. python: Python version.
        started: UTC start time, ``YYYY-MM-DDTHH:MM:SSZ``.
        duration_s: seconds the notebook took.
        source_sha256: :func:`code_sha256` of the code that ran.
        git: the commit the run started from, or None.
        gpu_memory_peak_bytes: the largest rise of any GPU's used memory (NVML) while the
            notebook ran, or None (a CPU run, or a run before the field existed).
        cell_seconds: seconds each code cell took, in order, so the slow ones are visible.
        ceilings: the run's ceilings file as the notebook read it (``{name: value}`` in bytes/s
            or FLOP/s, plus ``"measured"``: when), or None where no ceilings file was set.
        schema: :data:`SCHEMA_VERSION` of the writer.
    """

    devices: tuple[str, ...] = ()
    torch: str | None = None
    python: str | None = None
    started: str | None = None
    duration_s: float | None = None
    source_sha256: str | None = None
    driver: str | None = None
    cuda: str | None = None
    git: str | None = None
    gpu_memory_peak_bytes: int | None = None
    cell_seconds: tuple[float, ...] | None = None
    ceilings: dict[str, Any] | None = None
    schema: int = SCHEMA_VERSION

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "ReferenceRun":
        """Read the metadata dict; unknown keys are ignored, absent ones are None.

        Raises:
            ValueError: ``meta`` is not a dict, or has a newer schema than this code knows.
        """
        if not isinstance(meta, dict):
            raise ValueError(f"reference_run must be a JSON object, got {type(meta).__name__}")
        schema = int(meta.get("schema", 1))
        if schema > SCHEMA_VERSION:
            raise ValueError(f"reference_run schema {schema} is newer than this perflab's "
                             f"{SCHEMA_VERSION}: update the repository")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in meta.items() if k in known}
        values["devices"] = tuple(str(d) for d in values.get("devices") or ())
        if values.get("cell_seconds") is not None:
            values["cell_seconds"] = tuple(float(x) for x in values["cell_seconds"])
        values["schema"] = schema
        return cls(**values)

    @classmethod
    def now(cls, started: str, duration_s: float, source_sha256: str, git: str | None,
            **extra: Any) -> "ReferenceRun":
        """A run of this process's machine (:func:`perflab.provenance.environment`).

        ``extra``: the optional fields (``gpu_memory_peak_bytes``, ``cell_seconds``,
        ``ceilings``).

        Raises:
            TypeError: an unknown field in ``extra``.
        """
        env = environment()
        return cls(devices=tuple(env["devices"]), torch=env["torch"], python=env["python"],
                   started=started, duration_s=round(duration_s, 1), source_sha256=source_sha256,
                   driver=env["driver"], cuda=env["cuda"], git=git, **extra)

    def as_metadata(self) -> dict[str, Any]:
        """The dict written into ``metadata.reference_run``."""
        out = asdict(self)
        out["devices"] = list(self.devices)
        if self.cell_seconds is not None:
            out["cell_seconds"] = list(self.cell_seconds)
        return {k: v for k, v in out.items()
                if v is not None or k not in ("gpu_memory_peak_bytes", "cell_seconds", "ceilings")}

    @property
    def is_gpu(self) -> bool:
        """True when the run came from CUDA devices (what the book's numbers must come from)."""
        return bool(self.cuda) and bool(self.devices) and not any(d.startswith("cpu") for d in self.devices)

    @property
    def devices_text(self) -> str:
        """``"2× NVIDIA H200"`` (:func:`perflab.provenance.short_devices`)."""
        return short_devices(list(self.devices))


def read(ipynb: str | os.PathLike) -> ReferenceRun | None:
    """The :class:`ReferenceRun` of an executed notebook, or None if it has none.

    Raises:
        FileNotFoundError: no such notebook.
        ValueError: metadata that is not a reference run (see :meth:`ReferenceRun.from_metadata`).
    """
    meta = reference_run(ipynb)
    return ReferenceRun.from_metadata(meta) if meta else None


def code_sha256(code_cells: Iterable[str]) -> str:
    """SHA-256 (hex) of a notebook's code: each code cell's source, stripped, joined by NUL lines.

    Ties an executed ``.ipynb`` to the exact code of its ``.md`` source.
    """
    joined = "\n\0\n".join(src.strip() for src in code_cells)
    return hashlib.sha256(joined.encode()).hexdigest()


def is_myst_notebook(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with a jupytext front matter in the ``myst`` format.

    Unreadable or non-UTF-8 files are not notebooks (False, no error).
    """
    try:
        head = Path(path).read_text(encoding="utf-8")[:2000]
    except (OSError, UnicodeDecodeError):
        return False
    return head.startswith("---") and "format_name: myst" in head


def source_code_sha256(source: str | os.PathLike) -> str:
    """:func:`code_sha256` of the code cells of a notebook source (jupytext ``md:myst`` ``.md``).

    A reference run records this as ``source_sha256``; the ``.ipynb`` is current with its source
    exactly when the two are equal (:func:`status`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``source`` is not a jupytext MyST notebook (no ``format_name: myst`` front
            matter).
    """
    path = Path(source)
    text = path.read_text(encoding="utf-8")
    if not is_myst_notebook(path):
        raise ValueError(f"source={str(path)!r} is not a jupytext MyST notebook (no 'format_name: myst' front matter)")
    nb = jupytext.reads(text, fmt="md:myst")
    return code_sha256(c.source for c in nb.cells if c.cell_type == "code")


@dataclass(frozen=True)
class RunStatus:
    """Whether an executed notebook is a current GPU reference run of its source.

    Attributes:
        state: ``"current"``, ``"cpu"`` (current code, CPU run), ``"stale"`` (the code changed
            since the run), ``"missing"`` (no ``.ipynb``) or ``"no-metadata"``.
        words: what the status page and ``execute.py --check`` print.
        run: the :class:`ReferenceRun`, when there is one.
    """

    state: str
    words: str
    run: ReferenceRun | None = None

    @property
    def ok(self) -> bool:
        """True only for ``current``."""
        return self.state == "current"


def status(source: str | os.PathLike, ipynb: str | os.PathLike | None = None) -> RunStatus | None:
    """The one staleness decision: is ``ipynb`` (default: ``source`` with suffix ``.ipynb``) a
    current GPU reference run of the MyST ``source``?

    Returns None when ``source`` is not a MyST notebook and no ``.ipynb`` exists (not a notebook).
    Without a MyST source the ``.ipynb`` cannot be stale (there is nothing to compare with).
    """
    source = Path(source)
    ipynb = Path(ipynb) if ipynb is not None else source.with_suffix(".ipynb")
    sha = source_code_sha256(source) if is_myst_notebook(source) else None
    if not ipynb.exists():
        return None if sha is None else RunStatus("missing", "not executed yet")
    try:
        run = read(ipynb)
    except ValueError:
        run = None
    if run is None:
        return RunStatus("no-metadata", "no reference_run metadata")
    if sha is not None and run.source_sha256 != sha:
        return RunStatus("stale", "stale: code changed since the run", run)
    if not run.is_gpu:
        return RunStatus("cpu", "current code, but a CPU run", run)
    return RunStatus("current", "current", run)


def toc_files(toc: str | os.PathLike) -> list[str]:
    """Every ``root`` and ``file`` entry of a Jupyter Book ``_toc.yml``, in book order, as written.

    Raises:
        FileNotFoundError: no such file.
    """
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if key in node:
                    found.append(str(node[key]))
            for value in node.values():
                if isinstance(value, (list, dict)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load(Path(toc).read_text()))
    return found
