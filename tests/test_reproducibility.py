"""perflab.profiling.reproducibility: seeds, deterministic mode, noise statistics."""

import random

import numpy as np
import pytest
import torch

from perflab.profiling.reproducibility import (coefficient_of_variation, cv_interval,
                                               deterministic, repeated_medians, seed_everything)


def test_seed_everything_repeats_all_three_generators():
    seed_everything(3)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(3)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            seed_everything(bad)


def test_deterministic_sets_and_restores_the_flags():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = True
    with deterministic(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled() == before[0]
    assert torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before[1]
    with pytest.raises(TypeError, match="enabled"):
        with deterministic("yes"):
            pass


def test_coefficient_of_variation():
    assert coefficient_of_variation([2.0, 2.0, 2.0]) == 0
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(np.std([1, 3], ddof=1) / 2)
    for bad in ([1.0], [1.0, float("nan")], [-1.0, -2.0]):
        with pytest.raises(ValueError, match="values"):
            coefficient_of_variation(bad)


def test_repeated_medians_returns_one_positive_median_per_repeat():
    x = torch.randn(1000)
    out = repeated_medians(lambda: x * 2, "cpu", repeats=3, min_run_time_s=0.01)
    assert len(out) == 3 and all(m > 0 for m in out)
    with pytest.raises(ValueError, match="repeats"):
        repeated_medians(lambda: None, "cpu", repeats=1)


def test_cv_interval_is_the_chi_square_interval_around_the_cv():
    values = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.98]
    low, cv, high = cv_interval(values)
    assert cv == coefficient_of_variation(values)
    # ten values, 90 %: the chi-square quantiles of 9 degrees of freedom are 3.325 and 16.919
    assert low / cv == pytest.approx((9 / 16.919) ** 0.5, rel=1e-3)
    assert high / cv == pytest.approx((9 / 3.325) ** 0.5, rel=1e-3)
    # more values, a narrower interval; a higher level, a wider one
    lo_many, cv_many, hi_many = cv_interval(values * 4)
    assert hi_many / cv_many < high / cv and lo_many / cv_many > low / cv
    assert cv_interval(values, level=0.99)[2] > high
    with pytest.raises(ValueError, match="level"):
        cv_interval(values, level=1.0)
    with pytest.raises(ValueError, match="at least 2"):
        cv_interval([1.0])
