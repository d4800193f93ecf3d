"""Where numbers come from, as a reader meets it: the run's environment, glue.

Inside a notebook, :func:`glue` stores a headline number under a stable name so prose can quote
it (``{glue:text}``) and tests and labs can read it back with :func:`read_glued`. The reference
run (``scripts/execute.py``) writes :func:`environment` into each executed notebook's
``metadata.reference_run`` (the book's captions and footers are built from it); its typed
form, its schema and the "is this notebook current?" decision are build plumbing and live in
:mod:`perflab.record.runs` (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from perflab.core import nvml
from perflab.core.device import cpu_name, gpu_count

__all__ = [
    "artifacts",
    "environment",
    "host",
    "glue",
    "lab_reference",
    "machine_id",
    "read_glued",
    "reference_run",
    "short_devices",
]

GLUE_PREFIX = "application/papermill.record/"

#: Set by ``scripts/execute.py`` when it writes the book's reference run.
REFERENCE_RUN_ENV = "PERFLAB_REFERENCE_RUN"
_SCRATCH: list[tempfile.TemporaryDirectory] = []


def artifacts(book_folder: str | os.PathLike, prefix: str = "perflab_") -> Path:
    """Where a page writes files (traces, snapshots) for the book or only to read them back.

    In the reference run (``scripts/execute.py`` sets ``PERFLAB_REFERENCE_RUN``) the files are
    the book's: ``book_folder`` (relative to the notebook's folder, e.g. ``"_static_ch07"``),
    created if needed. Anywhere else (tests, CI, a reader's kernel) they go to a fresh scratch
    folder under the system's temporary folder (the clone's ``.cache/tmp`` under ``make`` or
    pytest), **removed when the kernel exits**, so repeated runs leave nothing behind.

    Args:
        book_folder: the book's folder for these files, relative to the notebook.
        prefix: the scratch folder's name prefix (e.g. ``"ch07_"``).

    Returns:
        the folder, which exists.
    """
    if os.environ.get(REFERENCE_RUN_ENV):
        folder = Path(book_folder)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    scratch = tempfile.TemporaryDirectory(prefix=prefix)  # removed at exit (weakref finalizer)
    _SCRATCH.append(scratch)
    return Path(scratch.name)


def host() -> dict[str, Any]:
    """The host's CPU, for captions of work it did (data loading, CPU profiles): ``cpu`` (its
    model), ``logical_cores`` (``os.cpu_count()``) and ``usable_cores`` (the cores this process
    may run on, which a container or ``taskset`` can make fewer)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "usable_cores": usable}


def environment() -> dict[str, Any]:
    """Facts about this run: devices, driver, CUDA, torch, python, CPU, hostname-free.

    Returns a dict with ``devices`` (one name per visible GPU, or ``["cpu: <model>"]``),
    ``driver`` (NVIDIA driver version or None), ``cuda`` (torch's CUDA version or None),
    ``torch``, ``python``, ``cpu`` (the host CPU's model) and ``host`` (:func:`host`).
    """
    devices = [torch.cuda.get_device_name(i) for i in range(gpu_count())] or [f"cpu: {cpu_name()}"]
    return {
        "devices": devices,
        "driver": nvml.driver_version() if gpu_count() else None,
        "cuda": torch.version.cuda if gpu_count() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "host": host(),
    }


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: What ``host_id`` hashes: the OS's machine id, which every container of one image shares,
#: and the kernel's boot id, which every container on one host shares and no two hosts (or
#: two boots of one host) do. Two lent machines of 5 December printed the same host id from
#: the machine id alone.
HOST_ID_FILES = ("/etc/machine-id", "/proc/sys/kernel/random/boot_id")


