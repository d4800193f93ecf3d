"""One plot style for the book, and figures that are shown exactly once.

Importing this module applies :data:`STYLE` (matplotlib rcParams): figures drawn at the width
of the book's text column (:data:`COLUMN_WIDTH_IN` inches at 100 px per inch, so they are shown
at their drawn size, never shrunk), fonts that read at that size, no axis offset text ("+1e9"
at an axis end), a light grid, constrained layout; in a Jupyter kernel figures are rendered at
twice that resolution (sharp on high-density screens) and shown at their drawn size.

A page draws with matplotlib and ends with :func:`finish`::

    fig, ax = plt.subplots()
    ax.plot(sizes, rates, label="copy")
    ax.set(xlabel="bytes", ylabel="GB/s")
    finish(fig)

:func:`finish` moves the legend below the axes (where it covers no bar or line), lays the
figure out, shows it once and closes it, and returns None: a ``plt.show()`` after it, or
``finish(fig)`` on a cell's last line, cannot show the figure a second time. Library functions
that build a figure for a page call :func:`style` instead and return the figure.

Provenance is the caption's: the book prints, under each figure, the device that measured it
(cell metadata ``perflab: {measured_on: host | gpu | gpus}``), torch and date from the run's
record (see CONTRIBUTING.md, "Figures"). No stamp is drawn into the image.
"""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

from perflab.core.validate import one_of

__all__ = ["COLUMN_WIDTH_IN", "STYLE", "apply_style", "finish", "plain_log_ticks", "plot_ratios", "style"]

# The book's text column is about 676 CSS px wide in a 1,280 px window (sphinx-book-theme); a
# figure 6.5 in wide at 100 px per inch is shown at its drawn size, so 9-10 pt text reads as
# 12-14 px, like the prose beside it.
COLUMN_WIDTH_IN = 6.5
STYLE = {
    "figure.figsize": (COLUMN_WIDTH_IN, 3.6),
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "savefig.dpi": 200,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.formatter.useoffset": False,
    "axes.formatter.limits": (-4, 6),
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
}


def apply_style() -> None:
    """Apply :data:`STYLE`; in a Jupyter kernel, also render inline figures at twice their
    size and show them at their drawn size ("retina"). Called when this module is imported."""
    matplotlib.rcParams.update(STYLE)
    try:  # optional: only inside an IPython kernel with the inline backend
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        from IPython import get_ipython
    except ImportError:
        return
    if get_ipython() is not None and "inline" in matplotlib.get_backend():
        set_matplotlib_formats("retina")


def _legend_below(fig) -> None:
    handles, labels, seen = [], [], set()
    axes_with_legend = [ax for ax in fig.axes if ax.get_legend() is not None]
    if not axes_with_legend:
        return
    for ax in axes_with_legend:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in seen and not label.startswith("_"):
                seen.add(label)
                handles.append(h)
                labels.append(label)
        ax.get_legend().remove()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3))


def style(fig, legend: str = "below"):
    """Lay ``fig`` out in the book's style without showing it; returns ``fig``.

    * wider than the column: scaled down to :data:`COLUMN_WIDTH_IN` (its text keeps its size in
      points, so it stays legible where a shrunk image would not);
    * constrained layout; no axis offset text on linear axes;
    * ``legend="below"``: the axes' legends become one legend under the axes (labels shared by
      several axes listed once); ``"keep"`` leaves them where they are.

    Raises:
        ValueError: an unknown ``legend``.
    """
    one_of("legend", legend, ("below", "keep"))
    width, height = fig.get_size_inches()
    if width > COLUMN_WIDTH_IN * 1.01:
        k = COLUMN_WIDTH_IN / width
        fig.set_size_inches(COLUMN_WIDTH_IN, max(height * k, min(height, 3.0)))
    try:
        fig.set_layout_engine("constrained")
    except RuntimeError:  # a colorbar made under another engine: keep that engine
        pass
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ScalarFormatter):
                formatter.set_useOffset(False)
    if legend == "below":
        _legend_below(fig)
    return fig


def finish(fig, legend: str = "below") -> None:
    """Style ``fig`` (:func:`style`), show it once and close it. Returns None.

    In a Jupyter kernel the figure is displayed now and closed, so neither the end of the cell
    nor a ``plt.show()`` after it shows it again. Elsewhere (a script) it is only styled and
    left open for the script's own ``plt.show()`` or ``savefig``.

    Raises:
        ValueError: an unknown ``legend``.
    """
    style(fig, legend)
    try:  # optional: only inside an IPython kernel
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    if get_ipython() is None or "inline" not in matplotlib.get_backend():
        return None
    display(fig)
    plt.close(fig)
    return None


def plain_log_ticks(axis) -> None:
    """Ticks at 1, 2 and 5 of each decade on a log ``axis``, written as plain numbers (``0.5``,
    ``20``), no minor labels: an axis spanning less than a decade still shows its scale."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_ratios(ratios: dict[str, float], xlabel: str = "yours / reference",
                title: str = "your machine against the reference run"):
    """Draw and show bars of ``{quantity: yours / reference}`` around a line at 1 (returns None:
    :func:`finish` shows it once; outside a kernel it stays open).

    The axis is linear while every ratio lies within 0.5-2 (a log axis over 0.96-1.0 printed
    its tick labels over one another and made 4 % look large), logarithmic otherwise, with ticks
    at 1, 2 and 5 of each decade written as plain numbers.

    Raises:
        ValueError: ``ratios`` empty, or a ratio that is not a positive finite number.
    """
    if not ratios:
        raise ValueError("ratios: nothing to draw")
    for name, r in ratios.items():
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ValueError(f"ratios[{name!r}] must be a positive finite number, got {r!r}")
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(ratios) + 1.2))
    ax.barh(list(ratios), list(ratios.values()), color="C0")
    ax.axvline(1, color="k", lw=1)
    lo, hi = min(ratios.values()), max(ratios.values())
    if lo >= 0.5 and hi <= 2:
        ax.set_xlim(0, max(2.0, hi * 1.05) if hi > 1.5 else 1.5)
    else:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    ax.set(xlabel=xlabel, title=title)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    finish(fig)


apply_style()

