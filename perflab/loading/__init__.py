"""perflab.loading: Chapter 5: datasets built offline and their loaders."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
