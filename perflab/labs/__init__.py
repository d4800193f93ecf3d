"""perflab.labs: The labs' framework (``exercises``) and one module of checks per lab."""

from perflab import _submodules

__getattr__, __dir__ = _submodules(__name__)
