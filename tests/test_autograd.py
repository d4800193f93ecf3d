import pytest
import torch

from perflab.internals import autograd


def test_saved_tensors_follow_the_derivative_formulas():
    x = torch.randn(100, requires_grad=True)
    w = torch.randn(100, requires_grad=True)
    assert autograd.saved_tensors(lambda: x * 2).count == 0            # a constant factor: nothing saved
    assert autograd.saved_tensors(lambda: x.sum()).count == 0
    exp = autograd.saved_tensors(torch.exp, x)                          # exp saves its output
    assert exp.count == 1 and exp.tensors[0].storage_ptr == exp.output.untyped_storage().data_ptr()
    sin = autograd.saved_tensors(torch.sin, x)                          # sin saves its input
    assert sin.count == 1 and sin.tensors[0].is_input and sin.extra_bytes == 0
    prod = autograd.saved_tensors(lambda a, b: a * b, x, w)
    assert prod.count == 2 and prod.bytes == 2 * 100 * 4


def test_bytes_count_shared_storage_once():
    x = torch.randn(50, requires_grad=True)
    sq = autograd.saved_tensors(lambda t: t * t, x)       # x saved twice, one storage
    assert sq.count == 2 and sq.bytes == 50 * 4
    composite = autograd.saved_tensors(lambda t: 1 / (1 + torch.exp(-t)), x)
    assert composite.count == 2 and composite.bytes == 2 * 50 * 4


def test_saved_tensors_leave_the_graph_usable():
    x = torch.randn(10, requires_grad=True)
    rec = autograd.saved_tensors(torch.sigmoid, x)
    rec.output.sum().backward()
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(x.grad, s * (1 - s))


def test_saved_tensors_rejects_bad_input():
    with pytest.raises(TypeError, match="callable"):
        autograd.saved_tensors(3)
    with torch.no_grad(), pytest.raises(RuntimeError, match="autograd enabled"):
        autograd.saved_tensors(torch.exp, torch.randn(3))
