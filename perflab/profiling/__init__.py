"""perflab.profiling.trace: Chapter 4: evidence from torch.profiler traces, external profilers (Nsight
Compute, py-spy, strace), reproducibility, lab 4's mystery steps."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
