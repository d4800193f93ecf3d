"""perflab.speed.techniques: Chapter 6: single-GPU speed techniques and where a step's time and bytes go."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
