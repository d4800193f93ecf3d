import math

import pytest
import torch

from perflab.machine import roofline
from perflab.machine.sweep import sweep_repeat   # chapter 1's cell, exported


def test_matmul_cost_counts_two_flops_per_multiply_add_and_each_operand_once():
    c = roofline.matmul_cost(2, 3, 4, torch.float32)
    assert c.flops == 2 * 2 * 3 * 4
    assert c.bytes == (2 * 4 + 4 * 3 + 2 * 3) * 4
    assert roofline.matmul_cost(2, 3, 4, torch.bfloat16).bytes == c.bytes / 2


def test_matvec_is_far_less_intense_than_square_matmul():
    assert roofline.matmul_cost(4096, 1, 4096, torch.bfloat16).intensity < 1.01
    assert roofline.matmul_cost(4096, 4096, 4096, torch.bfloat16).intensity > 1000


def test_elementwise_cost_reads_and_writes_each_tensor_once():
    c = roofline.elementwise_cost(1000, 3, torch.float32, inputs=2, outputs=1)
    assert (c.flops, c.bytes) == (3000, 12000)
    assert roofline.elementwise_cost(8, 16).intensity == 2.0  # x*2 repeated 16 times: 16 FLOP / 8 bytes


@pytest.mark.parametrize("kwargs, word", [
    (dict(numel=0, flops_per_element=1), "numel"),
    (dict(numel=10, flops_per_element=-1), "flops_per_element"),
    (dict(numel=10, flops_per_element=1, inputs=0), "inputs"),
])
def test_elementwise_cost_names_the_bad_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        roofline.elementwise_cost(**kwargs)


def test_bad_dtype_and_dimension_are_rejected():
    with pytest.raises(TypeError, match="dtype"):
        roofline.matmul_cost(2, 2, 2, "float32")
    with pytest.raises(ValueError, match="k"):
        roofline.matmul_cost(2, 2, 0)
    with pytest.raises(ValueError, match="m"):
        roofline.matmul_cost(2.5, 2, 2)


def test_ridge_attainable_and_classify_follow_the_roofline():
    peak, bw = 100e12, 4e12
    assert roofline.ridge_point(peak, bw) == 25
    assert roofline.attainable_flops(5, peak, bw) == 20e12
    assert roofline.attainable_flops(1000, peak, bw) == peak
    assert roofline.classify(24.9, 25) == "bandwidth-bound"
    assert roofline.classify(25, 25) == "compute-bound"
    with pytest.raises(ValueError, match="bandwidth"):
        roofline.ridge_point(1, 0)
    with pytest.raises(ValueError, match="intensity"):
        roofline.classify(-1, 25)


def test_predicted_knee_for_float32_x_times_two():
    # 33.45 TFLOP/s of multiplies over 4.2 TB/s: ridge 7.96 FLOP/B, 8 bytes per element -> knee ~64
    assert math.isclose(roofline.predicted_knee_repeat(33.45e12, 4.2e12), 8 * 33.45 / 4.2)
    with pytest.raises(ValueError, match="bytes_per_element"):
        roofline.predicted_knee_repeat(1, 1, bytes_per_element=0)


def _synthetic_sweep(t_flat, per_repeat):
    # an ideal roofline machine: time = max(memory time, compute time)
    return [roofline.SweepPoint(r, max(t_flat, r * per_repeat), 1e6 * r, 8e6) for r in (1, 4, 16, 64, 256, 1024)]


def test_knee_from_sweep_recovers_the_intersection_of_the_roofs():
    pts = _synthetic_sweep(1e-3, 1e-3 / 64)
    assert math.isclose(roofline.knee_from_sweep(pts), 64)


def test_knee_from_sweep_refuses_a_sweep_that_never_turns_compute_bound():
    pts = _synthetic_sweep(1e-3, 1e-9)
    with pytest.raises(ValueError, match="never turned compute-bound"):
        roofline.knee_from_sweep(pts)
    with pytest.raises(ValueError, match="at least 2"):
        roofline.knee_from_sweep(pts[:1])


def test_sweep_point_rates():
    p = roofline.SweepPoint(repeat=8, seconds=2.0, flops=16.0, bytes=8.0)
    assert (p.flops_per_s, p.bytes_per_s, p.intensity) == (8.0, 4.0, 2.0)


def test_repeat_multiply_computes_x_times_two_to_the_repeat():
    x = torch.randn(64)
    eager = roofline.repeat_multiply(5, compile=False)
    torch.testing.assert_close(eager(x), x * 32)
    with pytest.raises(ValueError, match="repeat"):
        roofline.repeat_multiply(0)


def test_sweep_repeat_compiles_each_repeat_into_one_fused_kernel():
    x = torch.randn(4096)
    pts = sweep_repeat(x, [1, 3, 9])
    assert [p.repeat for p in pts] == [1, 3, 9]
    # on a CPU a fused Inductor kernel dispatches no ATen compute operator at all; the eager
    # fallback after dynamo's recompile limit would show `repeat` of them
    assert all(p.kernels == 0 for p in pts)
    assert all(p.seconds > 0 for p in pts)
    assert pts[2].flops == 9 * 4096 and pts[2].bytes == 8 * 4096


