"""The book's table of contents and which files are its notebooks, read without torch.

:func:`toc_files` lists ``_toc.yml``'s entries in book order; :func:`is_myst_notebook` says whether
a file is a jupytext MyST notebook. Both need only PyYAML and the file system, so the exporter of
page code (``scripts/export_pages.py``) runs where torch is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

__all__ = ["is_myst_notebook", "toc_files"]


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


def is_myst_notebook(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with a jupytext front matter in the ``myst`` format.

    Unreadable or non-UTF-8 files are not notebooks (False, no error).
    """
    try:
        head = Path(path).read_text(encoding="utf-8")[:2000]
    except (OSError, UnicodeDecodeError):
        return False
    return head.startswith("---") and "format_name: myst" in head
