"""perflab.core.paired: the ABBA order check and paired blocks (a fake clock, no wall-clock asserts)."""

import pytest
import torch

from perflab.core import paired, timing


def test_order_effect_separates_drift_from_the_timer():
    # A first then last: A/B flips from below to above 1 -> whoever ran later was slower
    assert paired.order_effect((1.00, 1.04), (1.05, 1.01)) == "later slower"
    assert paired.order_effect((1.05, 1.00), (1.00, 1.05)) == "earlier slower"
    # A/B on the same side both times -> the timer, not the order
    assert paired.order_effect((1.05, 1.00), (1.06, 1.00)) == "a slower"
    assert paired.order_effect((0.95, 1.00), (0.96, 1.00)) == "b slower"
    assert paired.order_effect((1.001, 1.0), (0.999, 1.0)) == "same"
    assert paired.order_effect((1.05, 1.0), (1.0, 1.0)) == "same"
    with pytest.raises(ValueError, match="first"):
        paired.order_effect((0.0, 1.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="tolerance"):
        paired.order_effect((1.0, 1.0), (1.0, 1.0), tolerance=-1)


def test_paired_ratio_is_the_median_of_back_to_back_pairs(monkeypatch):
    """With a fake clock (base costs 3 ticks a call, candidate 1, one pair disturbed by a burst
    of 100 ticks), the ratio is 3: the burst moves one pair, not the median."""
    clock = {"t": 0.0, "calls": 0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])

    def base():
        clock["calls"] += 1
        clock["t"] += 3e-3 + (0.1 if clock["calls"] == 12 else 0.0)

    def candidate():
        clock["t"] += 1e-3

    ratio, pairs = paired.paired_ratio(base, candidate, "cpu", pairs=5, block_s=0.01)
    assert ratio == pytest.approx(3.0) and len(pairs) == 5
    assert max(pairs) > 3.5             # the disturbed pair, outvoted
    with pytest.raises(ValueError, match="pairs"):
        paired.paired_ratio(base, candidate, pairs=0)
    with pytest.raises(ValueError, match="block_s"):
        paired.paired_ratio(base, candidate, block_s=0)


def test_paired_ratio_times_with_the_threads_asked_and_restores_them():
    before = torch.get_num_threads()
    seen = []
    paired.paired_ratio(lambda: seen.append(torch.get_num_threads()), lambda: None, "cpu",
                        pairs=1, block_s=1e-9, cpu_threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="cpu_threads"):
        paired.paired_ratio(lambda: None, lambda: None, cpu_threads=0)
