"""perflab.kernels.precision: formats from torch.finfo, rounding, lost updates, training modes, fp8."""

import math

import pytest
import torch

from perflab.kernels import precision
from perflab.labs import lab09
from perflab.labs.exercises import ExerciseFailed


def test_format_table_reads_finfo():
    rows = {r.name: r for r in precision.format_table()}
    assert rows["float32"].mantissa_bits == 23 and rows["float32"].exponent_bits == 8
    assert rows["bfloat16"].exponent_bits == 8 and rows["bfloat16"].mantissa_bits == 7
    assert rows["float16"].max == 65504.0 and rows["float16"].exponent_bits == 5
    assert rows["float8_e4m3fn"].max == 448.0 and rows["float8_e4m3fn"].mantissa_bits == 3
    assert rows["tf32"].mantissa_bits == 10 and rows["tf32"].max == rows["float32"].max
    for r in rows.values():
        assert math.isclose(r.eps, 2.0 ** -r.mantissa_bits)
    with pytest.raises(ValueError, match="format"):
        precision.format_table(("float12",))


def test_round_trip_shows_overflow_underflow_and_rounding():
    assert precision.round_trip([70000.0], torch.float16) == [math.inf]
    assert precision.round_trip([70000.0], torch.bfloat16)[0] == pytest.approx(70000, rel=0.01)
    assert precision.round_trip([1e-8], torch.float16) == [0.0]
    assert precision.round_trip([1.001], torch.bfloat16) == [1.0]
    with pytest.raises(TypeError):
        precision.round_trip([1.0], torch.int32)


def test_lost_updates_in_bf16_not_fp32():
    w = torch.ones(100)
    u = torch.full((100,), 1e-3)
    assert precision.lost_update_fraction(w, u, torch.bfloat16) == 1.0
    assert precision.lost_update_fraction(w, u, torch.float32) == 0.0
    with pytest.raises(ValueError):
        precision.lost_update_fraction(w, torch.zeros(100), torch.float32)


def test_float32_matmul_restores_the_setting():
    before = torch.get_float32_matmul_precision()
    with precision.float32_matmul("high"):
        assert precision.tf32_flags()["float32_matmul_precision"] == "high"
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError):
        with precision.float32_matmul("fast"):
            pass


@pytest.mark.parametrize("mode", ["fp32", "bf16", "bf16_pure"])
def test_train_modes_reduce_the_loss(mode):
    r = precision.train(mode, width=16, depth=1, batch=32, steps=5, device="cpu", lr=1e-2)
    assert len(r.losses) == 5 and r.losses[-1] < r.losses[0]


def test_train_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        precision.train("int4", 8, 1, 8, 1, "cpu")


def test_fp8_matmul_error_is_small_but_larger_than_bf16():
    torch.manual_seed(0)
    a, b = torch.randn(64, 48), torch.randn(48, 32)
    err = precision.relative_error(precision.fp8_matmul(a, b), a @ b)
    assert 1e-3 < err < 0.1
    q, s = precision.quantize_fp8(a)
    assert q.dtype == torch.float8_e4m3fn and float(q.float().abs().max()) == 448.0
    with pytest.raises(ValueError):
        precision.fp8_matmul(a, a)


def test_precision_choice_check():
    seconds = {"fp32": 1.0, "bf16": 0.4, "bf16_pure": 0.35}
    losses = {"fp32": 1.0, "bf16": 1.01, "bf16_pure": 1.2}
    assert lab09.check_precision_choice("bf16", seconds, losses)
    with pytest.raises(ExerciseFailed, match="tolerance"):
        lab09.check_precision_choice("bf16_pure", seconds, losses)   # fastest, but off
    with pytest.raises(ExerciseFailed, match="faster"):
        lab09.check_precision_choice("fp32", seconds, losses)        # right loss, too slow
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab09.check_precision_choice(None, None, None)
