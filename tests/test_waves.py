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


def test_fit_wave_width_finds_the_staircase_of_a_batch_sweep():
    sms, m, n = 132, 256, 256                     # 128 x 256 tiles: 2 per product, 66 per wave
    bs = list(range(8, 201))
    stairs = [(b, 5e-6 + 8e-5 * math.ceil(b / 66)) for b in bs]
    fit = waves.fit_wave_width(stairs, m, n, sms)
    assert fit.items_per_wave == pytest.approx(66)
    assert fit.staircase_rms < 1e-9 < fit.linear_rms
    assert fit.seconds_per_wave == pytest.approx(8e-5)
    assert fit.waves(66) == 1 and fit.waves(67) == 2
    assert fit.predict(100) == pytest.approx(5e-6 + 1.6e-4)
    line = [(b, 5e-6 + 1.2e-6 * b) for b in bs]   # no quantization: the line wins
    lf = waves.fit_wave_width(line, m, n, sms)
    assert lf.linear_rms < 1e-9 < lf.staircase_rms
    with pytest.raises(ValueError, match="at least 4"):
        waves.fit_wave_width(stairs[:3], m, n, sms)
    with pytest.raises(ValueError, match="single wave"):
        waves.fit_wave_width([(b, 1e-5) for b in range(1, 6)], m, n, sms)


def test_batch_wave_sweep_runs_on_cpu_and_checks_its_arguments():
    pts = waves.batch_wave_sweep("cpu", 16, 16, 32, [1, 2, 3], dtype=torch.float32, reps=2)
    assert [b for b, _ in pts] == [1, 2, 3] and all(t > 0 for _, t in pts)
    with pytest.raises(ValueError, match="batches"):
        waves.batch_wave_sweep("cpu", 16, 16, 32, [0])
    with pytest.raises(ValueError, match="k must"):
        waves.batch_wave_sweep("cpu", 16, 16, 0, [1])


def test_wave_model_dips_just_past_a_wave():
    # 132 SMs, 128 x 256 tiles: n = 2048 gives 16 x 8 = 128 tiles (one wave, 97 % used);
    # n = 2176 gives 17 x 9 = 153 tiles (two waves, 58 % used)
    full, past = waves.wave_model([2048, 2176], plateau=100.0, sms=132)
    assert full == pytest.approx(100 * 128 / 132) and past == pytest.approx(100 * 153 / 264)
    with pytest.raises(ValueError):
        waves.wave_model([0], 1.0, 132)
