"""Progress bars for the course's long measurement loops (tqdm: a widget in a live kernel)."""

from __future__ import annotations

from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

__all__ = ["progress"]


def progress(items: Iterable[T], desc: str, enabled: bool = True) -> Iterable[T]:
    """``items`` wrapped in a ``tqdm.auto`` bar labelled ``desc`` when ``enabled``, else unchanged.

    The bar is removed when the loop ends (``leave=False``), so executed notebooks keep their
    printed results, not stale bars.
    """
    if not enabled:
        return items
    return tqdm(items, desc=desc, leave=False)
