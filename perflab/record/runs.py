"""Reference runs as data: what ``scripts/execute.py`` records, and whether a notebook is current.

A *reference run* executes a chapter's MyST source (``book/NN_x.md``) on the course's GPU machine
and writes the paired ``.ipynb`` with its outputs and ``metadata.reference_run``: one
:class:`ReferenceRun`. Three readers need the same answers and get them here, so they cannot
disagree: ``scripts/execute.py`` (which writes runs and, with ``--check``, lists the notebooks
that are not current), the Sphinx extension ``_ext/provenance_pages.py`` (page footers, captions,
the status page) and the tests (``tests/test_reference_runs.py``).

* :class:`ReferenceRun` (schema :data:`SCHEMA_VERSION`): the metadata, typed.
* :func:`status`: the one staleness decision: ``current``, ``cpu``, ``stale``, ``missing`` or
  ``no-metadata``, compared by :func:`source_code_sha256` (a hash of the ``.md``'s code cells)
  and by :func:`perflab_sha256` (a hash of each perflab module the code imports, found
  statically and transitively by :func:`perflab_modules`): a change to either makes the run
  stale, and :attr:`RunStatus.cause` says which (``"code"`` or ``"perflab"``, with the modules).
* :func:`toc_files`, :func:`is_myst_notebook`: which files are notebooks of the book.
* :func:`required_gpus`: how many GPUs a page's reference run needs, as its front matter
  declares (``perflab: {gpus: N}``); :func:`pending_sources`, :func:`home`,
  :func:`pending_replacement`: sources that wait, outside the table of contents, in
  ``pending/`` for a machine kind that is not lent (``pending/book/X.md`` will become
  ``book/X.md``, and runs with ``book/`` as its working folder meanwhile).

Needs jupytext and PyYAML (the ``book`` extra); notebooks never import this module.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable

import jupytext
import yaml

from perflab.core.validate import positive_int
from perflab.record.provenance import environment, reference_run, short_devices
from perflab.record.toc import is_myst_notebook, toc_files  # one reader of the toc

__all__ = [
    "SCHEMA_VERSION",
    "ReferenceRun",
    "RunStatus",
    "changed_modules",
    "code_sha256",
    "is_myst_notebook",
    "referenced_names",
    "perflab_modules",
    "perflab_sha256",
    "PENDING",
    "home",
    "pending_replacement",
    "pending_sources",
    "declares_gpus",
    "read",
    "required_gpus",
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
        perflab_sha256: ``{"perflab/machine/gpu.py": sha256, ...}`` of every perflab module that code
            imports (:func:`perflab_sha256`), or None (a run before the field existed).
        git: the commit the run started from, or None.
        gpu_memory_peak_bytes: the largest rise of any GPU's used memory (NVML) while the
            notebook ran, or None (a CPU run, or a run before the field existed).
        cell_seconds: seconds each code cell took, in order, so the slow ones are visible.
        ceilings: the run's ceilings file as the notebook read it (``{name: value}`` in bytes/s
            or FLOP/s, plus ``"measured"``: when), or None where no ceilings file was set.
        host: the host's CPU (:func:`perflab.record.provenance.host`: ``cpu`` model,
            ``logical_cores``, ``usable_cores``), which the book names under figures of work
            the CPU did; None in runs before the field existed (an optional field: the schema
            is unchanged, and older readers ignore it).
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
    perflab_sha256: dict[str, str] | None = None
    host: dict[str, Any] | None = None
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
        """A run of this process's machine (:func:`perflab.record.provenance.environment`).

        ``extra``: the optional fields (``gpu_memory_peak_bytes``, ``cell_seconds``,
        ``ceilings``, ``perflab_sha256``).

        Raises:
            TypeError: an unknown field in ``extra``.
        """
        env = environment()
        return cls(devices=tuple(env["devices"]), torch=env["torch"], python=env["python"],
                   started=started, duration_s=round(duration_s, 1), source_sha256=source_sha256,
                   driver=env["driver"], cuda=env["cuda"], git=git, host=env["host"], **extra)

    def as_metadata(self) -> dict[str, Any]:
        """The dict written into ``metadata.reference_run``."""
        out = asdict(self)
        out["devices"] = list(self.devices)
        if self.cell_seconds is not None:
            out["cell_seconds"] = list(self.cell_seconds)
        return {k: v for k, v in out.items()
                if v is not None or k not in ("gpu_memory_peak_bytes", "cell_seconds", "ceilings",
                                              "perflab_sha256", "host")}

    @property
    def is_gpu(self) -> bool:
        """True when the run came from CUDA devices (what the book's numbers must come from)."""
        return bool(self.cuda) and bool(self.devices) and not any(d.startswith("cpu") for d in self.devices)

    @property
    def devices_text(self) -> str:
        """``"2× NVIDIA H200"`` (:func:`perflab.record.provenance.short_devices`)."""
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


PACKAGE = "perflab"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
_MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)


