import math

import pytest
import torch

from perflab.machine import gpu, waves
from perflab.core.device import has_gpu

cpu_only = pytest.mark.skipif(has_gpu(), reason="checks the behaviour on a machine without a GPU")


def test_dram_bandwidth_from_clock_matches_the_h100_datasheet():
    assert gpu.dram_bandwidth_from_clock(5120, 2619e6) == pytest.approx(3.35e12, rel=0.01)
    with pytest.raises(ValueError, match="bus_width_bits"):
        gpu.dram_bandwidth_from_clock(0, 1e9)


def test_matmul_rates_on_cpu_cover_fp32_and_bf16():
    assert gpu.available_matmul_kinds("cpu") == ["fp32", "bf16"]
    rates, errors = gpu.matmul_rates("cpu", 64)
    assert set(rates) == {"fp32", "bf16"} and errors == {}
    assert all(math.isfinite(r) and r > 0 for r in rates.values())


def test_matmul_rate_rejects_unknown_and_gpu_only_formats_on_cpu():
    from perflab.machine import roofline

    with pytest.raises(ValueError, match="precision"):
        roofline.matmul_rate("cpu", 64, "int4")
    with pytest.raises(ValueError, match="tf32"):
        roofline.matmul_rate("cpu", 64, "tf32")
    with pytest.raises(RuntimeError, match="CUDA"):
        roofline.fp8_matmul_rate("cpu", 64)


def test_matmul_rates_reports_an_fp8_failure_instead_of_stopping(monkeypatch):
    def broken(device, n):
        raise RuntimeError("no fp8 kernel for this architecture\nsecond line")

    monkeypatch.setattr(gpu, "matmul_rate", lambda d, n, k: broken(d, n) if k == "fp8" else 1.0)
    rates, errors = gpu.matmul_rates("cpu", 64, ["fp32", "fp8"])
    assert rates == {"fp32": 1.0}
    assert errors == {"fp8": "RuntimeError: no fp8 kernel for this architecture"}


def test_elementwise_rate_rejects_a_bad_size():
    with pytest.raises(ValueError, match="numel"):
        gpu.elementwise_rate("cpu", 0, 4)


def test_elementwise_rate_is_timed_under_telemetry_after_the_compile(monkeypatch):
    """The point comes with the telemetry of its timing; the compile (here skipped: eager) is not
    part of it, so an idle GPU waiting for the compiler cannot set the clock it states."""
    from perflab.machine import roofline
    from perflab.core.telemetry import TelemetrySummary

    monkeypatch.setattr(gpu, "repeat_multiply", lambda r: roofline.repeat_multiply(r, compile=False))
    point, tel = gpu.elementwise_rate("cpu", 2**12, 4)
    assert (point.repeat, point.flops, point.bytes) == (4, 4 * 2**12, 2 * 4 * 2**12)
    assert point.kernels == 4                       # eager: one ATen multiply per repeat
    assert isinstance(tel, TelemetrySummary) and tel.duration_s > 0
    assert tel.sentence().startswith("measured over")


@cpu_only
def test_gpu_only_functions_say_so_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gpu.properties()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        waves.wave_sweep("cpu", 128, 128, [128])
    from perflab.core import nvml

    assert nvml.readings() is None


@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU")
def test_properties_on_a_gpu():
    p = gpu.properties(0)
    assert p["sm_count"] > 0 and p["warp_size"] == 32
    assert p["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory


def test_graph_copy_sweep_counts_the_working_set_as_its_traffic():
    from perflab.machine.caches import WorkingSetPoint

    pts = gpu.graph_copy_sweep("cpu", [2**16, 2**18], target_s=1e-5, reps=2)
    assert [p.nbytes for p in pts] == [2**16, 2**18]
    assert all(isinstance(p, WorkingSetPoint) and p.bytes_per_s > 0 for p in pts)
    with pytest.raises(ValueError, match="multiples of 8"):
        gpu.graph_copy_sweep("cpu", [12])
    with pytest.raises(ValueError, match="target_s"):
        gpu.graph_copy_sweep("cpu", [64], target_s=0)


def test_graph_sum_sweep_reads_its_working_set_once_and_checks_sizes_as_the_copy_does():
    from perflab.machine.caches import WorkingSetPoint

    pts = gpu.graph_sum_sweep("cpu", [2**16, 2**18], target_s=1e-5, reps=2)
    assert [p.nbytes for p in pts] == [2**16, 2**18]
    assert all(isinstance(p, WorkingSetPoint) and p.bytes_per_s > 0 for p in pts)
    call = gpu._sum_call(2**16, torch.device("cpu"))
    assert float(call()) == 2**16 / 4          # sums 16,384 ones: the whole buffer, once
    with pytest.raises(ValueError, match="multiples of 8"):
        gpu.graph_sum_sweep("cpu", [12])
    with pytest.raises(ValueError, match="reps"):
        gpu.graph_sum_sweep("cpu", [64], reps=0)


def test_burst_and_sustained_times_both_under_telemetry_on_cpu():
    r = gpu.burst_and_sustained("cpu", 64, dtype=torch.float32, burst_reps=3,
                                sustained_s=0.05, rest_s=0)
    assert r.flops == 2 * 64**3
    assert r.burst_rate > 0 and r.sustained_rate > 0
    assert r.sustained_window_s >= 0.05
    assert r.burst.duration_s > 0 and r.sustained.duration_s >= 0.05
    with pytest.raises(ValueError, match="sustained_s"):
        gpu.burst_and_sustained("cpu", 8, sustained_s=0)
    with pytest.raises(ValueError, match="rest_s"):
        gpu.burst_and_sustained("cpu", 8, rest_s=-1)
