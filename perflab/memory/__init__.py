"""perflab.memory.training: Chapter 7: training memory predicted and measured."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
