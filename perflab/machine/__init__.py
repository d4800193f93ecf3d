"""perflab.machine: Chapters 1 and 2: the roofline and the cost model, the machine's parts (CPU,
caches, disk, GPU, host-device copies), datasheets, the report card, the explorer."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
