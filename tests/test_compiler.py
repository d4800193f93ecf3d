"""perflab.kernels.compiler: graph breaks, compilation counts, AOT graphs, the recompile limit."""

import pytest
import torch
import torch.nn.functional as F

from perflab.kernels import compiler
from perflab.labs import lab09
from perflab.labs.exercises import ExerciseFailed


def branchy(x):
    if x.sum() > 0:
        return x.cos()
    return x.sin()


def test_graph_breaks_found_and_absent():
    found = compiler.graph_breaks(branchy, torch.randn(8))
    assert found.breaks >= 1 and found.graphs >= 2 and found.reasons
    assert compiler.graph_breaks(lambda x: x.cos().cos(), torch.randn(8)).breaks == 0
    with pytest.raises(TypeError):
        compiler.graph_breaks(3)


def test_counting_backend_counts_recompiles_and_the_limit():
    torch.compiler.reset()
    counter = compiler.CountingBackend()
    f = torch.compile(lambda t, k: t * k, backend=counter)
    with compiler.recompile_limit(3) as limit:
        assert limit == 3
        for k in range(6):
            f(torch.ones(4), k)
    assert counter.count <= 3 + 1
    assert getattr(torch._dynamo.config, compiler.recompile_limit_name()) != 3 or limit == 3
    with pytest.raises(ValueError):
        with compiler.recompile_limit(0):
            pass


def test_dynamo_graph_is_python():
    code = compiler.dynamo_graphs(lambda t: t.cos().cos(), torch.randn(4))[0]
    assert "def forward" in code and code.count("cos") >= 2


def test_min_cut_saves_less_than_the_default_partition():
    x = torch.randn(8, 4, requires_grad=True)
    w1, w3 = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    w2 = torch.randn(16, 4, requires_grad=True)

    def swiglu(x, w1, w3, w2):
        return (F.silu(x @ w1) * (x @ w3)) @ w2

    default = compiler.aot_graphs(swiglu, x, w1, w3, w2, partition="default")
    min_cut = compiler.aot_graphs(swiglu, x, w1, w3, w2, partition="min_cut")
    assert min_cut.saved_bytes < default.saved_bytes
    assert "def forward" in min_cut.backward
    with pytest.raises(ValueError):
        compiler.aot_graphs(swiglu, x, w1, w3, w2, partition="greedy")


def test_graph_break_check_rejects_unfixed_and_accepts_fixed():
    def fixed(x):
        return torch.where(x.sum() > 0, x.cos(), x.sin())

    x = torch.randn(8)
    assert lab09.check_graph_break_fixed(branchy, fixed, x)
    with pytest.raises(ExerciseFailed, match="still has"):
        lab09.check_graph_break_fixed(branchy, branchy, x)
    with pytest.raises(ExerciseFailed, match="different result"):
        lab09.check_graph_break_fixed(branchy, lambda t: t.cos(), -x.abs() - 1)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab09.check_graph_break_fixed(branchy, None, x)
