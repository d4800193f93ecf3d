"""perflab.distributed.collectives: Chapter 8 and chapter 2's several-GPU page: torchrun from a notebook,
collectives, data parallelism, sharding, checkpoints."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
