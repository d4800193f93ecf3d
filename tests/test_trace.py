"""perflab.profiling.trace: chapter 4's evidence from a trace (items, summaries, regimes); the
profiler reader itself is tests/test_profiler.py, count_cost and op_cost tests/test_costs.py."""

import json

import pytest
import torch

from perflab.core.profiler import load_trace
from perflab.profiling import trace
from perflab.profiling.trace import (REGIMES, regime, short_name, step_windows,
                                     summarize_trace, trace_items)
from fake_trace import kernel_event as _kernel, op_event as _op  # noqa: E402




def _gpu_trace():
    """A small trace in the format torch.profiler exports on a GPU: two steps, each one GEMM
    (100 us) and one elementwise kernel (20 us, grid of one block), 30 us apart."""
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    for step, t in enumerate((0.0, 1000.0)):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 2}", "ts": t,
                       "dur": 400.0, "pid": 1, "tid": 1, "args": {}})
        events.append(_op("aten::mm", t + 10, 20, 10 * step + 1, [[1024, 1024], [1024, 1024]], ["float", "float"]))
        events.append(_op("aten::mul", t + 40, 10, 10 * step + 2, [[1024, 1024], []], ["float", "Scalar"]))
        events.append(_kernel("sm90_xmma_gemm_f32f32_tn", t + 50, 100, 10 * step + 1))
        events.append(_kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", t + 180, 20,
                              10 * step + 2, bps=1 / 132))
    return {"traceEvents": events}


def test_trace_items_link_kernels_to_their_operators():
    items = trace_items(load_trace(_gpu_trace()))
    assert [i.op for i in items] == ["aten::mm", "aten::mul"] * 2
    assert items[0].cost.flops == 2 * 1024**3
    assert items[1].blocks_per_sm == pytest.approx(1 / 132)


def test_summarize_trace_busy_fraction_gaps_and_top_kernels(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_gpu_trace()))
    s = summarize_trace(path)
    assert s.on_gpu and s.steps == 2 and s.items == 4
    assert s.window_us == pytest.approx(1400.0)         # first step start to last step end
    assert s.busy_us == pytest.approx(240.0)
    assert s.idle_fraction == pytest.approx(1 - 240 / 1400)
    assert sorted(s.gaps_us)[:2] == pytest.approx([30.0, 30.0])
    gemm = s.top[0]
    assert gemm.calls == 2 and gemm.total_us == 200
    assert gemm.flops_per_s == pytest.approx(2 * 2 * 1024**3 / 200e-6)
    mul = s.top[1]
    assert mul.bytes_per_s == pytest.approx(2 * 2 * 1024**2 * 4 / 40e-6)
    assert s.sm_weighted_us == pytest.approx(200 + 40 / 132)
    assert s.flops == pytest.approx(2 * (2 * 1024**3 + 1024**2))


def test_summarize_trace_counts_a_kernel_still_running_when_a_step_starts():
    trace = _gpu_trace()
    trace["traceEvents"].append(_kernel("leftover", -50.0, 100.0, 99))   # from an earlier step
    s = summarize_trace(trace)
    assert s.busy_us == pytest.approx(240.0 + 50.0)
    assert s.items == 4                                   # not one of the window's own kernels


def test_summarize_trace_of_a_real_cpu_profile(tmp_path):
    from torch.profiler import ProfilerActivity, profile, schedule

    a, b = torch.randn(128, 128), torch.randn(128, 128)
    path = tmp_path / "cpu.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(3):
            torch.relu(a @ b)
            prof.step()
    s = summarize_trace(path)
    assert not s.on_gpu and s.steps == 2
    assert 0 < s.busy_fraction <= 1
    names = {k.name for k in s.top}
    assert "aten::matmul" in names or "aten::mm" in names
    top = next(k for k in s.top if k.name in ("aten::matmul", "aten::mm"))
    assert top.flops == 2 * 2 * 128**3
    assert len(step_windows(load_trace(path))) == 2