def test_ceilings_measure_positive_rates_on_cpu():
    assert roofline.copy_bandwidth("cpu", 2**16) > 0
    assert roofline.matmul_rate("cpu", 64) > 0
    with pytest.raises(ValueError, match="tf32"):
        roofline.matmul_rate("cpu", 64, torch.bfloat16, tf32=True)


def test_matmul_rate_restores_the_float32_precision_setting():
    before = torch.get_float32_matmul_precision()
    roofline.matmul_rate("cpu", 32, tf32=True)
    assert torch.get_float32_matmul_precision() == before


def test_plots_return_figures():
    import matplotlib

    matplotlib.use("Agg")
    pts = _synthetic_sweep(1e-3, 1e-3 / 64)
    fig = roofline.plot_sweep(pts, 8e9, 64e9, knee_measured=64, knee_predicted=60)
    assert len(fig.axes) == 3
    fig = roofline.plot_roofline(8e9, 64e9, pts, labelled=[("mm", 100.0, 50e9)], extra_roofs=[("tc", 1e12)])
    assert fig.axes[0].get_xscale() == "log"


def test_knee_check_bound_is_the_larger_roof_term_and_verdicts_follow_the_ratio():
    k = roofline.KneeCheck(repeat=64, seconds=0.6e-3, memory_s=0.5e-3, compute_s=0.45e-3)
    assert k.bound_s == 0.5e-3 and k.sum_s == pytest.approx(0.95e-3)
    assert k.ratio == pytest.approx(1.2)
    assert k.clock_fraction == 1.0               # no telemetry: the clock is taken as maximal
    assert k.verdict == "partial overlap"
    assert "1.20x" in k.sentence(63.7) and "formula gives 63.7" in k.sentence(63.7)
    assert roofline.KneeCheck(64, 0.51e-3, 0.5e-3, 0.45e-3).verdict == "at bound"
    assert roofline.KneeCheck(64, 2e-3, 0.5e-3, 0.45e-3).verdict == "other"
    # a CPU's peak is a measured rate, not the clock model's at a maximum clock
    assert "at the maximum clock" in k.sentence()
    cpu = roofline.KneeCheck(64, 0.6e-3, 0.5e-3, 0.45e-3, on_gpu=False)
    assert "maximum clock" not in cpu.sentence() and "at the peak given" in cpu.sentence()
    x = torch.ones(1024)
    assert roofline.knee_check(x, 4, 1e9, 1e9, compile=False).on_gpu is False


def test_knee_check_accounts_for_a_lowered_clock():
    class Tel:
        clock_fraction = 0.8
    k = roofline.KneeCheck(64, 0.6e-3, 0.4e-3, 0.48e-3, telemetry=Tel())
    assert k.bound_at_clock_s == pytest.approx(0.6e-3)    # 0.48 / 0.8
    assert k.verdict == "clock"
    assert "clock it ran at" in k.sentence()


def test_knee_check_measures_on_cpu_and_rejects_bad_arguments():
    x = torch.randn(4096)
    k = roofline.knee_check(x, 8, peak_flops=1e12, bandwidth=1e10, compile=False)
    assert k.repeat == 8 and k.seconds > 0
    assert k.memory_s == pytest.approx(4096 * 8 / 1e10)
    assert k.compute_s == pytest.approx(4096 * 8 / 1e12)
    assert k.telemetry is not None
    with pytest.raises(ValueError, match="peak_flops"):
        roofline.knee_check(x, 8, peak_flops=None, bandwidth=1e10)
    with pytest.raises(ValueError, match="bandwidth"):
        roofline.knee_check(x, 8, peak_flops=1e12, bandwidth=0)
    with pytest.raises(ValueError, match="repeat"):
        roofline.knee_check(x, 0, peak_flops=1e12, bandwidth=1e10)
    with pytest.raises(TypeError, match="x must"):
        roofline.knee_check(torch.arange(4), 8, peak_flops=1e12, bandwidth=1e10)


def test_ridge_changes_names_the_steps_where_the_ridge_fell():
    """The datasheets: bf16 ridge V100 (fp16) 139 -> A100 153 -> H100 295 -> H200 206 FLOP/B."""
    from perflab.machine.datasheets import DATASHEETS
    names = ["Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
             "NVIDIA H200"]
    tc = [(n, DATASHEETS[n].get("bf16_flops", DATASHEETS[n].get("fp16_flops")),
           DATASHEETS[n]["memory_bandwidth"]) for n in names]
    falls = roofline.ridge_changes(tc)
    assert [(a, b) for a, b, *_ in falls] == [("NVIDIA H100 80GB HBM3", "NVIDIA H200")]
    assert falls[0][4] == 1.0 and falls[0][5] == pytest.approx(4.8 / 3.35)
    fp32 = [(n, DATASHEETS[n]["fp32_flops"], DATASHEETS[n]["memory_bandwidth"]) for n in names]
    assert [(a, b) for a, b, *_ in roofline.ridge_changes(fp32)] == [
        ("Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB"), ("NVIDIA H100 80GB HBM3", "NVIDIA H200")]
    assert roofline.ridge_changes([("a", 1.0, 1.0), ("b", 4.0, 2.0)]) == []
    with pytest.raises(ValueError, match="two machines"):
        roofline.ridge_changes([("a", 1.0, 1.0)])
