"""perflab.kernels.precision: formats from torch.finfo, rounding, lost updates, training modes, fp8."""

import math

import pytest
import torch

from perflab.core.rounds import spread
from perflab.kernels import amp, precision
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


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "bf16_pure"])
def test_page_train_step_learns_in_every_mode(mode):
    """Chapter 9's step (exported to perflab.kernels.amp) on the chapter's teacher task."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = 2 * torch.tanh(x @ torch.randn(16, 16) / 4) @ torch.randn(16, 1) / 4
    model = precision.make_mlp(16, 1, "cpu")
    step = amp.make_train_step(model, x, y, mode, lr=1e-2)
    losses = [float(step()) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]
    assert (next(model.parameters()).dtype == torch.bfloat16) == (mode == "bf16_pure")


def test_page_train_step_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        amp.make_train_step(precision.make_mlp(8, 1, "cpu"), torch.ones(2, 8),
                            torch.ones(2, 1), "int4")


def test_bf16_pure_loses_lr_sized_updates_that_master_weights_keep():
    """The chapter's prediction: Adam moves weights by about lr; pure bf16 rounds most away."""
    w = precision.make_mlp(128, 1, "cpu")[0].weight.detach().flatten()
    lost = precision.lost_update_fraction(w, torch.full_like(w, 1e-4), torch.bfloat16)
    assert 0.2 < lost < 0.9
    assert precision.lost_update_fraction(w, torch.full_like(w, 1e-4), torch.float32) == 0


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
    seconds = {m: spread([t, 1.1 * t, 0.9 * t])           # three interleaved rounds
               for m, t in {"fp32": 1.0, "bf16": 0.4, "bf16_pure": 0.35}.items()}
    losses = {"fp32": 1.0, "bf16": 1.01, "bf16_pure": 1.2}
    assert lab09.check_precision_choice("bf16", seconds, losses)
    with pytest.raises(ExerciseFailed, match="tolerance"):
        lab09.check_precision_choice("bf16_pure", seconds, losses)   # fastest, but off
    with pytest.raises(ExerciseFailed, match="faster"):
        lab09.check_precision_choice("fp32", seconds, losses)        # right loss, too slow
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab09.check_precision_choice(None, None, None)