def test_trace_readers_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="traceEvents"):
        load_trace({"events": []})
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="events"):
        trace_items([1, 2])
    with pytest.raises(ValueError, match="no kernels"):
        summarize_trace({"traceEvents": []})
    with pytest.raises(ValueError, match="top"):
        summarize_trace(_gpu_trace(), top=0)


def test_regime_rule():
    assert regime(0.8, 0.1) == "compute-bound"
    assert regime(0.01, 0.7) == "bandwidth-bound"
    assert regime(0.02, 0.05) == "overhead-bound"
    assert regime(0.8, 0.1, busy_fraction=0.2) == "overhead-bound"
    # busy but near neither roof: the kernels ran, too small or latency-bound
    assert regime(0.02, 0.05, busy_fraction=0.9) == "latency-bound"
    assert regime(0.24, 0.2, busy_fraction=0.5) == "latency-bound"
    # idle most of the step: overhead, even if the few kernels were small
    assert regime(0.02, 0.05, busy_fraction=0.49) == "overhead-bound"
    # busy and near a roof: the roof names it
    assert regime(0.8, 0.1, busy_fraction=0.9) == "compute-bound"
    assert regime(0.1, 0.3, busy_fraction=0.9) == "bandwidth-bound"
    for verdict in (regime(0.02, 0.05), regime(0.02, 0.05, 0.9), regime(0.8, 0.1)):
        assert verdict in REGIMES
    with pytest.raises(ValueError, match="threshold"):
        regime(0.5, 0.5, threshold=0)
    with pytest.raises(ValueError, match="busy_fraction"):
        regime(0.5, 0.5, busy_fraction=1.5)
    with pytest.raises(ValueError, match="flops_fraction"):
        regime(-0.1, 0.5)


def test_the_median_over_maximum_clock_scaling_is_gone():
    """It took the wrong clock for a Hopper GPU's tensor cores (1.83 of 1.98 GHz): an efficiency
    per clock is a rate over the clock model's peak at that clock (Ceilings.peak), nothing else."""
    assert not hasattr(trace, "clock_normalized")


def test_short_name():
    assert short_name("void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>") == \
        "at::native::vectorized_elementwise_kernel"
    assert len(short_name("x" * 100, 20)) == 20
    with pytest.raises(ValueError, match="width"):
        short_name("abc", 3)


