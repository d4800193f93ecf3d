"""An interactive roofline: pick a device, a precision and an arithmetic intensity; see what the
roofline predicts there and what was measured.

The model is the roofline (Williams, Waterman and Patterson, CACM 52(4), 2009)::

    attainable FLOP/s = min(peak FLOP/s of the precision, intensity x memory bandwidth)

A :class:`Machine` holds one device's roofs (bandwidth in bytes/s, one peak in FLOP/s per
precision) and the points measured on it. Machines come from three places, in
:mod:`perflab.machine.roofs`: the vendors' datasheets, chapter 1's reference run, and this
machine measured now.

:class:`RooflineExplorer` draws them (:meth:`~RooflineExplorer.figure`, a static matplotlib
figure) and, in a live Jupyter kernel, wraps them in ipywidgets sliders
(:meth:`~RooflineExplorer.widget`). Units: FLOP/byte, FLOP/s, bytes/s, seconds.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from perflab.core.formats import FORMATS, check as _check_precision
from perflab.core.validate import positive, positive_int
from perflab.machine import roofline
from perflab.record.numbers import fmt
from perflab.record.plotting import style

__all__ = [
    "PRECISIONS",
    "SUBSTITUTES",
    "Machine",
    "MeasuredPoint",
    "Prediction",
    "RooflineExplorer",
    "matmul_intensity",
]

#: The precisions the explorer draws: :data:`perflab.core.formats.FORMATS` itself (key -> label, torch
#: dtype name, bytes per element, tf32 flag), under the name chapter readers know.
PRECISIONS = FORMATS


# A precision a device lacks -> the one drawn in its place when devices are compared.
SUBSTITUTES: dict[str, str] = {"bf16": "fp16"}


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured kernel placed on the roofline.

    Attributes:
        label: what ran, e.g. ``"matmul n=1024"``.
        precision: a key of :data:`PRECISIONS`.
        intensity: arithmetic intensity in FLOP/byte.
        flops_per_s: achieved FLOP/s.
        seconds: measured time of one call (median), or None when only the rate is known.
        size: the problem size (``n`` of an ``n x n`` product), or None.
        sm_clock_hz: the median SM clock read inside this point's own timed window (Hz), or
            None (no GPU, or too few readings to read a clock).
    """

    label: str
    precision: str
    intensity: float
    flops_per_s: float
    seconds: float | None = None
    size: int | None = None
    sm_clock_hz: float | None = None


@dataclass(frozen=True)
class Prediction:
    """What the roofline says at one intensity (see :meth:`Machine.predict`).

    Attributes:
        intensity: FLOP/byte. ridge: the ridge point, FLOP/byte.
        attainable: the bound, FLOP/s. peak: the precision's compute roof, FLOP/s.
        regime: ``"bandwidth-bound"`` or ``"compute-bound"``.
    """

    intensity: float
    ridge: float
    attainable: float
    peak: float
    regime: str

    @property
    def fraction_of_peak(self) -> float:
        """attainable / peak (1.0 when compute-bound)."""
        return self.attainable / self.peak


