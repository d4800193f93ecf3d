"""perflab: the helper package of *PyTorch Performance from First Principles*.

One module per concept of the course, each small and documented:

* :mod:`perflab.hardware`   device facts, problem sizes by device, datasheet peaks
* :mod:`perflab.timing`     warm-up, CUDA events, medians, do_bench / torch.utils.benchmark
* :mod:`perflab.roofline`   FLOP and byte counts, ceilings, the ``x*2 repeat`` sweep, plots
* :mod:`perflab.overhead`   Python, dispatch and launch costs; CUDA graphs
* :mod:`perflab.profiling`  reading torch.profiler output
* :mod:`perflab.provenance` where numbers came from; glue and reading glued values back
* :mod:`perflab.plotting`   figure layout and the provenance stamp
* :mod:`perflab.exercises`  lab checks with one-sentence feedback

Submodules are imported on first use (``import perflab; perflab.roofline``) so that importing the
package stays cheap.
"""

import importlib

__version__ = "0.1.0"



def __getattr__(name):
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")
