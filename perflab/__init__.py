"""perflab: the helper package of *PyTorch Performance from First Principles*.

Subpackages named for the infrastructure (``core``, ``record``), for each chapter's concept
(``machine``, ``internals``, ``profiling``, ``loading``, ``speed``, ``memory``, ``distributed``,
``kernels``, ``gpt2``) and for the labs (``labs``). The module map, which module owns which idea
and who uses it, is ``docs/ARCHITECTURE.md`` (generated from the code by
``scripts/architecture.py``).

Subpackages and their modules are imported on first use (``import perflab;
perflab.machine.roofline``), so importing the package stays cheap.
"""

import importlib
import warnings
from pathlib import Path

# torch 2.11's profiler warns, once per process, that it "clears events at the end of each
# cycle" whenever acc_events is False, also for the single-cycle profiles the course takes, where
# there is nothing to clear; the warning would land in a notebook's stored output as stderr.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)

__version__ = "0.1.0"


def _submodules(package: str):
    """``(__getattr__, __dir__)`` for ``package``'s ``__init__``: ``package.x`` imports the
    submodule or subpackage ``x`` on first use (PEP 562). An unknown name raises
    AttributeError, an error inside the submodule propagates."""
    def __getattr__(name: str):
        if not name.startswith("_"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        here = importlib.import_module(package)
        path = getattr(here, "__path__", [])
        found = {p.stem for folder in path for p in Path(folder).iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
        return sorted(found | set(vars(here)))

    return __getattr__, __dir__


__getattr__, __dir__ = _submodules(__name__)