@dataclass(frozen=True)
class Machine:
    """One device's roofs and measured points.

    Attributes:
        name: shown in menus and legends.
        bandwidth: memory roof in bytes/s.
        peaks: compute roof per precision key (:data:`PRECISIONS`), FLOP/s.
        source: where the roofs come from (a datasheet, a run).
        points: kernels measured on this device.
        knee_intensity: where a measured sweep turned compute-bound (FLOP/byte), if known.
        clock: the telemetry sentence the points were measured under (clock, power), or "".
        knee_rate: that sweep's measured compute plateau (FLOP/s), if known: chapter 1's
            ``x*2`` multiplies without adding, so its plateau is not the FMA roof of ``peaks``.

    Raises:
        ValueError: a non-positive bandwidth or peak, an unknown precision, or no peaks at all.
    """

    name: str
    bandwidth: float
    peaks: Mapping[str, float]
    source: str
    points: tuple[MeasuredPoint, ...] = ()
    knee_intensity: float | None = None
    clock: str = ""
    knee_rate: float | None = None

    def __post_init__(self):
        positive("bandwidth", self.bandwidth)
        if not self.peaks:
            raise ValueError(f"peaks must name at least one precision for machine {self.name!r}")
        for key, value in self.peaks.items():
            _check_precision(key)
            positive(f"peaks[{key!r}]", value)

    @property
    def precisions(self) -> list[str]:
        """The precisions this machine has a roof for, in :data:`PRECISIONS` order."""
        return [p for p in PRECISIONS if p in self.peaks]

    def ridge(self, precision: str) -> float:
        """Ridge point of ``precision`` in FLOP/byte: peak / bandwidth.

        Raises:
            ValueError: the machine has no roof for ``precision``.
        """
        _check_precision(precision, self.precisions)
        return roofline.ridge_point(self.peaks[precision], self.bandwidth)

    def attainable(self, intensity: float, precision: str) -> float:
        """Roofline bound at ``intensity`` (FLOP/byte), in FLOP/s.

        Raises:
            ValueError: a non-positive intensity, or no roof for ``precision``.
        """
        intensity = positive("intensity", intensity)
        _check_precision(precision, self.precisions)
        return roofline.attainable_flops(intensity, self.peaks[precision], self.bandwidth)

    def predict(self, intensity: float, precision: str) -> Prediction:
        """The roofline's prediction at ``intensity`` for ``precision`` (see :class:`Prediction`)."""
        bound = self.attainable(intensity, precision)
        ridge = self.ridge(precision)
        return Prediction(float(intensity), ridge, bound, self.peaks[precision],
                          roofline.classify(intensity, ridge))


def matmul_intensity(n: int, precision: str) -> float:
    """Arithmetic intensity of a square ``n x n @ n x n`` product: ``2 n^3`` FLOPs over
    ``3 n^2`` elements moved (A and B read, C written), in FLOP/byte: ``2 n / (3 * itemsize)``
    (the closed form of :func:`perflab.machine.costs.matmul_cost` at the precision's bytes per element).

    Raises:
        ValueError: ``n`` not a positive integer, or an unknown precision.
    """
    positive_int("n", n)
    itemsize = FORMATS[_check_precision(precision)].itemsize
    return 2.0 * n / (3.0 * itemsize)


# ---------------------------------------------------------------------------------------------
# Drawing and the widget
# ---------------------------------------------------------------------------------------------

def _fmt_rate(flops: float) -> str:
    """A rate as a person writes it: "67.9 TFLOP/s", "1.07 PFLOP/s" (never "1.07e+03 TFLOP/s")."""
    return fmt(flops, "FLOP/s")