def test_operator_rows_keep_the_host_rows_as_numbers():
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    from perflab.profiling.trace import operator_rows

    layer = torch.nn.Linear(64, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            layer(torch.randn(8, 64)).relu().sum().backward()
    rows = operator_rows(prof.key_averages(), limit=5)
    assert len(rows) == 5 and rows[0]["name"] == "forward" and rows[0]["calls"] == 1
    assert all(a["cpu_total_s"] >= b["cpu_total_s"] for a, b in zip(rows, rows[1:]))
    assert 0 < rows[0]["self_cpu_s"] <= rows[0]["cpu_total_s"] < 10    # seconds, not µs
    mem = operator_rows(prof.key_averages(), sort_by="self_cpu_memory_B", limit=50)
    assert mem and all(r["self_cpu_memory_B"] != 0 for r in mem)
    assert any(r["name"] == "aten::addmm" and r["self_cpu_memory_B"] == 8 * 64 * 4 for r in mem)
    # a kernel's row (device time only) is left out: its time is its operator's device time
    kernel = NS(key="gemm_kernel", count=2, device_type=DeviceType.CUDA, self_cpu_time_total=0,
                cpu_time_total=0, self_device_time_total=50.0, device_time_total=50.0)
    op = NS(key="aten::mm", count=2, device_type=DeviceType.CPU, self_cpu_time_total=30.0,
            cpu_time_total=40.0, self_device_time_total=50.0, device_time_total=50.0)
    rows = operator_rows([kernel, op], sort_by="self_device_s")
    assert [r["name"] for r in rows] == ["aten::mm"] and rows[0]["device_total_s"] == pytest.approx(5e-5)
    with pytest.raises(ValueError, match="sort_by"):
        operator_rows([], sort_by="self_cpu_time_total")
    with pytest.raises(ValueError, match="limit"):
        operator_rows([], limit=0)


def test_host_and_device_seconds_counts_the_gpu_time_once():
    """An operator row's self device time is the time of the kernel it launched, and the kernel
    has a row of its own: the device time must be the kernels' rows alone (and no device-side
    record_function range), the host time every operator's self CPU time (review G3, 6 December:
    not a record_function range's, whose self time around backward() is the main thread waiting
    for the autograd thread, 1.71 ms of a 2.57 ms step in run 0607)."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from perflab.profiling.trace import host_and_device_seconds

    op = NS(key="aten::mm", device_type=DeviceType.CPU, self_cpu_time_total=30.0,
            self_device_time_total=50.0)
    launch = NS(key="cudaLaunchKernel", device_type=DeviceType.CPU, self_cpu_time_total=5.0,
                self_device_time_total=0.0)
    kernel = NS(key="gemm_kernel", device_type=DeviceType.CUDA, self_cpu_time_total=0,
                self_device_time_total=50.0)
    fill = NS(key="Memset (Device)", device_type=DeviceType.CUDA, self_cpu_time_total=0,
              self_device_time_total=2.0)
    annotation = NS(key="forward", device_type=DeviceType.CUDA, self_cpu_time_total=0,
                    self_device_time_total=60.0, is_user_annotation=True)
    buffers = NS(key="Activity Buffer Request", device_type=DeviceType.CPU,
                 self_cpu_time_total=3000.0, self_device_time_total=0.0)
    step = NS(key="ProfilerStep#2", device_type=DeviceType.CPU, self_cpu_time_total=900.0,
              self_device_time_total=0.0)
    waiting = NS(key="backward", device_type=DeviceType.CPU, self_cpu_time_total=1710.0,
                 self_device_time_total=0.0, is_user_annotation=True)
    host_s, device_s = host_and_device_seconds(
        [op, launch, kernel, fill, annotation, buffers, step, waiting])
    assert host_s == pytest.approx(35e-6)      # the profiler's own rows left out
    assert device_s == pytest.approx(52e-6)
    assert host_and_device_seconds([]) == (0, 0)
    with pytest.raises(ValueError, match="events"):
        host_and_device_seconds(3)


def test_host_and_device_seconds_of_a_real_cpu_profile_has_no_device_time():
    from torch.profiler import ProfilerActivity, profile

    from perflab.profiling.trace import host_and_device_seconds

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(64, 64) @ torch.randn(64, 64)
    host_s, device_s = host_and_device_seconds(prof.key_averages())
    assert 0 < host_s < 10 and device_s == 0


def test_kernel_family_names_the_family_and_its_library_briefly():
    """Reader review R5: full kernel names in prose made five pages wider than a phone."""
    from perflab.profiling.trace import kernel_family
    nvjet = kernel_family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert nvjet == "nvjet_sm90_tst… (cuBLAS)"
    # the data types a reader compares survive the cut
    assert kernel_family("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT") != nvjet
    assert kernel_family("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, "
                         "float, false, true, (cudnnKernelDataType_t)2>(...)") == \
        "nchwToNhwcKernel (cuDNN)"
    assert kernel_family("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc"
                         ).endswith("(cuDNN)")
    assert kernel_family("void at::native::unrolled_elementwise_kernel<at::native::"
                         "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>") == \
        "unrolled_elementwise_kernel (ATen)"
    assert kernel_family("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>") == \
        "cutlass::Kernel2 (cuBLAS)"
    assert kernel_family("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul_0 (Triton)"
    # a Triton kernel whose fused ops' names hold another library's mark is still Triton's
    assert kernel_family("triton_poi_fused__to_copy_convert_element_type_0").endswith("(Triton)")
    assert kernel_family("triton_red_fused_addmm_gemm_0").endswith("(Triton)")
    assert kernel_family("my_kernel") == "my_kernel"
    for long_name in ("x" * 100, "a_" * 60):
        assert len(kernel_family(long_name)) <= 28
    for bad in ("", "  ", None, 3):
        with pytest.raises(ValueError, match="name"):
            kernel_family(bad)
    with pytest.raises(ValueError):
        kernel_family("abc", width=4)
