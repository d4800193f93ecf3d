"""Autograd's memory: what the forward pass saves for the backward pass, and how many bytes.

During the forward pass each differentiable operation stores the tensors its derivative needs
(``exp`` keeps its output, ``sin`` its input, a product both factors): these *saved tensors*
stay alive until the backward pass has used them, and in training they are most of the memory.
:func:`saved_tensors` counts them with ``torch.autograd.graph.saved_tensors_hooks``, whose *pack*
hook PyTorch calls once for every tensor an operation saves (PyTorch documentation, "Hooks for
saved tensors", https://pytorch.org/docs/stable/notes/autograd.html#hooks-for-saved-tensors).

Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["SavedTensor", "SavedTensors", "saved_tensors"]


@dataclass(frozen=True)
class SavedTensor:
    """One tensor an operation saved for backward.

    Attributes:
        shape: its shape.
        dtype: its dtype.
        nbytes: bytes of its elements (``numel * itemsize``).
        storage_nbytes: bytes of the storage it views (what saving it keeps alive).
        storage_ptr: address of that storage (equal addresses: the same memory saved twice).
        is_input: True when that storage is also the storage of one of the inputs passed in.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    storage_nbytes: int
    storage_ptr: int
    is_input: bool


@dataclass(frozen=True)
class SavedTensors:
    """Everything one call saved for backward, and its output.

    Attributes:
        tensors: one :class:`SavedTensor` per save, in the order the operations saved them.
        output: what the function returned.
    """

    tensors: tuple[SavedTensor, ...]
    output: Any

    @property
    def count(self) -> int:
        """How many times a tensor was saved (the same tensor saved twice counts twice)."""
        return len(self.tensors)

    @property
    def bytes(self) -> int:
        """Bytes kept alive for backward: the sum of ``storage_nbytes`` over *distinct* storages.

        A tensor saved by two operations, or several views of one storage, count once, because
        they hold one block of memory.
        """
        seen: dict[int, int] = {}
        for t in self.tensors:
            seen[t.storage_ptr] = max(seen.get(t.storage_ptr, 0), t.storage_nbytes)
        return sum(seen.values())

    @property
    def extra_bytes(self) -> int:
        """Like :attr:`bytes`, leaving out storages that belong to the inputs passed in.

        The inputs exist whether or not autograd saves them; this is the memory the graph adds.
        """
        seen: dict[int, int] = {}
        for t in self.tensors:
            if not t.is_input:
                seen[t.storage_ptr] = max(seen.get(t.storage_ptr, 0), t.storage_nbytes)
        return sum(seen.values())


def saved_tensors(fn: Callable[..., Any], *args, **kwargs) -> SavedTensors:
    """Run ``fn(*args, **kwargs)`` with autograd recording and report every tensor it saved for backward.

    The pack hook of ``torch.autograd.graph.saved_tensors_hooks`` sees each saved tensor; it
    records the tensor's shape, dtype and storage and hands the tensor back unchanged, so
    the graph (and a later ``backward()``) is exactly as without the hook. Inputs that should be
    differentiated must already have ``requires_grad=True``; operations whose inputs need no
    gradient save nothing.

    Returns:
        :class:`SavedTensors` with the saves and ``fn``'s output.

    Raises:
        TypeError: ``fn`` is not callable.
        RuntimeError: autograd is disabled here (inside ``torch.no_grad()`` or
            ``torch.inference_mode()``), where nothing would be saved.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        raise RuntimeError("saved_tensors needs autograd enabled; it was called under no_grad or inference_mode")
    input_ptrs = {a.untyped_storage().data_ptr() for a in list(args) + list(kwargs.values())
                  if isinstance(a, torch.Tensor)}
    found: list[SavedTensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        found.append(SavedTensor(tuple(t.shape), t.dtype, t.numel() * t.element_size(), storage.nbytes(),
                                 storage.data_ptr(), storage.data_ptr() in input_ptrs))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return SavedTensors(tuple(found), out)
