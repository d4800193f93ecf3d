"""Lab 2's exercise 1 checks: the capacity recipe on real GPU curves, and the physical check
against the GPU's L2 as its datasheet gives it (the driver's figure only where the course has
no datasheet figure)."""

import pytest

from perflab.labs import lab02
from perflab.labs.exercises import ExerciseFailed

MiB = 2**20


def test_the_recipe_reads_the_reference_h100_within_the_band_of_its_datasheet_l2():
    capacity = lab02.capacity_reference(*lab02.H100_REFERENCE_CURVE)
    assert capacity == 32 * MiB
    l2, source = lab02.l2_reference("NVIDIA H100 80GB HBM3", 50 * MiB)
    assert (l2, source) == (50 * MiB, "the datasheet")
    assert lab02.CAPACITY_BAND[0] <= capacity / l2 <= lab02.CAPACITY_BAND[1]
    assert lab02.check_physical(capacity, l2, source=source)


def test_the_datasheet_figure_wins_over_a_driver_that_reports_something_else(capsys):
    # a driver that reported the full GH100's 60 MiB on an H100 would move the band; the
    # datasheet's 50 MiB does not
    l2, source = lab02.l2_reference("NVIDIA H100 80GB HBM3", 60 * MiB)
    assert l2 == 50 * MiB
    lab02.check_physical(32 * MiB, l2, source=source)
    assert "of the 50 MiB the datasheet gives" in capsys.readouterr().out
    # a GPU without a datasheet figure: the driver's, and the message says so
    l2, source = lab02.l2_reference("NVIDIA H200", 60 * MiB)
    assert (l2, source) == (60 * MiB, "the driver")
    with pytest.raises(ExerciseFailed, match="the driver gives"):
        lab02.check_physical(512 * MiB, l2, source=source)


def test_wrong_answers_on_the_reference_h100_curve_are_not_physical():
    l2, source = lab02.l2_reference("NVIDIA H100 80GB HBM3", 50 * MiB)
    sizes, bws = lab02.H100_REFERENCE_CURVE
    # the largest size (a recipe that returns the end of the sweep) and the fastest point's
    # size (one that stops at the first point)
    for wrong in (sizes[-1], sizes[0]):
        with pytest.raises(ExerciseFailed, match="outside 0.4-1.1"):
            lab02.check_physical(wrong, l2, source=source)


def test_l2_reference_refuses_bad_input():
    with pytest.raises(ValueError, match="name"):
        lab02.l2_reference(None, 50 * MiB)
    with pytest.raises(ValueError, match="driver_bytes"):
        lab02.l2_reference("NVIDIA H100 80GB HBM3", 0)


def test_the_datasheet_l2_sizes_live_with_the_other_datasheet_facts_and_cite_a_source():
    from perflab.machine import datasheets
    assert lab02.DATASHEET_L2_BYTES is datasheets.DATASHEET_L2_BYTES
    for name, (nbytes, source) in datasheets.DATASHEET_L2_BYTES.items():
        assert name in datasheets.DATASHEETS          # the same device names
        assert nbytes % 2**20 == 0 and "whitepaper" in source
    assert "NVIDIA H200" not in datasheets.DATASHEET_L2_BYTES   # no citable figure


def test_the_recipe_steps_catch_a_student_who_skips_them():
    """Student review (6 December): a capacity_from_curve that leaves the end points unsmoothed and
    walks past the first fall passed on the student's one smooth curve; each made-up curve of
    check_recipe_steps names the step that was skipped."""
    import math
    import statistics

    from perflab.labs.exercises import ExerciseFailed

    def skipping(sizes, bws, ends=True, stop=True):
        smooth = (lab02._smooth(bws) if ends else [bws[0]] + [
            statistics.median(bws[i - 1:i + 2]) for i in range(1, len(bws) - 1)] + [bws[-1]])
        peak = smooth.index(max(smooth))
        beyond = [b for s, b in zip(sizes, smooth) if s >= 4 * sizes[peak]]
        threshold = math.sqrt(smooth[peak] * (statistics.median(beyond) if beyond else smooth[-1]))
        if not stop:
            return max(s for s, b in zip(sizes[peak:], smooth[peak:]) if b >= threshold)
        fall = next((i for i in range(peak, len(smooth)) if smooth[i] < threshold), len(smooth))
        return sizes[fall - 1]

    assert lab02.check_recipe_steps(lab02.capacity_reference)
    assert lab02.check_recipe_steps(skipping)
    with pytest.raises(ExerciseFailed, match="stray last point"):
        lab02.check_recipe_steps(lambda s, b: skipping(s, b, ends=False))
    with pytest.raises(ExerciseFailed, match="fall that recovers"):
        lab02.check_recipe_steps(lambda s, b: skipping(s, b, stop=False))
    with pytest.raises(TypeError, match="capacity_from_curve"):
        lab02.check_recipe_steps(3)


def test_ridge_hint_names_the_mistake_its_ratio_shows():
    """Student review (6 December, finding 10): every wrong ridge got the units hint."""
    card = {"cpu_matmul_gflops_fp32": 145.0, "cpu_memory_bandwidth_GBps": 13.2,
            "cpu_memory_bandwidth_1thread_GBps": 4.4}
    hint = lab02.ridge_hint(card, cuda=False)
    assert "unit prefix" in hint(1e9) and "unit prefix" in hint(1e-3)
    assert "copy bandwidth halved" in hint(2.0) and "unit" not in hint(2.0)
    assert "doubled" in hint(0.5)
    assert "all-thread one" in hint(3.0) and "unit" not in hint(3.0)
    assert "cpu_memory_bandwidth_GBps" in hint(1.7) and "halved" not in hint(1.7)
    gpu = lab02.ridge_hint({"matmul_tflops_bf16": 700.0, "gpu_copy_bandwidth_TBps": 3.0}, cuda=True)
    assert "gpu_copy_bandwidth_TBps" in gpu(1.3) and "unit prefix" in gpu(1e12)
