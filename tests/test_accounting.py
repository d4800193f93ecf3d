"""perflab.speed.accounting on CPU: syncs counted per call; the GPU-only reader says so."""

import pytest
import torch

from perflab.speed import accounting


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


def test_drain_cost_is_zero_where_the_kernels_run_on_the_host():
    assert accounting.drain_cost("cpu") == 0.0
    with pytest.raises(ValueError, match="calls"):
        accounting.drain_cost("cpu", calls=0)


def test_residual_names_the_side_and_counts_drains_only_where_the_rung_syncs():
    said = accounting.residual("naive", "outside", 3e-4, 4e-3, 1e-3, 3, 5e-5)
    assert said.startswith("naive, outside: 300 µs a step more than predicted")
    assert "its host time the larger" in said and "2.0 drains per sync of its 3" in said
    quiet = accounting.residual("graph", "undecided", -1e-4, 1e-4, 6e-4, 0, 5e-5)
    assert "less than predicted" in quiet and "GPU time" in quiet and "drains" not in quiet
    assert "drains" not in accounting.residual("cpu", "outside", 1e-3, 1, 0, None, 0.0)


def test_residual_charges_syncs_only_with_the_excess_over_the_sync_free_rungs():
    said = accounting.residual("naive", "outside", 3e-4, 4e-3, 1e-3, 3, 5e-5, common_s=1.5e-4)
    assert "150 µs more than the sync-free rungs' common residual" in said
    assert "1.0 drains per sync of its 3" in said
    same = accounting.residual("no .item()", "outside", 3e-4, 4e-3, 1e-3, 2, 5e-5, common_s=3.2e-4)
    assert "less than the sync-free rungs' common residual" in same
    assert "drains per sync" not in same and "nothing left for its 2 syncs" in same


def test_sync_point_cost_on_a_cpu_is_the_lines_own_dispatch():
    cost = accounting.sync_point_cost("cpu", calls=5)
    assert cost > 0.0
    with pytest.raises(ValueError, match="calls"):
        accounting.sync_point_cost("cpu", calls=0)


def test_graph_gap_checks_its_arguments_and_needs_a_gpu(monkeypatch):
    with pytest.raises(ValueError, match="ops"):
        accounting.graph_gap(ops=0)
    with pytest.raises(ValueError, match="calls"):
        accounting.graph_gap(calls=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):
        accounting.graph_gap()


def test_graph_gap_is_the_period_less_the_kernels_own_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "randn", lambda *a, **k: torch.zeros(1))
    monkeypatch.setattr(accounting, "cuda_graph_op_rate",
                        lambda ops: 1 / 1.2e-6)
    monkeypatch.setattr(accounting, "device_busy",
                        lambda fn, calls: {"kernels_s": 0.9e-6})
    assert accounting.graph_gap() == pytest.approx(0.3e-6)
    monkeypatch.setattr(accounting, "device_busy",
                        lambda fn, calls: {"kernels_s": 2e-6})
    assert accounting.graph_gap() == 0.0          # never below zero


def test_device_busy_sums_kernels_and_spans_the_gaps(monkeypatch):
    from types import SimpleNamespace as NS

    cuda = torch.autograd.DeviceType.CUDA
    events = [NS(device_type=cuda, name=n, time_range=NS(start=a, end=b))
              for n, a, b in [("k1", 0, 10), ("Memcpy HtoD", 5, 15), ("k2", 20, 30),
                              ("Memset", 30, 40), ("k3", 50, 60)]]     # microseconds

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(accounting, "profile", FakeProfile)
    monkeypatch.setattr(accounting, "synchronize", lambda device: None)
    out = accounting.device_busy(lambda: None, calls=2, warmup=0)
    assert out["kernels_s"] == pytest.approx(30e-6 / 2)
    assert out["copies_s"] == pytest.approx(10e-6 / 2)
    assert out["busy_s"] == pytest.approx(35e-6 / 2)      # 0-15, 20-30, 50-60
    assert out["span_s"] == pytest.approx(60e-6 / 2)      # gaps included
    assert (out["kernels"], out["copies"]) == (1.5, 0.5)
