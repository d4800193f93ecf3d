"""perflab.kernels: Chapter 9: mixed precision and FP8, custom operators, torch.compile, attention
backends, the fused cross-entropy."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
