"""One plot style for the book, and the provenance stamp every figure carries."""

from __future__ import annotations

from perflab.record.provenance import caption

__all__ = ["finish"]


def finish(fig, stamp: bool = True):
    """Lay out ``fig`` and stamp it with where its numbers came from; returns ``fig``.

    The stamp is :func:`perflab.record.provenance.caption` (device, torch version, date of the run that
    drew the figure), written small under the axes, so a figure copied out of the book still
    says which machine produced it.
    """
    if stamp:
        fig.text(0.995, 0.005, caption(), ha="right", va="bottom", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1) if stamp else None)
    return fig
