import math

import pytest
import torch

from perflab.machine import gpu
from perflab.core.device import has_gpu

cpu_only = pytest.mark.skipif(has_gpu(), reason="checks the behaviour on a machine without a GPU")


def test_tile_and_wave_counts():
    assert gpu.tile_count(2048, 1024) == 16 * 8
    assert gpu.tile_count(2048, 1025) == 16 * 9          # a partial tile costs a whole tile
    assert gpu.wave_count(132, 132) == 1
    assert gpu.wave_count(133, 132) == 2                 # one tile more: a whole extra wave
    assert gpu.wave_count(264, 132, tiles_per_sm=2) == 1
    with pytest.raises(ValueError, match="tile_n"):
        gpu.tile_count(8, 8, tile_n=0)
    with pytest.raises(ValueError, match="sms"):
        gpu.wave_count(10, 0)


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


@cpu_only
def test_gpu_only_functions_say_so_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gpu.properties()
    from perflab.core import nvml

    assert nvml.readings() is None


@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU")
def test_properties_on_a_gpu():
    p = gpu.properties(0)
    assert p["sm_count"] > 0 and p["warp_size"] == 32
    assert p["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory


def test_kernel_tile_reads_the_tile_from_cublas_names():
    assert gpu.kernel_tile("nvjet_sm90_tst_128x96_64x7_2x1_v_bz_NNT") == (128, 96)
    assert gpu.kernel_tile("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_splitK_TNT") == (64, 32)
    assert gpu.kernel_tile("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warp") \
        == (128, 256)
    assert gpu.kernel_tile("cublasLt::splitKreduce_kernel") is None
    assert gpu.kernel_tile("void at::native::vectorized_elementwise_kernel<4>") is None


def _kernel(name, grid, us):
    from perflab.profiling.trace import KernelRecord

    return KernelRecord(name, grid, (384, 1, 1), None, us, 1.0)


def _h200_bmm(repeats=3):
    """What the profiler showed for torch.bmm([b, 256, 8192] @ [b, 8192, 256]) on the H200: a
    split-K kernel plus its reduction at b = 1, 128 x 96 tiles where 128 x 128 tiles would leave
    a round almost empty, 128 x 128 tiles elsewhere, all persistent on 132 blocks; one round of
    128 x 128 tiles takes 72 us."""
    batches = list(range(1, 199))
    main = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT"
    alt = "nvjet_sm90_tst_128x96_64x7_2x1_v_bz_NNT"
    runs = []
    for r in range(repeats):
        calls = []
        for b in batches:
            if b == 1:
                calls.append([_kernel("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_splitK_TNT", (2, 64, 1), 6.1),
                              _kernel("cublasLt::splitKreduce_kernel", (8, 16, 1), 1.7)])
            elif b % 33 in range(1, 5) and b > 33:
                calls.append([_kernel(alt, (2, 66, 1), 2 + 45 * math.ceil(b * 6 / 132) * (1 + 0.002 * r))])
            else:
                calls.append([_kernel(main, (2, 66, 1), 3 + 72 * math.ceil(b * 4 / 132) * (1 + 0.002 * r))])
        runs.append(calls)
    return runs, batches


def test_wave_groups_fit_each_kernels_rounds_with_the_tile_in_its_name():
    runs, batches = _h200_bmm()
    groups = gpu.wave_groups(runs, batches, 256, 256, 132)
    main = groups[0]
    assert main.tile == (128, 128) and main.ctas == 132
    assert main.rounds[main.batches.index(33)] == 1 and main.rounds[main.batches.index(132)] == 4
    assert main.round_s.median == pytest.approx(72e-6, rel=0.01)
    assert main.round_s.n == 3                          # one fit per pass over the batches
    assert main.staircase_rms < 0.01 < main.linear_rms
    assert main.predict(2) == pytest.approx(3e-6 + 144e-6, rel=0.01)
    alt = next(g for g in groups if g.tile == (128, 96))
    assert alt.round_s.median == pytest.approx(45e-6, rel=0.01)
    split = next(g for g in groups if g.batches == (1,))
    assert split.round_s is None and split.predict(1) is None   # one batch count: nothing to fit
    assert split.seconds[0].median == pytest.approx(7.8e-6)     # its two kernels together


def test_wave_groups_check_their_input():
    runs, batches = _h200_bmm(repeats=1)
    with pytest.raises(ValueError, match="one entry per batch"):
        gpu.wave_groups(runs, batches[:-1], 256, 256, 132)
    runs[0][5] = []
    with pytest.raises(ValueError, match="ran no kernel"):
        gpu.wave_groups(runs, batches, 256, 256, 132)
    with pytest.raises(ValueError, match="sms"):
        gpu.wave_groups(runs, batches, 256, 256, 0)


def test_replay_sweep_times_every_size_in_interleaved_rounds_on_cpu():
    from perflab.core.rounds import Spread
    from perflab.machine import replay

    times = replay.replay_sweep([2**16, 2**18], "cpu", rounds=3, target_s=1e-6)
    assert list(times) == [8192, 2**16, 2**18]           # the tiny working set first
    assert all(isinstance(t, Spread) and t.n == 3 and t.median > 0 for t in times.values())
    run = replay.replayed(replay.copy_probe(2**16, "cpu"), 4, "cpu")
    assert len(run()) == 4                              # on a CPU: a loop of the calls
    probe = replay.copy_probe(2**16, "cpu")
    assert probe().numel() == 2**16 // 8 and float(probe()[0]) == 2.0   # half the set, x 2


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
