"""The ceilings file: where a run's ceilings are kept and how the file is read and written.

A run measures its ceilings once (:mod:`perflab.machine.ceilings`, the measurement and the
clock model) and every page reads the same file. This module owns only the file: its schema, its
location and the machine fingerprint that decides whether a file belongs to this machine.

* ``$PERFLAB_CEILINGS`` if set, else ``<clone>/.cache/perflab/ceilings.json`` (or
  ``~/.cache/perflab/ceilings.json`` for an installed package);
* the reference run's copy, committed with the notebooks: ``perflab/data/reference_ceilings.json``
  (:data:`REFERENCE_PATH`).

Schema ``perflab-ceilings/2`` adds, to version 1's ``machine``, ``measured``, ``gpu`` and
``ceilings``: ``machine_id`` (hashed host id and GPU UUIDs,
:func:`perflab.record.provenance.machine_id`), ``run`` (the reference run the file belongs to) and
``host_costs`` (the host's per-call cost over rounds). A version-1 file still reads; it cannot
prove which host measured it, so a reference run measures a new one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CEILINGS_ENV", "REFERENCE_PATH", "SCHEMA", "SCHEMAS", "default_path", "fingerprint",
           "read", "write"]

SCHEMA = "perflab-ceilings/2"
SCHEMAS = ("perflab-ceilings/1", SCHEMA)    # what read() accepts
CEILINGS_ENV = "PERFLAB_CEILINGS"
REFERENCE_PATH = Path(__file__).resolve().parent.parent / "data" / "reference_ceilings.json"


def default_path() -> Path:
    """``$PERFLAB_CEILINGS``, else the clone's ``.cache/perflab/ceilings.json`` (or the user's)."""
    env = os.environ.get(CEILINGS_ENV)
    if env:
        return Path(env)
    root = Path(__file__).resolve().parent.parent.parent
    base = root / ".cache" if (root / "pyproject.toml").exists() else Path.home() / ".cache"
    return base / "perflab" / "ceilings.json"


def fingerprint(machine: dict[str, Any]) -> tuple:
    """What of a file's ``machine`` must match this machine: devices, torch, CPU model (the
    host and GPU ids are compared beside it, :func:`perflab.machine.ceilings.stale_reason`)."""
    return (tuple(machine.get("devices", [])), machine.get("torch"), machine.get("cpu"))


def read(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ceilings document at ``path``, or None when it is missing, unreadable or of an
    unknown schema."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") not in SCHEMAS:
        return None
    return doc


def write(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    """Write the ceilings document ``doc`` to ``path`` (parents created).

    Raises:
        OSError: the file cannot be written (the message names the path).
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        raise OSError(f"cannot write the ceilings file {p}: {e.strerror or e}") from e
