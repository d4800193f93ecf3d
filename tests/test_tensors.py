import pytest
import torch

from perflab.internals import tensors


def test_contiguous_strides_match_pytorch():
    for shape in [(2, 3, 4), (5,), (1, 7), (3, 1, 2), ()]:
        assert tensors.contiguous_strides(shape) == torch.empty(shape).stride()
    assert tensors.contiguous_strides((2, 3, 4)) == (12, 4, 1)


def test_contiguous_strides_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"shape\[1\]"):
        tensors.contiguous_strides((2, -1))
    with pytest.raises(ValueError, match=r"shape\[0\]"):
        tensors.contiguous_strides((2.0, 3))


def test_shares_storage_tells_views_from_copies():
    x = torch.arange(12.0).reshape(3, 4)
    assert tensors.shares_storage(x, x.t())
    assert tensors.shares_storage(x, x[1:, ::2])
    assert not tensors.shares_storage(x, x.clone())
    assert not tensors.shares_storage(x, x[[0, 2]])
    assert not tensors.shares_storage(torch.empty(0), torch.empty(0))
    with pytest.raises(TypeError, match="b must be a torch.Tensor"):
        tensors.shares_storage(x, [1, 2])


def test_layout_reports_offsets_and_bytes_of_a_view():
    x = torch.arange(24.0).reshape(2, 3, 4)
    v = x[1, :, 1:3]
    info = tensors.layout(v)
    assert info["shape"] == (3, 2) and info["stride"] == (4, 1)
    assert info["storage_offset"] == 13
    assert info["nbytes"] == 6 * 4 and info["storage_nbytes"] == 24 * 4
    assert info["data_ptr"] - x.data_ptr() == 13 * 4
    assert not info["contiguous"]
    with pytest.raises(TypeError, match="t must be"):
        tensors.layout("not a tensor")


def test_view_or_copy():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert tensors.view_or_copy(lambda t: t.transpose(0, 2), x) == "view"
    assert tensors.view_or_copy(lambda t: t.transpose(0, 2).reshape(-1), x) == "copy"
    assert tensors.view_or_copy(lambda t: t[t > 3], x) == "copy"
    with pytest.raises(TypeError, match="fn must be callable"):
        tensors.view_or_copy(3, x)
    with pytest.raises(TypeError, match="must return a tensor"):
        tensors.view_or_copy(lambda t: t.sum().item(), x)
    with pytest.raises(ValueError, match="empty storage"):
        tensors.view_or_copy(lambda t: t, torch.empty(0))
