"""perflab.record.plotting: one style, figures that fit the column, each shown exactly once."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

from perflab.record import plotting  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_importing_the_module_applies_the_style():
    assert matplotlib.rcParams["axes.formatter.useoffset"] is False
    assert tuple(matplotlib.rcParams["figure.figsize"]) == (plotting.COLUMN_WIDTH_IN, 3.6)
    assert matplotlib.rcParams["legend.fontsize"] >= 9


def test_style_fits_the_column_moves_the_legend_below_and_drops_offsets():
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4), layout="none")
    a.bar(["x", "y"], [1, 2], label="measured")
    a.plot([0, 1], [1.5, 1.5], label="predicted")
    b.plot([1e9, 1e9 + 1], [1, 2], label="measured")       # the same label: listed once
    a.legend()
    b.legend()
    b.xaxis.set_major_formatter(ScalarFormatter(useOffset=True))
    assert plotting.style(fig) is fig
    width, _ = fig.get_size_inches()
    assert width == pytest.approx(plotting.COLUMN_WIDTH_IN)
    assert a.get_legend() is None and b.get_legend() is None and len(fig.legends) == 1
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["measured", "predicted"]
    assert b.xaxis.get_major_formatter().get_useOffset() is False
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"
    plt.close(fig)


def test_style_keeps_legends_when_asked_and_refuses_unknown_placements():
    fig, ax = plt.subplots()
    ax.plot([1, 2], label="a")
    ax.legend()
    plotting.style(fig, legend="keep")
    assert ax.get_legend() is not None and not fig.legends
    with pytest.raises(ValueError, match="legend"):
        plotting.style(fig, legend="left")
    plt.close(fig)


def test_finish_outside_a_kernel_leaves_the_figure_to_the_script():
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    assert plotting.finish(fig) is None
    assert plt.fignum_exists(fig.number)   # a script's savefig / plt.show() still has it
    plt.close(fig)


CELLS = {
    "finish last": "fig, ax = plt.subplots()\nax.plot([1, 2], label='a')\nax.legend()\nfinish(fig)",
    "finish then show": "fig, ax = plt.subplots()\nax.plot([1, 2])\nfinish(fig)\nplt.show()",
    "finish twice-shown before": "fig, ax = plt.subplots()\nax.plot([1, 2])\nfinish(fig)\nfig2 = None",
    # the proof that the count below sees a figure shown twice: the old way, a figure returned
    "a returned figure (the old bug)": "fig, ax = plt.subplots()\nax.plot([1, 2])\nfig",
}


def test_finish_shows_each_figure_once_in_a_kernel_at_its_drawn_size():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nfrom perflab.record.plotting import finish")]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    images = {name: [o for o in cell.outputs if "image/png" in o.get("data", {})]
              for name, cell in zip(CELLS, nb.cells[1:])}
    assert len(images["a returned figure (the old bug)"]) == 2, "the count would not see a figure shown twice"
    for name in ("finish last", "finish then show", "finish twice-shown before"):
        assert len(images[name]) == 1, f"{name}: shown {len(images[name])} times"
        shown = images[name][0].get("metadata", {}).get("image/png", {}).get("width")
        assert shown and shown <= plotting.COLUMN_WIDTH_IN * 100 + 20, (
            f"{name}: shown {shown} px wide, more than the column (or not at its drawn size)")


def test_plot_ratios_reads_small_differences_on_a_linear_axis_and_large_on_a_log_one():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from perflab.record.plotting import plot_ratios
    plt.close("all")
    plot_ratios({"copy": 0.97, "knee": 0.96})      # a log axis over 0.96-1 hid the 4 %
    ax = plt.gcf().axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    plt.close("all")
    plot_ratios({"disk": 30.0, "copy": 0.2})
    ax = plt.gcf().axes[0]
    assert ax.get_xscale() == "log"
    plt.gcf().canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "1" in labels and "10" in labels    # plain numbers, not 10^0
    plt.close("all")
    for bad in ({}, {"a": 0.0}, {"a": float("nan")}):
        with pytest.raises(ValueError, match="ratios"):
            plot_ratios(bad)