def _module_file(name: str, package_dir: Path) -> Path | None:
    """The file of module ``name`` (``perflab.x.y``) under ``package_dir``, or None."""
    parts = name.split(".")[1:]
    base = package_dir.joinpath(*parts) if parts else package_dir
    for candidate in (base / "__init__.py", base.with_suffix(".py") if parts else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def referenced_names(tree: ast.AST, module: str | None = None, is_package: bool = False,
                     package: str = PACKAGE) -> set[str]:
    """Dotted names under ``package`` that ``tree`` may import or name, found statically:
    ``import``/``from`` statements (relative ones resolved against ``module``, the dotted name
    of the tree's own module, a package when ``is_package``), attribute chains on an imported
    name (``perflab.machine.roofline.x``: the package loads submodules on first attribute
    access) and string constants that are exactly a module name (``["-m",
    "perflab.machine.interconnect"]``). Names that are not modules (functions, classes) are
    included; callers keep the ones they can resolve. Used by :func:`perflab_modules` and by
    ``scripts/architecture.py`` (the module map's "used by").

    Returns:
        a set of dotted names, each starting with ``package``.
    """
    found: set[str] = set()
    aliases: dict[str, str] = {}
    here = (module.split(".") if is_package else module.split(".")[:-1]) if module else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == package or a.name.startswith(package + "."):
                    found.add(a.name)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else package
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if not here or node.level - 1 >= len(here):
                    continue
                base = ".".join(here[:len(here) - (node.level - 1)]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base == package or base.startswith(package + "."):
                found.add(base)
                for a in node.names:
                    found.add(f"{base}.{a.name}")   # kept only if it is a module
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(re.escape(package) + r"(\.\w+)+", node.value):
                found.add(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases:
                name = aliases[cur.id]
                for attr in reversed(chain):
                    name += "." + attr
                    found.add(name)
    return found


def perflab_modules(code_cells: Iterable[str], package_dir: str | os.PathLike | None = None,
                    package: str = PACKAGE) -> list[str]:
    """Every module of ``package`` that a notebook's code runs, found statically, transitively.

    The code cells are parsed with :mod:`ast` (IPython ``%magic`` and ``!shell`` lines are
    skipped); so is each module they import, and each module that imports, until nothing new
    turns up. Importing ``perflab.x.y`` also runs ``perflab/__init__.py`` and
    ``perflab/x/__init__.py``, which are included. A dynamic import whose name is computed at run
    time is not seen.

    Args:
        code_cells: the notebook's code cells (source text).
        package_dir: the package's folder (default: this perflab's).
        package: the package's import name.

    Returns:
        Sorted dotted module names (``["perflab", "perflab.machine.gpu", ...]``); empty when the code
        imports nothing from the package.

    Raises:
        SyntaxError: a code cell or a module that is not valid Python (the message names it).
    """
    root = Path(package_dir) if package_dir is not None else PACKAGE_DIR
    todo: list[str] = []
    for i, src in enumerate(code_cells):
        try:
            tree = ast.parse(_MAGIC.sub(r"\1pass", src))
        except SyntaxError as err:
            raise SyntaxError(f"code cell {i + 1}: {err.msg} (line {err.lineno})") from err
        todo += sorted(referenced_names(tree, None, False, package))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):          # the parents run first
            mod = ".".join(parts[:k])
            if mod in seen:
                continue
            path = _module_file(mod, root)
            if path is None:
                break                                 # a function or class, not a module
            seen.add(mod)
            todo += _module_names(path, mod, package)
    return sorted(seen)


#: :func:`referenced_names` of each module text seen in this process, by (text, module name,
#: package, whether the file is a package's ``__init__.py``): ``execute.py --check`` and the book's status page ask about some 40 pages, which
#: import mostly the same modules; parsed and walked once per text, not once per page
#: (2,658 walks of 44 pages' modules took ~19 of --check's 41 profiled seconds). Keyed by
#: the text itself, so an edited module is read afresh whatever its timestamp.
_NAMES: dict[tuple[str, str, str, bool], list[str]] = {}


def _module_names(path: Path, mod: str, package: str) -> list[str]:
    """The sorted :func:`referenced_names` of module ``mod``'s file ``path`` (cached by text)."""
    text = path.read_text(encoding="utf-8")
    is_package = path.name == "__init__.py"     # relative imports resolve from it
    key = (text, mod, package, is_package)
    if key not in _NAMES:
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as err:
            raise SyntaxError(f"{path}: {err.msg} (line {err.lineno})") from err
        if len(_NAMES) > 4096:      # a long test session parses many scratch packages
            _NAMES.clear()
        _NAMES[key] = sorted(referenced_names(tree, mod, is_package, package))
    return list(_NAMES[key])


def perflab_sha256(code_cells: Iterable[str], package_dir: str | os.PathLike | None = None,
                   package: str = PACKAGE) -> dict[str, str]:
    """SHA-256 (hex) of each module file :func:`perflab_modules` finds, keyed by its path
    relative to the package's parent (``{"perflab/machine/gpu.py": "3f2a...", ...}``).

    A reference run records it (``perflab_sha256``); :func:`status` calls the run stale when
    it differs, and names the modules that changed. A change to a module the notebook does not
    import, directly or through another module, leaves it unchanged.

    Raises:
        SyntaxError: as :func:`perflab_modules`.
    """
    root = Path(package_dir) if package_dir is not None else PACKAGE_DIR
    out = {}
    for mod in perflab_modules(code_cells, root, package):
        path = _module_file(mod, root)
        out[path.relative_to(root.parent).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def changed_modules(recorded: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """The module files whose hash differs between a run's ``perflab_sha256`` and ``now``
    (added, removed or edited), sorted; ``["the run recorded no perflab hashes"]`` when the run
    has none (it predates them) but the code imports perflab."""
    if recorded is None:
        return ["the run recorded no perflab hashes"] if now else []
    return sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))


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
    return code_sha256(_source_cells(path, text))


#: the code cells of each MyST text read in this process (:func:`status` reads a page's source
#: twice, ``execute.py --check`` asks twice per page; jupytext's reads took ~11 of --check's 41
#: profiled seconds), keyed by the text itself
_CELLS: dict[str, tuple[str, ...]] = {}


def _source_cells(path: Path, text: str | None = None) -> list[str]:
    text = text if text is not None else path.read_text(encoding="utf-8")
    if text not in _CELLS:
        nb = jupytext.reads(text, fmt="md:myst")
        if len(_CELLS) > 1024:
            _CELLS.clear()
        _CELLS[text] = tuple(c.source for c in nb.cells if c.cell_type == "code")
    return list(_CELLS[text])


@dataclass(frozen=True)
class RunStatus:
    """Whether an executed notebook is a current GPU reference run of its source.

    Attributes:
        state: ``"current"``, ``"cpu"`` (current code, CPU run), ``"stale"`` (the code or the
            perflab modules it imports changed since the run), ``"missing"`` (no ``.ipynb``) or
            ``"no-metadata"``.
        words: what the status page and ``execute.py --check`` print.
        run: the :class:`ReferenceRun`, when there is one.
        cause: for ``"stale"``: ``"code"`` (the notebook's code cells changed), ``"perflab"``
            (the cells did not, but a perflab module they import did) or ``"input"`` (a page
            whose executed notebook this one reads, :func:`reads`, was run after it); else None.
        changed: for ``cause == "perflab"``: the module files that changed; for ``"input"``:
            the pages re-run since.
    """

    state: str
    words: str
    run: ReferenceRun | None = None
    cause: str | None = None
    changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True only for ``current``."""
        return self.state == "current"


def status(source: str | os.PathLike, ipynb: str | os.PathLike | None = None) -> RunStatus | None:
    """The one staleness decision: is ``ipynb`` (default: ``source`` with suffix ``.ipynb``) a
    current GPU reference run of the MyST ``source``?

    Returns None when ``source`` is not a MyST notebook and no ``.ipynb`` exists (not a notebook).
    Without a MyST source the ``.ipynb`` cannot be stale (there is nothing to compare with).
    Order of the checks: code cells changed (stale, cause ``"code"``), a CPU run (``cpu``), a
    perflab module the code imports changed or a run that recorded no perflab hashes (stale,
    cause ``"perflab"``), else current.
    """
    source = Path(source)
    ipynb = Path(ipynb) if ipynb is not None else source.with_suffix(".ipynb")
    myst = is_myst_notebook(source)
    sha = source_code_sha256(source) if myst else None
    if not ipynb.exists():
        return None if sha is None else RunStatus("missing", "not executed yet")
    try:
        run = read(ipynb)
    except ValueError:
        run = None
    if run is None:
        return RunStatus("no-metadata", "no reference_run metadata")
    if sha is not None and run.source_sha256 != sha:
        return RunStatus("stale", "stale: code changed since the run", run, cause="code")
    if not run.is_gpu:
        return RunStatus("cpu", "current code, but a CPU run", run)
    if myst:
        changed = changed_modules(run.perflab_sha256, perflab_sha256(_source_cells(source)))
        if changed:
            return RunStatus("stale", "stale: perflab changed since the run (" + ", ".join(changed)
                             + ")", run, cause="perflab", changed=tuple(changed))
        newer = _inputs_run_after(source, run)
        if newer:
            return RunStatus("stale", "stale: a page it reads was run after it ("
                             + ", ".join(newer) + ")", run, cause="input", changed=newer)
    return RunStatus("current", "current", run)


def reads(source: str | os.PathLike) -> tuple[str, ...]:
    """The pages whose executed notebooks a MyST notebook reads (the roofline explorer draws
    chapter 1's measured roofs): its front matter's ``perflab: {reads: [NAME, ...]}``, names
    of notebooks in the same folder without suffix. A page that declares none reads none.

    Raises:
        ValueError: ``reads`` is not a list of non-empty names.
    """
    meta = _front_matter(Path(source)).get("perflab") or {}
    names = meta.get("reads", []) if isinstance(meta, dict) else []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{source}: front matter 'perflab: reads' must be a list of page "
                         f"names, got {names!r}")
    return tuple(names)


def _inputs_run_after(source: Path, run: ReferenceRun) -> tuple[str, ...]:
    """The pages ``source`` reads whose reference runs started after ``run`` did: what the
    page shows of them comes from an older run than theirs."""
    newer = []
    for name in reads(source):
        other = source.parent / f"{name}.ipynb"
        try:
            theirs = read(other) if other.exists() else None
        except ValueError:
            theirs = None
        if (theirs is not None and theirs.started and run.started
                and theirs.started > run.started):
            newer.append(name)
    return tuple(newer)


#: The folder, at the repository's root, of sources waiting for a machine kind that is not lent.
PENDING = "pending"


def _front_matter(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    doc = yaml.safe_load(text[3:end]) or {}
    return doc if isinstance(doc, dict) else {}


def required_gpus(source: str | os.PathLike) -> int:
    """How many GPUs the reference run of a MyST notebook needs: its front matter's
    ``perflab: {gpus: N}`` (written beside ``kernelspec``; jupytext carries it into the
    notebook's metadata). A page with no declaration needs one GPU.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``source`` is not a MyST notebook, or ``gpus`` is not an integer >= 1.
    """
    path = Path(source)
    if not is_myst_notebook(path):
        raise ValueError(f"source={str(path)!r} is not a jupytext MyST notebook")
    meta = _front_matter(path).get("perflab") or {}
    gpus = meta.get("gpus", 1) if isinstance(meta, dict) else None
    positive_int(f"{path}: front matter 'perflab: gpus'", gpus)
    return gpus


def declares_gpus(source: str | os.PathLike) -> bool:
    """True when a MyST notebook's front matter says how many GPUs it needs."""
    meta = _front_matter(Path(source)).get("perflab")
    return isinstance(meta, dict) and "gpus" in meta


def _root_of(path: Path) -> Path:
    """The repository root above ``path``: the folder holding ``_toc.yml``."""
    for parent in path.resolve().parents:
        if (parent / "_toc.yml").exists():
            return parent
    raise ValueError(f"{path}: not inside the course repository (no _toc.yml above it)")


def pending_sources(root: str | os.PathLike) -> list[Path]:
    """Every MyST notebook under ``root/pending/`` (sorted): sources that wait for a machine kind
    that is not lent. They are not in the table of contents; CI executes them on a CPU."""
    folder = Path(root) / PENDING
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.md") if is_myst_notebook(p))


def home(source: str | os.PathLike) -> Path:
    """The folder a notebook runs in: its own, or, for ``pending/<dir>/X.md``, ``<dir>`` at the
    root (where it will live once it has run), so its relative paths are the final ones."""
    path = Path(source).resolve()
    try:
        rel = path.relative_to(_root_of(path) / PENDING)
    except ValueError:
        return path.parent
    return _root_of(path) / rel.parent


def pending_replacement(source: str | os.PathLike) -> Path | None:
    """For a page of the book (``book/X.md``), its revised source waiting in
    ``pending/book/X.md``, or None. A page with one keeps its older run on show (with a note of
    its known defects) until the revised source has run."""
    path = Path(source).resolve()
    try:
        root = _root_of(path)
    except ValueError:  # a notebook outside the course repository has no pending/ beside it
        return None
    if path.is_relative_to(root / PENDING):
        return None
    candidate = root / PENDING / path.relative_to(root)
    return candidate if candidate.exists() else None
