"""Tensors as PyTorch stores them: a storage (one flat block of bytes) plus a view of it.

A tensor is metadata over a storage: ``shape``, ``stride`` (elements to skip in the storage to
move one step along each dimension), ``storage_offset`` (where element ``[0, ..., 0]`` sits) and
``dtype``. Element ``i`` (a tuple of indices) lives at storage position
``storage_offset + sum(i[d] * stride[d])``. Operations that only change that metadata (transpose,
slicing, ``view``, ``expand``) return *views* sharing the storage; the others allocate a new one
(a *copy*). This module names those facts so chapters and lab checks can ask for them.

Source of the layout rules: the PyTorch documentation, "Tensor Views" and ``torch.Tensor.stride``
(https://pytorch.org/docs/stable/tensor_view.html). Units: elements for strides and offsets,
bytes for sizes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

__all__ = ["contiguous_strides", "layout", "shares_storage", "view_or_copy"]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides, in elements, of a contiguous (row-major, "C order") tensor of ``shape``.

    ``stride[d] = shape[d + 1] * shape[d + 2] * ... * shape[-1]``: the last dimension moves one
    element at a time, each earlier one jumps over a whole block of the later ones. Example:
    ``contiguous_strides((2, 3, 4)) == (12, 4, 1)``. A dimension of size 0 or 1 still gets this
    formula's value (PyTorch may report any stride for such a dimension, since it is never used).

    Raises:
        ValueError: ``shape`` holds a negative or non-integer size.
    """
    sizes = list(shape)
    for d, s in enumerate(sizes):
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"shape[{d}] must be a non-negative integer, got {s!r}")
    strides = []
    step = 1
    for s in reversed(sizes):
        strides.append(step)
        step *= max(s, 1)
    return tuple(reversed(strides))


def _check_tensor(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when tensors ``a`` and ``b`` are views of the same storage (writing one can change the other).

    Compares the address of each tensor's untyped storage. Two tensors with empty storages
    (0 bytes, no address) are reported as not sharing, since there is nothing to share.

    Raises:
        TypeError: ``a`` or ``b`` is not a tensor.
    """
    _check_tensor("a", a)
    _check_tensor("b", b)
    if a.device != b.device:
        return False
    pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    return pa != 0 and pa == pb


def layout(t: torch.Tensor) -> dict[str, Any]:
    """The metadata that places tensor ``t`` in its storage, as a dict.

    Keys: ``shape`` and ``stride`` (tuples; strides in elements), ``storage_offset`` (elements),
    ``contiguous`` (bool), ``dtype``, ``device``, ``itemsize`` (bytes per element), ``nbytes``
    (bytes the tensor's elements occupy: ``numel * itemsize``), ``storage_nbytes`` (bytes of the
    whole storage, which may be larger when ``t`` is a view of part of it) and ``data_ptr`` (address
    of element ``[0, ..., 0]``, i.e. storage address + ``storage_offset * itemsize``).

    Raises:
        TypeError: ``t`` is not a tensor.
    """
    _check_tensor("t", t)
    return {
        "shape": tuple(t.shape),
        "stride": tuple(t.stride()),
        "storage_offset": t.storage_offset(),
        "contiguous": t.is_contiguous(),
        "dtype": t.dtype,
        "device": t.device,
        "itemsize": t.element_size(),
        "nbytes": t.numel() * t.element_size(),
        "storage_nbytes": t.untyped_storage().nbytes(),
        "data_ptr": t.data_ptr(),
    }


def view_or_copy(fn: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> str:
    """``"view"`` when ``fn(t)`` returns a tensor sharing ``t``'s storage, ``"copy"`` when it does not.

    Example: ``view_or_copy(lambda x: x.t(), x) == "view"``; ``view_or_copy(lambda x: x[[0, 1]], x)
    == "copy"`` (advanced indexing always gathers into new memory).

    Raises:
        TypeError: ``t`` is not a tensor, ``fn`` is not callable, or ``fn(t)`` is not a tensor.
        ValueError: ``t`` has an empty storage (nothing to share, so the question has no answer).
    """
    _check_tensor("t", t)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if t.untyped_storage().nbytes() == 0:
        raise ValueError("t has an empty storage, so no result can share it; use a non-empty tensor")
    out = fn(t)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"fn(t) must return a tensor, got {type(out).__name__}")
    return "view" if shares_storage(out, t) else "copy"
