"""perflab.machine.explorer and perflab.machine.roofs: roofline machines and where they come from,
predictions, measured points, figures and the widget (CPU)."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from perflab.machine import explorer, roofs  # noqa: E402
from perflab.machine.datasheets import DATASHEETS  # noqa: E402


def toy(name="toy", **extra):
    """bandwidth 1 TB/s, FP32 10 TFLOP/s (ridge 10 FLOP/B), bf16 100 TFLOP/s (ridge 100)."""
    return explorer.Machine(name, 1e12, {"fp32": 1e13, "bf16": 1e14}, "made up for the test", **extra)


def test_matmul_intensity_is_2n_over_3_itemsize():
    assert explorer.matmul_intensity(8192, "bf16") == pytest.approx(2 * 8192 / 6)
    assert explorer.matmul_intensity(3, "fp32") == pytest.approx(0.5)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="n must be"):
            explorer.matmul_intensity(bad, "fp32")
    with pytest.raises(ValueError, match="precision"):
        explorer.matmul_intensity(8, "int4")


def test_machine_validates_its_roofs():
    with pytest.raises(ValueError, match="bandwidth"):
        explorer.Machine("m", 0, {"fp32": 1e12}, "s")
    with pytest.raises(ValueError, match="peaks"):
        explorer.Machine("m", 1e12, {}, "s")
    with pytest.raises(ValueError, match="precision"):
        explorer.Machine("m", 1e12, {"fp12": 1e12}, "s")
    with pytest.raises(ValueError, match=r"peaks\['fp32'\]"):
        explorer.Machine("m", 1e12, {"fp32": -1.0}, "s")


def test_roofline_prediction_on_both_sides_of_the_ridge():
    m = toy()
    assert m.precisions == ["fp32", "bf16"]
    assert m.ridge("fp32") == pytest.approx(10)
    low = m.predict(5, "fp32")
    assert low.regime == "bandwidth-bound" and low.attainable == pytest.approx(5e12)
    assert low.fraction_of_peak == pytest.approx(0.5)
    high = m.predict(20, "fp32")
    assert high.regime == "compute-bound" and high.attainable == pytest.approx(1e13)
    # the same intensity is compute-bound in FP32 and bandwidth-bound on the tensor cores
    assert m.predict(20, "bf16").regime == "bandwidth-bound"
    with pytest.raises(ValueError, match="intensity"):
        m.attainable(0, "fp32")
    with pytest.raises(ValueError, match="precision"):
        m.ridge("tf32")


def test_datasheet_machines_follow_the_datasheets():
    machines = {m.name: m for m in roofs.datasheet_machines()}
    assert len(machines) == len(DATASHEETS)
    h200 = machines["NVIDIA H200 (datasheet)"]
    sheet = DATASHEETS["NVIDIA H200"]
    assert h200.ridge("bf16") == pytest.approx(sheet["bf16_flops"] / sheet["memory_bandwidth"])
    assert "bf16" not in machines["Tesla V100-SXM2-32GB (datasheet)"].peaks


def test_reference_machine_from_chapter_1_glue():
    glued = {"copy_bandwidth_TBps": 4.0, "matmul_tflops_fp32": 50.0, "matmul_tflops_bf16": 760.0,
             "roofline_knee_repeat": 96.0, "roofline_compute_plateau_tflops": 30.0}
    run = {"devices": ["NVIDIA H200"], "started": "2026-11-30T10:00:00Z"}
    m = roofs.reference_machine(glued, run)
    assert m.name == "NVIDIA H200 (chapter 1, measured)"
    assert m.bandwidth == pytest.approx(4e12) and m.peaks["bf16"] == pytest.approx(760e12)
    assert "tf32" not in m.peaks                      # not glued (a CPU run) -> no roof
    assert m.knee_intensity == pytest.approx(12.0)    # repeat / 8 bytes per float32 element
    assert m.knee_rate == pytest.approx(30e12)        # x*2's own plateau, not the FMA roof
    assert "2026-11-30" in m.source
    assert roofs.reference_machine({"matmul_tflops_fp32": 1.0}) is None
    assert roofs.reference_machine({"copy_bandwidth_TBps": 1.0}) is None


def test_measure_machine_on_this_cpu():
    m = roofs.measure_machine("cpu", sizes=[8, 32], copy_numel=2**12)
    assert m.precisions == ["fp32"] and m.bandwidth > 0
    assert [p.size for p in m.points] == [8, 32]
    for p in m.points:
        assert p.intensity == pytest.approx(explorer.matmul_intensity(p.size, "fp32"))
        assert p.flops_per_s == pytest.approx(2 * p.size**3 / p.seconds)
    assert m.peaks["fp32"] == max(p.flops_per_s for p in m.points)
    assert m.name.endswith("(measured now)") and all(p.sm_clock_hz is None for p in m.points)
    given = roofs.measure_machine("cpu", sizes=[8], bandwidth=123.0)
    assert given.bandwidth == 123.0
    # the run's roofs, not the best product, when given; the clock the products ran under
    run_roofs = roofs.measure_machine("cpu", sizes=[8], bandwidth=1.0, peaks={"fp32": 7e15})
    assert run_roofs.peaks == {"fp32": 7e15} and "measured over" in run_roofs.clock
    assert run_roofs.name.endswith("(this run's roofs)")
    with pytest.raises(ValueError, match="peaks"):
        roofs.measure_machine("cpu", sizes=[8], bandwidth=1.0, peaks={"bf16": 1.0})


def test_a_points_clock_is_read_inside_its_own_windows():
    samples = [{"t": t, "sm_clock_mhz": mhz} for t, mhz in
               [(0.1, 1980), (0.2, 1980), (0.3, 1980), (1.1, 1500), (1.2, 1520), (1.3, 1510),
                (1.4, None)]]
    assert roofs._clock_in(samples, [(1.0, 1.5)]) == pytest.approx(1510e6)
    assert roofs._clock_in(samples, [(0.0, 0.25)]) is None    # two readings: too short
    assert roofs._clock_in(samples, [(0.0, 0.15), (0.25, 1.15)]) == pytest.approx(1980e6)


@pytest.mark.parametrize("kwargs, match", [
    ({"sizes": []}, "sizes"),
    ({"sizes": [0]}, "sizes"),
    ({"precisions": ["tf32"]}, "tf32"),
    ({"precisions": ["fp8"]}, "fp8"),
    ({"copy_numel": 0}, "copy_numel"),
    ({"bandwidth": -1.0}, "bandwidth"),
])
def test_measure_machine_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        roofs.measure_machine("cpu", **{"sizes": [8], **kwargs})


def test_readout_writes_rates_and_fractions_as_a_person_would():
    h200 = explorer.Machine("h200", 4.8e12, {"bf16": 1.07e15}, "made up for the test")
    text = explorer.RooflineExplorer([h200], intensity=0.01).readout()
    assert "of the 1.07 PFLOP/s roof" in text and "e+" not in text
    assert "at most 48 GFLOP/s, 0.0045 % of the" in text   # 4.5e-5 of the peak
    assert "0.0%" not in text and "0.0 %" not in text


def test_explorer_selection_and_readout():
    point = explorer.MeasuredPoint("matmul n=30", "fp32", 20.0, 4e12, None, 30)
    m = toy(points=(point,))
    ex = explorer.RooflineExplorer([m, *roofs.datasheet_machines()], intensity=5)
    assert ex.precision == "bf16"                     # the default when the device has it
    pred = ex.select(precision="fp32")
    assert pred.regime == "bandwidth-bound"
    text = ex.readout()
    assert "ridge point 10 FLOP/byte" in text and "bandwidth-bound" in text
    assert "at most 5 TFLOP/s, 50 % of the 10 TFLOP/s roof" in text
    timed = explorer.RooflineExplorer([toy(points=(point,), clock="measured at 1,590 MHz")],
                                      precision="fp32", intensity=20)
    assert "(measured at 1,590 MHz)" in timed.readout()
    ex.select(intensity=16)
    assert ex.nearest_points() == [point]
    assert "matmul n=30" in ex.readout() and "40 % of the roofline there" in ex.readout()
    ex.select(device="Tesla V100-SXM2-32GB (datasheet)", precision="fp16")
    ex.select(device="toy")
    assert ex.precision == "bf16"                     # toy has no fp16: its default, bf16
    with pytest.raises(ValueError, match="device"):
        ex.select(device="nope")
    with pytest.raises(ValueError, match="precision"):
        ex.select(precision="fp8")
    with pytest.raises(ValueError, match="unique"):
        explorer.RooflineExplorer([toy(), toy()])
    with pytest.raises(ValueError, match="machines"):
        explorer.RooflineExplorer([])


def test_switching_to_a_device_without_the_precision_falls_back():
    ex = explorer.RooflineExplorer(roofs.datasheet_machines(), device="NVIDIA H200 (datasheet)", precision="bf16")
    ex.select(device="Tesla V100-SXM2-32GB (datasheet)")
    assert ex.precision == "fp32"                     # no bf16 on a V100: FP32 is the fallback


def test_figures_draw_roofs_points_and_the_prediction():
    ref = roofs.reference_machine({"copy_bandwidth_TBps": 2.0, "matmul_tflops_fp32": 5.0, "roofline_knee_repeat": 40})
    point = explorer.MeasuredPoint("matmul n=30", "fp32", 20.0, 4e12, None, 30)
    ex = explorer.RooflineExplorer([toy(points=(point,)), *roofs.datasheet_machines()], precision="fp32", reference=ref)
    fig = ex.figure(precisions=["fp32", "bf16"])
    try:
        assert len(fig.axes) == 2
        labels = [line.get_label() for line in fig.axes[0].lines]
        assert any("roofline" in label for label in labels)
        assert any("measured: matmul n=30" in label for label in labels)
        assert any("measured ceilings" in label for label in labels)
        assert any("measured knee" in label for label in labels)      # FP32 panel only
        assert not any("measured knee" in line.get_label() for line in fig.axes[1].lines)
        assert any(label.startswith("prediction at") for label in labels)
    finally:
        plt.close(fig)
    fig = ex.compare_figure(["fp32", "bf16"])
    try:
        bf16_labels = [line.get_label() for line in fig.axes[1].lines]
        assert any("V100" in label and "fp16" in label for label in bf16_labels)   # drawn in bf16's place
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="machines"):
        ex.compare_figure(["fp32"], machines=["nope"])


def test_widget_responds_to_its_sliders():
    pytest.importorskip("ipywidgets")
    ex = explorer.RooflineExplorer([toy(), *roofs.datasheet_machines()], precision="fp32", intensity=5)
    box = ex.widget()
    controls = box.controls
    assert "bandwidth-bound" in controls["text"].value
    before = controls["figure"].value
    assert before[:8] == b"\x89PNG\r\n\x1a\n"          # the figure, as PNG bytes
    controls["intensity"].value = 50.0
    assert ex.intensity == 50.0 and "compute-bound" in controls["text"].value
    assert controls["figure"].value != before
    controls["device"].value = "Tesla V100-SXM2-32GB (datasheet)"
    options = [value for _, value in controls["precision"].options]
    assert "bf16" not in options and "fp16" in options
    assert controls["precision"].value == ex.precision
    controls["precision"].value = "fp16"
    assert ex.precision == "fp16" and "fp16" in controls["text"].value
    plt.close("all")


def test_prediction_fraction_is_finite():
    pred = toy().predict(1e-3, "bf16")
    assert 0 < pred.fraction_of_peak < 1 and math.isfinite(pred.attainable)
