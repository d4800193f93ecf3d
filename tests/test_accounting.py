"""perflab.speed.accounting on CPU: the union of device intervals, syncs counted per call."""

import pytest
import torch

from perflab.speed import accounting


def test_union_counts_overlaps_once():
    assert accounting.union_seconds([]) == 0.0
    assert accounting.union_seconds([(0, 2), (1, 3)]) == 3          # a copy under a kernel
    assert accounting.union_seconds([(5, 6), (0, 1), (0.5, 0.7)]) == 2
    assert accounting.union_seconds([(0, 4), (1, 2)]) == 4           # one inside another
    with pytest.raises(ValueError, match="ends before"):
        accounting.union_seconds([(2, 1)])


def test_syncs_per_call_on_a_cpu_counts_the_python_calls():
    x = torch.randn(8)

    def step():
        x.sum().item()               # one sync a call
        if x.sum() > 0:              # and a second
            pass

    assert accounting.syncs_per_call(step, "cpu", calls=3) == 2
    assert accounting.syncs_per_call(lambda: x * 2, "cpu") == 0
    with pytest.raises(ValueError, match="calls"):
        accounting.syncs_per_call(step, "cpu", calls=0)


def test_device_busy_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        accounting.device_busy(lambda: None)
    with pytest.raises(ValueError, match="calls"):
        accounting.device_busy(lambda: None, calls=0)
