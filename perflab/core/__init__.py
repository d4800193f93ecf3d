"""perflab.core: Infrastructure every chapter shares: which device (sizes by device, the one
``/proc/cpuinfo`` reader), the one NVML reader, the one sampler, timing, fits, progress bars,
number formats, argument checks."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
