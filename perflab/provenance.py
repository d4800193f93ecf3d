"""Where numbers come from: the run's environment, figure captions, glue, and reading them back.

The reference run (``scripts/execute.py``) writes :func:`environment` into each executed
notebook's metadata under ``reference_run`` (see DESIGN.md). Inside a notebook, :func:`glue`
stores a headline number under a stable name so prose can quote it (``{glue:text}``) and tests
and labs can read it back with :func:`read_glued`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import numbers
import os
import platform
from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "caption",
    "is_myst_notebook",
    "toc_files",
    "code_sha256",
    "environment",
    "glue",
    "read_glued",
    "reference_run",
    "source_code_sha256",
]

GLUE_PREFIX = "application/papermill.record/"


def environment() -> dict[str, Any]:
    """Facts about this run: devices, driver, CUDA, torch, python, CPU, hostname-free.

    Returns a dict with ``devices`` (one name per visible GPU, or ``["cpu: <model>"]``),
    ``driver`` (NVIDIA driver version or None), ``cuda`` (torch's CUDA version or None),
    ``torch``, ``python`` and ``cpu``.
    """
    import torch

    from .hardware import cpu_name, gpu_count, nvml_handle

    devices = [torch.cuda.get_device_name(i) for i in range(gpu_count())] or [f"cpu: {cpu_name()}"]
    driver = None
    if gpu_count() and nvml_handle(0) is not None:
        import pynvml

        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    return {
        "devices": devices,
        "driver": driver,
        "cuda": torch.version.cuda if gpu_count() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_name(),
    }


def _short_devices(devices: list[str]) -> str:
    if len(devices) > 1 and len(set(devices)) == 1:
        return f"{len(devices)}x {devices[0]}"
    return ", ".join(devices)


def caption(env: dict[str, Any] | None = None, date: str | None = None) -> str:
    """One line saying where numbers came from, e.g. ``"NVIDIA H200 · torch 2.11.0+cu130 · 2026-11-29"``.

    Defaults to this process's :func:`environment` and today's UTC date.
    """
    env = env or environment()
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    return f"{_short_devices(env['devices'])} · torch {env['torch']} · {date}"


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
    from myst_nb import glue as _glue

    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"glue name must be a Python identifier, got {name!r}")
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
    """The ``reference_run`` metadata of an executed notebook, or None if it has none.

    Raises:
        FileNotFoundError: no such notebook.
    """
    nb = json.loads(Path(path).read_text())
    return nb.get("metadata", {}).get("reference_run")


def code_sha256(code_cells: Iterable[str]) -> str:
    """SHA-256 (hex) of a notebook's code: each code cell's source, stripped, joined by NUL lines.

    Used to tie an executed ``.ipynb`` to the exact code of its ``.md`` source.
    """
    joined = "\n\0\n".join(src.strip() for src in code_cells)
    return hashlib.sha256(joined.encode()).hexdigest()


def source_code_sha256(source: str | os.PathLike) -> str:
    """:func:`code_sha256` of the code cells of a notebook source (jupytext ``md:myst`` ``.md``).

    This is the value a reference run records as ``reference_run.source_sha256``: the executed
    ``.ipynb`` is current with its source exactly when the two are equal. The build's status page
    and ``scripts/execute.py --check`` compare the same way.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``source`` is not a jupytext MyST notebook (no ``format_name: myst`` front
            matter).
    """
    import jupytext

    path = Path(source)
    text = path.read_text(encoding="utf-8")
    if not is_myst_notebook(path):
        raise ValueError(f"source={str(path)!r} is not a jupytext MyST notebook (no 'format_name: myst' front matter)")
    nb = jupytext.reads(text, fmt="md:myst")
    return code_sha256(c.source.strip() for c in nb.cells if c.cell_type == "code")


def is_myst_notebook(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with a jupytext front matter in the ``myst`` format.

    Unreadable or non-UTF-8 files are not notebooks (False, no error).
    """
    try:
        head = Path(path).read_text(encoding="utf-8")[:2000]
    except (OSError, UnicodeDecodeError):
        return False
    return head.startswith("---") and "format_name: myst" in head


def toc_files(toc: str | os.PathLike) -> list[str]:
    """Every ``root`` and ``file`` entry of a Jupyter Book ``_toc.yml``, in book order, as written.

    Raises:
        FileNotFoundError: no such file.
    """
    import yaml

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
