"""perflab.machine.waves: tiles, waves and the wave model (the sweeps run on a GPU only)."""

import math

import pytest
import torch

from perflab.machine import waves


def test_tile_and_wave_counts():
    assert waves.tile_count(2048, 1024) == 16 * 8
    assert waves.tile_count(2048, 1025) == 16 * 9          # a partial tile costs a whole tile
    assert waves.wave_count(132, 132) == 1
    assert waves.wave_count(133, 132) == 2                 # one tile more: a whole extra wave
    assert waves.wave_count(264, 132, tiles_per_sm=2) == 1
    with pytest.raises(ValueError, match="tile_n"):
        waves.tile_count(8, 8, tile_n=0)
    with pytest.raises(ValueError, match="sms"):
        waves.wave_count(10, 0)


def test_fit_waves_tells_a_staircase_from_a_line():
    m, sms = 2048, 132
    ns = list(range(1024, 8193, 64))
    stairs = [(n, 1e-5 + 4e-5 * waves.wave_count(waves.tile_count(m, n, 128, 256), sms)) for n in ns]
    fit = waves.fit_waves(stairs, m, sms)
    assert fit.tile == (128, 256)
    assert fit.staircase_rms < 1e-9 < fit.linear_rms
    assert fit.seconds_per_wave == pytest.approx(4e-5)
    line = [(n, 1e-5 + 3e-8 * n) for n in ns]
    assert waves.fit_waves(line, m, sms).linear_rms < waves.fit_waves(line, m, sms).staircase_rms
    with pytest.raises(ValueError, match="at least 4"):
        waves.fit_waves(stairs[:3], m, sms)


def test_kernel_tile_reads_the_tile_from_cublas_names():
    assert waves.kernel_tile("nvjet_sm90_tst_128x96_64x7_2x1_v_bz_NNT") == (128, 96)
    assert waves.kernel_tile("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_splitK_TNT") == (64, 32)
    assert waves.kernel_tile("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warp") \
        == (128, 256)
    assert waves.kernel_tile("cublasLt::splitKreduce_kernel") is None
    assert waves.kernel_tile("void at::native::vectorized_elementwise_kernel<4>") is None


def _kernel(name, grid, us):
    from perflab.core.profiler import KernelRecord

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
    groups = waves.wave_groups(runs, batches, 256, 256, 132)
    main = groups[0]
    assert main.tile == (128, 128) and main.ctas == 132
    assert main.rounds[main.batches.index(33)] == 1 and main.rounds[main.batches.index(132)] == 4
    assert main.round_s.median == pytest.approx(72e-6, rel=0.01)
    assert main.round_s.n == 3                          # one fit per pass over the batches
    assert main.staircase_rms < 0.01 < main.linear_rms
    assert main.predict(2) == pytest.approx(3e-6 + 144e-6, rel=0.01)
    # the straight line's slope: about a round's time per 33 products
    assert main.product_s.n == 3
    assert main.product_s.median == pytest.approx(72e-6 / 33, rel=0.15)
    alt = next(g for g in groups if g.tile == (128, 96))
    assert alt.round_s.median == pytest.approx(45e-6, rel=0.01)
    split = next(g for g in groups if g.batches == (1,))
    assert split.round_s is None and split.predict(1) is None   # one batch count: nothing to fit
    assert split.product_s is None
    assert split.seconds[0].median == pytest.approx(7.8e-6)     # its two kernels together


def test_wave_groups_check_their_input():
    runs, batches = _h200_bmm(repeats=1)
    with pytest.raises(ValueError, match="one entry per batch"):
        waves.wave_groups(runs, batches[:-1], 256, 256, 132)
    runs[0][5] = []
    with pytest.raises(ValueError, match="ran no kernel"):
        waves.wave_groups(runs, batches, 256, 256, 132)
    with pytest.raises(ValueError, match="sms"):
        waves.wave_groups(runs, batches, 256, 256, 0)


def test_wave_model_dips_just_past_a_wave():
    # 132 SMs, 128 x 256 tiles: n = 2048 gives 16 x 8 = 128 tiles (one wave, 97 % used);
    # n = 2176 gives 17 x 9 = 153 tiles (two waves, 58 % used)
    full, past = waves.wave_model([2048, 2176], plateau=100.0, sms=132)
    assert full == pytest.approx(100 * 128 / 132) and past == pytest.approx(100 * 153 / 264)
    with pytest.raises(ValueError):
        waves.wave_model([0], 1.0, 132)


def test_a_persistent_kernel_that_splits_the_work_evenly_is_a_line_with_a_time_per_product():
    """The H100's run: 124 blocks, times linear in b (stream-K): the line fits, not the staircase,
    and its slope is the time per product."""
    batches = list(range(20, 199))
    main = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT"
    runs = [[[_kernel(main, (2, 62, 1), 3 + 2.8 * b * (1 + 0.002 * r))] for b in batches]
            for r in range(3)]
    g = waves.wave_groups(runs, batches, 256, 256, 132)[0]
    assert g.ctas == 124
    assert g.linear_rms < 1e-6 < g.staircase_rms
    assert g.product_s.median == pytest.approx(2.8e-6, rel=0.01)
