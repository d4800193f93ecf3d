import math

import pytest
import torch

from perflab.internals import operators


def test_operator_counts_are_consistent():
    c = operators.operator_counts()
    assert c["total"] == sum(c["namespaces"].values())
    assert c["aten_overloads"] == c["namespaces"]["aten"]
    # the library is large, overloads outnumber operators, and the variants are a subset
    assert c["aten_overloads"] > c["aten_operators"] > 1000
    assert 0 < c["aten_inplace"] < c["aten_operators"]
    assert 0 < c["aten_out"] < c["aten_overloads"]
    assert 0 < c["aten_composite_implicit"] < c["aten_overloads"]
    assert 0 < c["aten_with_cpu_kernel"] < c["aten_overloads"]


def test_has_kernel_knows_composites_from_kernels():
    assert operators.has_kernel("aten::addmm", "CPU")
    assert operators.has_kernel("aten::linear", "CompositeImplicitAutograd")
    assert not operators.has_kernel("aten::linear", "CPU")
    with pytest.raises(ValueError, match="overload"):
        operators.has_kernel("aten::add", "CPU")
    with pytest.raises(ValueError, match="qualified"):
        operators.has_kernel("add", "CPU")


def test_fit_recovers_an_exact_line_and_its_crossover():
    t0, c = 5e-6, 2e-12
    n = [2**k for k in range(0, 27, 2)]
    fit = operators.fit_call_cost(n, [t0 + c * k for k in n])
    assert math.isclose(fit.fixed_s, t0, rel_tol=1e-9)
    assert math.isclose(fit.per_element_s, c, rel_tol=1e-9)
    assert math.isclose(fit.crossover_numel, t0 / c, rel_tol=1e-9)
    assert math.isclose(fit.seconds(1000), t0 + c * 1000, rel_tol=1e-12)


def test_fit_weighs_small_sizes_as_much_as_large_ones():
    # 10 % noise on one large point must not move the fixed cost much (relative-error fit)
    t0, c = 5e-6, 2e-12
    n = [2**k for k in range(0, 27, 2)]
    t = [t0 + c * k for k in n]
    t[-1] *= 1.10
    fit = operators.fit_call_cost(n, t)
    assert abs(fit.fixed_s / t0 - 1) < 0.02


def test_fit_rejects_bad_input_and_flat_sweeps():
    with pytest.raises(ValueError, match="same length"):
        operators.fit_call_cost([1, 2], [1e-6])
    with pytest.raises(ValueError, match="two distinct"):
        operators.fit_call_cost([4, 4], [1e-6, 1e-6])
    with pytest.raises(ValueError, match="seconds must"):
        operators.fit_call_cost([1, 2], [1e-6, 0])
    with pytest.raises(ValueError, match="numels must"):
        operators.fit_call_cost([0, 2], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="per-element"):
        operators.fit_call_cost([1, 10, 100], [3e-6, 2e-6, 1e-6])


def test_call_cost_sweep_times_every_size_in_interleaved_rounds():
    from perflab.core.rounds import Spread
    from perflab.internals.callcost import call_cost_sweep

    pts = call_cost_sweep("cpu", [1, 1024], rounds=2, element_budget=2**12, max_calls=50)
    assert list(pts) == [1, 1024]
    assert all(isinstance(t, Spread) and t.n == 2 and t.median > 0 for t in pts.values())

def linear_call(x, w, b):
    return torch.nn.functional.linear(x, w, b)


def test_call_path_nests_python_binding_and_aten():
    rows = operators.call_path(linear_call, torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
    assert rows[0].depth == 0 and rows[0].layer == "Python" and rows[0].name.startswith("linear_call")
    names = [r.name for r in rows]
    assert "aten::linear" in names and "aten::addmm" in names
    linear = next(r for r in rows if r.name == "aten::linear")
    addmm = next(r for r in rows if r.name == "aten::addmm")
    assert addmm.depth == linear.depth + 1          # addmm is called by linear
    assert linear.shapes[0] == (4, 8)
    assert all(r.total_us >= 0 for r in rows)


def test_call_path_needs_a_named_function():
    with pytest.raises(TypeError, match="named Python function"):
        operators.call_path(lambda x: x * 2, torch.randn(3))


def test_page_faults_per_call_counts_fresh_pages_not_reused_ones():
    """A preallocated output takes (almost) no faults; the count is per call, never negative.

    ``getrusage`` counts the whole process, so a pytest or torch thread touching a new stack or
    heap page during the calls adds a stray fault (CI saw 1 in 10 calls on a loaded machine):
    the bound is under one fault per call, where a fresh 256 KiB output would take 64.
    """
    import torch
    from perflab.internals.operators import page_faults_per_call
    x, out = torch.randn(2**16), torch.empty(2**16)
    reuse = lambda: torch.mul(x, 2, out=out)
    reuse()
    got = page_faults_per_call(reuse, calls=20)
    assert got is None or 0 <= got < 1
    fresh = lambda: bytearray(2**22)      # 4 MiB the OS must map and zero each time
    fresh()
    faults = page_faults_per_call(fresh, calls=5)
    assert faults is None or faults >= 0
    with pytest.raises(ValueError, match="calls"):
        page_faults_per_call(reuse, calls=0)


def test_plot_call_costs_draws_each_kind_with_its_fit_and_model():
    import matplotlib.pyplot as plt
    from perflab.core.rounds import Spread
    from perflab.internals.operators import plot_call_costs
    sweeps = {kind: {n: Spread((t0 + c * n,)) for n in (1, 2**10, 2**16, 2**20)}
              for kind, t0, c in (("cpu", 2e-6, 1e-10), ("cuda", 6e-6, 1e-12))}
    fig = plot_call_costs(sweeps, lambda kind, n: 1e-6 + 1e-11 * n)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    for kind in sweeps:
        assert {f"{kind}: measured", f"{kind}: fit $t_0 + c\\,n$", f"{kind}: model"} <= set(labels)
    plt.close(fig)
    with pytest.raises(ValueError, match="sweeps"):
        plot_call_costs({}, lambda kind, n: 0.0)
