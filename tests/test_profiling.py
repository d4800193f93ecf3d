import pytest
import torch

from perflab.profiling import kernels_per_call


def test_eager_chain_counts_one_aten_call_per_operator():
    x = torch.randn(100)
    assert kernels_per_call(lambda t: t.cos().cos().sin(), x) == 3


def test_compiled_chain_dispatches_no_aten_compute_call_on_cpu():
    x = torch.randn(100)
    torch.compiler.reset()
    fused = torch.compile(lambda t: t.cos().cos(), fullgraph=True)
    fused(x)
    assert kernels_per_call(fused, x) == 0


def test_calls_must_be_positive():
    with pytest.raises(ValueError, match="calls"):
        kernels_per_call(lambda: None, calls=0)
