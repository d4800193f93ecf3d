import math

import pytest
import torch

from perflab.machine import roofline as R


def test_matmul_cost_counts_two_flops_per_multiply_add_and_each_operand_once():
    c = R.matmul_cost(2, 3, 4, torch.float32)
    assert c.flops == 2 * 2 * 3 * 4
    assert c.bytes == (2 * 4 + 4 * 3 + 2 * 3) * 4
    assert R.matmul_cost(2, 3, 4, torch.bfloat16).bytes == c.bytes / 2


def test_matvec_is_far_less_intense_than_square_matmul():
    assert R.matmul_cost(4096, 1, 4096, torch.bfloat16).intensity < 1.01
    assert R.matmul_cost(4096, 4096, 4096, torch.bfloat16).intensity > 1000


def test_elementwise_cost_reads_and_writes_each_tensor_once():
    c = R.elementwise_cost(1000, 3, torch.float32, inputs=2, outputs=1)
    assert (c.flops, c.bytes) == (3000, 12000)
    assert R.elementwise_cost(8, 16).intensity == 2.0  # x*2 repeated 16 times: 16 FLOP / 8 bytes


@pytest.mark.parametrize("kwargs, word", [
    (dict(numel=0, flops_per_element=1), "numel"),
    (dict(numel=10, flops_per_element=-1), "flops_per_element"),
    (dict(numel=10, flops_per_element=1, inputs=0), "inputs"),
])
def test_elementwise_cost_names_the_bad_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        R.elementwise_cost(**kwargs)


def test_bad_dtype_and_dimension_are_rejected():
    with pytest.raises(TypeError, match="dtype"):
        R.matmul_cost(2, 2, 2, "float32")
    with pytest.raises(ValueError, match="k"):
        R.matmul_cost(2, 2, 0)
    with pytest.raises(ValueError, match="m"):
        R.matmul_cost(2.5, 2, 2)


def test_ridge_attainable_and_classify_follow_the_roofline():
    peak, bw = 100e12, 4e12
    assert R.ridge_point(peak, bw) == 25
    assert R.attainable_flops(5, peak, bw) == 20e12
    assert R.attainable_flops(1000, peak, bw) == peak
    assert R.classify(24.9, 25) == "bandwidth-bound"
    assert R.classify(25, 25) == "compute-bound"
    with pytest.raises(ValueError, match="bandwidth"):
        R.ridge_point(1, 0)
    with pytest.raises(ValueError, match="intensity"):
        R.classify(-1, 25)


def test_predicted_knee_for_float32_x_times_two():
    # 33.45 TFLOP/s of multiplies over 4.2 TB/s: ridge 7.96 FLOP/B, 8 bytes per element -> knee ~64
    assert math.isclose(R.predicted_knee_repeat(33.45e12, 4.2e12), 8 * 33.45 / 4.2)
    with pytest.raises(ValueError, match="bytes_per_element"):
        R.predicted_knee_repeat(1, 1, bytes_per_element=0)


def _synthetic_sweep(t_flat, per_repeat):
    # an ideal roofline machine: time = max(memory time, compute time)
    return [R.SweepPoint(r, max(t_flat, r * per_repeat), 1e6 * r, 8e6) for r in (1, 4, 16, 64, 256, 1024)]


def test_knee_from_sweep_recovers_the_intersection_of_the_roofs():
    pts = _synthetic_sweep(1e-3, 1e-3 / 64)
    assert math.isclose(R.knee_from_sweep(pts), 64)


def test_knee_from_sweep_refuses_a_sweep_that_never_turns_compute_bound():
    pts = _synthetic_sweep(1e-3, 1e-9)
    with pytest.raises(ValueError, match="never turned compute-bound"):
        R.knee_from_sweep(pts)
    with pytest.raises(ValueError, match="at least 2"):
        R.knee_from_sweep(pts[:1])


def test_sweep_point_rates():
    p = R.SweepPoint(repeat=8, seconds=2.0, flops=16.0, bytes=8.0)
    assert (p.flops_per_s, p.bytes_per_s, p.intensity) == (8.0, 4.0, 2.0)


def test_repeat_multiply_computes_x_times_two_to_the_repeat():
    x = torch.randn(64)
    eager = R.repeat_multiply(5, compile=False)
    torch.testing.assert_close(eager(x), x * 32)
    with pytest.raises(ValueError, match="repeat"):
        R.repeat_multiply(0)


