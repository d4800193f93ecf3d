"""perflab.distributed: chapter 8's data parallelism and sharding on several processes: the launch
and its worker, the tasks every rank runs, and the techniques and cost models exported from the
page."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
