"""perflab.record: Where numbers come from and where they go: provenance and glue, reference runs
as data, the run's ceilings, claims checked against data, figure stamps."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
