import pytest

from perflab import overhead as O


def test_python_and_operator_rates_are_positive_and_ordered():
    adds = O.python_adds_per_second(100_000)
    ops = O.op_rate("cpu", ops=500)
    assert adds > 0 and ops > 0
    # an operator call does far more work than an integer add: the ordering is the lesson
    assert adds > ops


def test_rates_reject_bad_arguments():
    with pytest.raises(ValueError, match="n must"):
        O.python_adds_per_second(0)
    with pytest.raises(ValueError, match="numel"):
        O.op_rate("cpu", numel=0)
    with pytest.raises(ValueError, match="batches"):
        O.batch_scaling(lambda b: (lambda: None), [], "cpu")


def test_cuda_graph_rate_needs_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        O.cuda_graph_op_rate()


def test_batch_scaling_returns_one_time_per_batch():
    import torch

    out = O.batch_scaling(lambda b: (lambda: torch.ones(b) * 2), [1, 4], "cpu")
    assert [b for b, _ in out] == [1, 4] and all(t > 0 for _, t in out)