class RooflineExplorer:
    """Rooflines of several machines, one selected device, precision and intensity.

    Args:
        machines: the devices to choose from (at least one); names must be unique.
        device: name of the initially selected machine (default: the first).
        precision: initially selected precision (default: bf16 if the device has it, else FP32,
            else its first).
        intensity: initially selected arithmetic intensity, FLOP/byte (default 16).
        reference: an optional machine whose measured roofs (and knee) are drawn, dashed, beside
            whichever device is selected, for comparison (chapter 1's reference run).

    Raises:
        ValueError: no machines, duplicate names, an unknown device or precision, or a
            non-positive intensity.
    """

    def __init__(self, machines: Sequence[Machine], device: str | None = None, precision: str | None = None,
                 intensity: float = 16.0, reference: Machine | None = None):
        machines = list(machines)
        if not machines:
            raise ValueError("machines must contain at least one Machine")
        names = [m.name for m in machines]
        if len(set(names)) != len(names):
            raise ValueError(f"machines must have unique names, got {names}")
        self.machines = {m.name: m for m in machines}
        self.reference = reference
        self.device = device if device is not None else names[0]
        if self.device not in self.machines:
            raise ValueError(f"device must be one of {names}, got {device!r}")
        m = self.machines[self.device]
        self.precision = precision if precision is not None else self._default_precision(m)
        _check_precision(self.precision, m.precisions)
        self.intensity = positive("intensity", intensity)

    # -- state ------------------------------------------------------------------------------

    @staticmethod
    def _default_precision(machine: Machine) -> str:
        for p in ("bf16", "fp32"):
            if p in machine.peaks:
                return p
        return machine.precisions[0]

    @property
    def machine(self) -> Machine:
        """The selected machine."""
        return self.machines[self.device]

    def select(self, device: str | None = None, precision: str | None = None,
               intensity: float | None = None) -> Prediction:
        """Change the selection (any subset) and return the new :class:`Prediction`.

        Choosing a device that lacks the current precision switches to its default one (bf16, else
        FP32, else its first).

        Raises:
            ValueError: an unknown device, a precision the device has no roof for, or a
                non-positive intensity.
        """
        if device is not None:
            if device not in self.machines:
                raise ValueError(f"device must be one of {list(self.machines)}, got {device!r}")
            self.device = device
            if precision is None and self.precision not in self.machine.precisions:
                self.precision = self._default_precision(self.machine)
        if precision is not None:
            _check_precision(precision, self.machine.precisions)
            self.precision = precision
        if intensity is not None:
            self.intensity = positive("intensity", intensity)
        return self.prediction()

    def prediction(self) -> Prediction:
        """The roofline's prediction for the current selection."""
        return self.machine.predict(self.intensity, self.precision)

    def nearest_points(self, factor: float = 2.0) -> list[MeasuredPoint]:
        """Measured points of the selected machine and precision within ``factor`` x of the intensity."""
        positive("factor", factor)
        return [p for p in self.machine.points
                if p.precision == self.precision and self.intensity / factor <= p.intensity <= self.intensity * factor]

    def readout(self) -> str:
        """The prediction in words (what the widget prints under its sliders)."""
        m, pred = self.machine, self.prediction()
        label = PRECISIONS[self.precision][0]
        text = (f"{m.name}, {label}: ridge point {fmt(pred.ridge, 'FLOP/byte')}. "
                f"At {fmt(pred.intensity, 'FLOP/byte')} a kernel is {pred.regime}: "
                f"at most {_fmt_rate(pred.attainable)}, "
                f"{fmt(pred.fraction_of_peak, '%')} of the {_fmt_rate(pred.peak)} roof. ")
        gb_moved = 1e9
        text += (f"Moving 1 GB at this intensity ({fmt(pred.intensity * gb_moved, 'FLOP')}) takes at least "
                 f"{fmt(max(gb_moved / m.bandwidth, pred.intensity * gb_moved / pred.peak), 's')}.")
        near = self.nearest_points()
        if near:
            best = max(near, key=lambda p: p.flops_per_s)
            bound = m.attainable(best.intensity, self.precision)
            text += (f" Measured nearby: {best.label} at {fmt(best.intensity, 'FLOP/byte')} reached "
                     f"{_fmt_rate(best.flops_per_s)}, {fmt(best.flops_per_s / bound, '%', sig=2)} of the "
                     "roofline there")
            text += f" ({m.clock})." if m.clock else "."
        return text

    # -- drawing ----------------------------------------------------------------------------

    def _span(self, machines: Sequence[Machine], precisions: Sequence[str]) -> tuple[float, float]:
        xs = [self.intensity]
        for m in machines:
            xs += [m.ridge(p) for p in precisions if p in m.peaks]
            xs += [pt.intensity for pt in m.points if pt.precision in precisions]
        return min(xs) / 8, max(xs) * 8

    def draw(self, ax, precision: str | None = None, machines: Sequence[Machine] | None = None,
             show_selection: bool = True) -> None:
        """Draw rooflines of ``machines`` (default: the selected one) for ``precision`` (default:
        the selected one) on the matplotlib axes ``ax``, with measured points, the reference
        run's measured roofs and, if ``show_selection``, the selected intensity's prediction."""
        precision = precision or self.precision
        machines = list(machines) if machines is not None else [self.machine]
        lo, hi = self._span(machines + ([self.reference] if self.reference else []), [precision])
        x = np.logspace(math.log10(lo), math.log10(hi), 256)
        for i, m in enumerate(machines):
            if precision not in m.peaks:
                continue
            color = "k" if len(machines) == 1 else f"C{i}"
            ax.plot(x, np.minimum(m.peaks[precision], x * m.bandwidth) / 1e12, "-", color=color, lw=2,
                    label=f"{m.name}: roofline")
            pts = [p for p in m.points if p.precision == precision]
            if pts:
                ax.plot([p.intensity for p in pts], [p.flops_per_s / 1e12 for p in pts], "o", color="C1",
                        label=f"measured: {', '.join(p.label for p in pts[:1])} ... {pts[-1].label}")
        ref = self.reference
        if ref is not None and precision in ref.peaks and ref.name not in [m.name for m in machines]:
            ax.plot(x, np.minimum(ref.peaks[precision], x * ref.bandwidth) / 1e12, "--", color="C2", lw=1.3,
                    label=f"{ref.name}: measured ceilings")
            if ref.knee_intensity and precision == "fp32":
                k = ref.knee_intensity
                if ref.knee_rate:   # x*2 multiplies without adding: its own measured plateau
                    ax.plot(x, np.minimum(ref.knee_rate, x * ref.bandwidth) / 1e12, ":",
                            color="C2", lw=1.3,
                            label="chapter 1: x*2 measured (multiply, no FMA: its own plateau)")
                top = min(k * ref.bandwidth, ref.knee_rate or math.inf)
                ax.plot([k], [top / 1e12], "D", color="C2", ms=6,
                        label="chapter 1: measured knee of x*2 (FP32 multiply)")
        if show_selection and precision in self.machine.peaks:
            pred = self.machine.predict(self.intensity, precision)
            ax.axvline(pred.intensity, color="C3", ls=":", lw=1)
            ax.plot([pred.intensity], [pred.attainable / 1e12], "*", color="C3", ms=13,
                    label=f"prediction at {fmt(pred.intensity, 'FLOP/B')}: {_fmt_rate(pred.attainable)}")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="TFLOP/s",
               title=PRECISIONS[precision][0])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)

    def figure(self, precisions: Sequence[str] | None = None):
        """A static figure of the selected device: one panel per precision (default: the
        selected one), stacked, each with its roofline, measured points, the reference run's measured
        roofs and the selected intensity's prediction. Returns the matplotlib Figure."""
        precisions = list(precisions) if precisions is not None else [self.precision]
        for p in precisions:
            _check_precision(p, self.machine.precisions)
        fig, axes = plt.subplots(len(precisions), 1, figsize=(7.5, 5.6 * len(precisions)), squeeze=False)
        for ax, p in zip(axes[:, 0], precisions):
            self.draw(ax, p)
            ax.set_title(f"{self.machine.name}\n{PRECISIONS[p][0]}", fontsize=10)
        return style(fig, legend="keep")  # each panel keeps its own legend, under it

    def compare_figure(self, precisions: Sequence[str], machines: Sequence[str] | None = None):
        """Several devices' rooflines on shared axes, one panel per precision (stacked): the static view
        of the device menu. A device without a roof for a panel's precision is drawn with its
        :data:`SUBSTITUTES` precision if it has that (a V100 has fp16 where later GPUs have
        bf16), labelled so; a dot marks each ridge point. ``machines`` are names (default: every
        machine). Returns the matplotlib Figure.

        Raises:
            ValueError: an unknown precision or machine name.
        """
        for p in precisions:
            _check_precision(p)
        names = list(machines) if machines is not None else list(self.machines)
        for n in names:
            if n not in self.machines:
                raise ValueError(f"machines must be names among {list(self.machines)}, got {n!r}")
        fig, axes = plt.subplots(len(precisions), 1, figsize=(7.5, 6.0 * len(precisions)), squeeze=False)
        for ax, p in zip(axes[:, 0], precisions):
            drawn = []
            for i, n in enumerate(names):
                m = self.machines[n]
                q = p if p in m.peaks else SUBSTITUTES.get(p) if SUBSTITUTES.get(p) in m.peaks else None
                if q is not None:
                    drawn.append((i, m, q))
            if not drawn:
                ax.set_axis_off()
                ax.set_title(f"{PRECISIONS[p][0]}: no device has this roof")
                continue
            ridges = [m.ridge(q) for _, m, q in drawn]
            x = np.logspace(math.log10(min(ridges) / 16), math.log10(max(ridges) * 16), 256)
            for i, m, q in drawn:
                label = m.name if q == p else f"{m.name}, {PRECISIONS[q][0]}"
                ax.plot(x, np.minimum(m.peaks[q], x * m.bandwidth) / 1e12, "-", color=f"C{i}", lw=1.8, label=label)
                ax.plot([m.ridge(q)], [m.peaks[q] / 1e12], "o", color=f"C{i}", ms=4)
            ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="TFLOP/s",
                   title=f"{PRECISIONS[p][0]} (dots: ridge points)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        return style(fig, legend="keep")  # each panel keeps its own legend, under it

    def widget(self):
        """The explorer as ipywidgets (needs a live Jupyter kernel to respond): an intensity
        slider (log scale), a precision slider, a device menu, the prediction in words and the
        figure. Returns an ``ipywidgets.VBox``.

        Raises:
            ImportError: ipywidgets is not installed (``pip install ipywidgets``).
        """
        try:  # optional (the `book` extra): the static figure needs no ipywidgets
            import ipywidgets as W
        except ImportError as err:  # pragma: no cover - ipywidgets is in requirements.txt
            raise ImportError("the roofline explorer's widget needs ipywidgets: pip install ipywidgets") from err

        style = {"description_width": "110px"}
        layout = W.Layout(width="640px")
        device = W.Dropdown(options=list(self.machines), value=self.device, description="device", style=style,
                            layout=layout)
        precision = W.SelectionSlider(options=[(PRECISIONS[p][0], p) for p in self.machine.precisions],
                                      value=self.precision, description="precision", style=style, layout=layout,
                                      continuous_update=False)
        intensity = W.FloatLogSlider(value=self.intensity, base=10, min=-2, max=4, step=0.05,
                                     description="intensity (FLOP/B)", style=style, layout=layout,
                                     continuous_update=False, readout_format=".3g")
        text = W.HTML()
        # The figure is an Image widget holding PNG bytes, not an Output widget: to run an Output
        # widget headless, nbclient mimics a front end and sends the captured figure back to the
        # kernel while the cell runs; executed that way on the GPU machine the cell took minutes
        # with the kernel idle. An image is plain widget state, like the sliders'.
        picture = W.Image(format="png", layout=W.Layout(width="640px"))

        def redraw(*_):
            text.value = f"<p style='max-width:640px'>{self.readout()}</p>"
            fig = self.figure()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=80)
            plt.close(fig)
            picture.value = buf.getvalue()

        def on_device(change):
            self.select(device=change["new"])
            precision.unobserve(on_precision, "value")
            precision.options = [(PRECISIONS[p][0], p) for p in self.machine.precisions]
            precision.value = self.precision
            precision.observe(on_precision, "value")
            redraw()

        def on_precision(change):
            self.select(precision=change["new"])
            redraw()

        def on_intensity(change):
            self.select(intensity=change["new"])
            redraw()

        device.observe(on_device, "value")
        precision.observe(on_precision, "value")
        intensity.observe(on_intensity, "value")
        redraw()
        box = W.VBox([device, precision, intensity, text, picture])
        box.controls = {"device": device, "precision": precision, "intensity": intensity, "text": text,
                        "figure": picture}
        return box