def machine_id() -> dict[str, Any]:
    """Which machine this is, without naming it: ``host_id`` (12 hex digits of a SHA-256 of
    the files of :data:`HOST_ID_FILES`, ``/etc/machine-id`` and the kernel's boot id; the
    hostname where neither is readable) and ``gpu_ids`` (the same of each GPU's NVML UUID, in
    NVML's order; empty without a GPU).

    Two H200 hosts have the same device name, torch and CPU model string; these tell them
    apart, so a run's pages can be proven to come from one machine (the ceilings file records
    them, :mod:`perflab.machine.ceilings`). A reboot gives the same host another id: its
    ceilings are measured again, which a rebooted machine needs anyway.
    """
    parts = []
    for path in HOST_ID_FILES:
        try:
            parts.append(Path(path).read_text().strip())
        except OSError:
            parts.append("")
    ident = ":".join(parts) if any(parts) else (platform.node() or "unknown")
    gpus = [nvml.uuid(i) for i in range(nvml.device_count())]
    return {"host_id": _short_hash(ident),
            "gpu_ids": [_short_hash(u) for u in gpus if u]}


def short_devices(devices: list[str] | None) -> str:
    """``["NVIDIA H200", "NVIDIA H200"]`` -> ``"2× NVIDIA H200"``; mixed lists are comma-joined;
    ``"?"`` for none. The same words in page captions, footers and the report card."""
    devices = list(devices or []) or ["?"]
    if len(devices) > 1 and len(set(devices)) == 1:
        return f"{len(devices)}× {devices[0]}"
    return ", ".join(devices)


def _plain(value: Any) -> Any:
    """numpy/torch scalars to Python numbers so the glued text reads ``4.1``, not ``np.float64(4.1)``."""
    if hasattr(value, "item") and getattr(value, "ndim", getattr(value, "dim", lambda: 1)) in (0, ()):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def glue(name: str, value: Any, display: bool = False) -> None:
    """Glue ``value`` under ``name`` (myst-nb) so the prose can quote it.

    Numbers are converted to plain Python ``int``/``float`` first. The name must be a
    snake_case identifier. Returns None, so that a ``glue(...)`` on a cell's last line does not
    display the value a second time as the cell's result.

    Raises:
        ValueError: a name that is not an identifier, or a number that is NaN or infinite (a
            headline number that is not finite is a failed measurement, never something to print).
    """
    from myst_nb import glue as _glue  # optional (the `book` extra): only notebooks glue

    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"glue name must be a Python identifier, got {name!r}")
    if isinstance(value, str) and type(value) is not str:
        value = str(value)  # a claim's Sentence shows nothing when displayed: glue its text
    value = _plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"glued value {name!r} is {value}: the measurement failed")
    _glue(name, value, display=display)


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        pass
    stripped = text.strip("'\"")
    return stripped


def read_glued(path: str | os.PathLike) -> dict[str, Any]:
    """Every value glued in an executed notebook: ``{name: value}``.

    Numbers come back as ``int``/``float`` (parsed from the stored ``text/plain``), other values as
    their text.

    Raises:
        FileNotFoundError: no such notebook.
    """
    nb = json.loads(Path(path).read_text())
    out: dict[str, Any] = {}
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            prefix = meta.get("mime_prefix", "")
            text = output.get("data", {}).get(prefix + "text/plain")
            if isinstance(text, list):
                text = "".join(text)
            if text is not None:
                out[meta["name"]] = _parse(text)
    return out


def reference_run(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``reference_run`` metadata of an executed notebook as a dict, or None if it has none
    (typed, with its schema: :func:`perflab.record.runs.read`).

    Raises:
        FileNotFoundError: no such notebook.
    """
    nb = json.loads(Path(path).read_text())
    return nb.get("metadata", {}).get("reference_run")


def lab_reference(stem: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A lab's own reference run: ``(glued values, reference_run metadata)`` of
    ``labs/<stem>.ipynb`` in the clone perflab is installed from (``pip install -e .``), or
    ``({}, None)`` when there is none (an installed wheel, a missing notebook).

    A lab's closing table compares the student's numbers with the *same* exercise run on the
    reference machine: the same code and sizes, only the machine differs. Found through the
    package's location, so a student edition copied elsewhere finds it too.
    """
    path = Path(__file__).resolve().parent.parent.parent / "labs" / f"{stem}.ipynb"
    if not path.exists():
        return {}, None
    return read_glued(path), reference_run(path)