def test_sweep_repeat_compiles_each_repeat_into_one_fused_kernel():
    x = torch.randn(4096)
    pts = R.sweep_repeat(x, [1, 3, 9])
    assert [p.repeat for p in pts] == [1, 3, 9]
    # on a CPU a fused Inductor kernel dispatches no ATen compute operator at all; the eager
    # fallback after dynamo's recompile limit would show `repeat` of them
    assert all(p.kernels == 0 for p in pts)
    assert all(p.seconds > 0 for p in pts)
    assert pts[2].flops == 9 * 4096 and pts[2].bytes == 8 * 4096


def test_sweep_repeat_rejects_integer_tensors_and_empty_repeats():
    with pytest.raises(TypeError, match="floating-point"):
        R.sweep_repeat(torch.arange(4), [1])
    with pytest.raises(ValueError, match="empty"):
        R.sweep_repeat(torch.randn(4), [])


def test_ceilings_measure_positive_rates_on_cpu():
    assert R.copy_bandwidth("cpu", 2**16) > 0
    assert R.matmul_rate("cpu", 64) > 0
    with pytest.raises(ValueError, match="tf32"):
        R.matmul_rate("cpu", 64, torch.bfloat16, tf32=True)


def test_matmul_rate_restores_the_float32_precision_setting():
    before = torch.get_float32_matmul_precision()
    R.matmul_rate("cpu", 32, tf32=True)
    assert torch.get_float32_matmul_precision() == before


def test_plots_return_figures():
    import matplotlib

    matplotlib.use("Agg")
    pts = _synthetic_sweep(1e-3, 1e-3 / 64)
    fig = R.plot_sweep(pts, 8e9, 64e9, knee_measured=64, knee_predicted=60)
    assert len(fig.axes) == 3
    fig = R.plot_roofline(8e9, 64e9, pts, labelled=[("mm", 100.0, 50e9)], extra_roofs=[("tc", 1e12)])
    assert fig.axes[0].get_xscale() == "log"


def test_knee_check_bound_is_the_larger_roof_term_and_verdicts_follow_the_ratio():
    k = R.KneeCheck(repeat=64, seconds=0.6e-3, memory_s=0.5e-3, compute_s=0.45e-3)
    assert k.bound_s == 0.5e-3 and k.sum_s == pytest.approx(0.95e-3)
    assert k.ratio == pytest.approx(1.2)
    assert k.clock_fraction == 1.0               # no telemetry: the clock is taken as maximal
    assert k.verdict == "partial overlap"
    assert "1.20x" in k.sentence(63.7) and "formula gives 63.7" in k.sentence(63.7)
    assert R.KneeCheck(64, 0.51e-3, 0.5e-3, 0.45e-3).verdict == "at bound"
    assert R.KneeCheck(64, 2e-3, 0.5e-3, 0.45e-3).verdict == "other"


def test_knee_check_accounts_for_a_lowered_clock():
    class Tel:
        clock_fraction = 0.8
    k = R.KneeCheck(64, 0.6e-3, 0.4e-3, 0.48e-3, telemetry=Tel())
    assert k.bound_at_clock_s == pytest.approx(0.6e-3)    # 0.48 / 0.8
    assert k.verdict == "clock"
    assert "clock it ran at" in k.sentence()


def test_knee_check_measures_on_cpu_and_rejects_bad_arguments():
    x = torch.randn(4096)
    k = R.knee_check(x, 8, peak_flops=1e12, bandwidth=1e10, compile=False)
    assert k.repeat == 8 and k.seconds > 0
    assert k.memory_s == pytest.approx(4096 * 8 / 1e10)
    assert k.compute_s == pytest.approx(4096 * 8 / 1e12)
    assert k.telemetry is not None
    with pytest.raises(ValueError, match="peak_flops"):
        R.knee_check(x, 8, peak_flops=None, bandwidth=1e10)
    with pytest.raises(ValueError, match="bandwidth"):
        R.knee_check(x, 8, peak_flops=1e12, bandwidth=0)
    with pytest.raises(ValueError, match="repeat"):
        R.knee_check(x, 0, peak_flops=1e12, bandwidth=1e10)
    with pytest.raises(TypeError, match="x must"):
        R.knee_check(torch.arange(4), 8, peak_flops=1e12, bandwidth=1e10)
