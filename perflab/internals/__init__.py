"""perflab.internals: Chapter 3: tensors and views, operators and dispatch, autograd's saved
tensors, host-device synchronizations, per-call overhead."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
