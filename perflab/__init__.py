"""perflab: the helper package of *PyTorch Performance from First Principles*.

One module per idea; docs/ARCHITECTURE.md has the full map (module -> idea -> chapters) and the
rule for overlaps. In short:

* shared by every chapter: :mod:`~perflab.hardware` (device facts, sizes by device, datasheet
  peaks, the one ``/proc/cpuinfo`` reader), :mod:`~perflab.nvml` (the one NVML reader),
  :mod:`~perflab.formats` (number formats), :mod:`~perflab.costs` (FLOP and byte counts),
  :mod:`~perflab.fits` (fixed cost + linear), :mod:`~perflab.timing`, :mod:`~perflab.telemetry`
  (clocks and power under a benchmark), :mod:`~perflab.ceilings` (the run's one set of
  ceilings), :mod:`~perflab.claims` (prose checked against data), :mod:`~perflab.progress`
* chapter 1: :mod:`~perflab.roofline` (the roofline model, measured ceilings, the ``x*2 repeat``
  sweep, plots), :mod:`~perflab.overhead` (Python, dispatch and launch costs; CUDA graphs)
* chapter 2: :mod:`~perflab.cpu`, :mod:`~perflab.caches` (bandwidth against working set),
  :mod:`~perflab.disk`, :mod:`~perflab.gpu`, :mod:`~perflab.transfer` (host <-> device, peer),
  :mod:`~perflab.distributed` (torchrun from a notebook, all-reduce), :mod:`~perflab.report`
  (the machine report card: ``python -m perflab.report``)
* chapter 3: :mod:`~perflab.tensors` (storage, strides, views), :mod:`~perflab.operators` (the
  ATen library, per-call cost, call path), :mod:`~perflab.autograd` (saved tensors),
  :mod:`~perflab.sync` (host-device synchronizations)
* chapter 4: :mod:`~perflab.profiling` (torch.profiler evidence and trace reading),
  :mod:`~perflab.monitor` (machine state, GPU utilization), :mod:`~perflab.reproducibility`,
  :mod:`~perflab.tools` (ncu, py-spy, strace), :mod:`~perflab.mystery` (lab 4's steps)
* chapter 6: :mod:`~perflab.speed` (prefetcher, training ladder, CUDA-graph step, copy/compute
  overlap from a trace, BN folding, compile logs as text; lab 6's checks)
* chapter 7: :mod:`~perflab.memory` (training memory predicted and measured, the caching
  allocator, snapshots, checkpointing, accumulation, lab 7's checks)
* chapter 8: :mod:`~perflab.parallel` (torchrun on one or two "nodes", manual data
  parallelism, DDP, ZeRO-1, FSDP2, distributed checkpoints, failure and restart)
* chapter 9: :mod:`~perflab.precision` (number formats, mixed precision, fp8),
  :mod:`~perflab.custom_ops` (a fused operator in C++, CUDA and Triton, registered),
  :mod:`~perflab.compiler` (graph breaks, recompiles, the graphs inside torch.compile),
  :mod:`~perflab.attention` (which SDPA backend runs)
* the book: :mod:`~perflab.provenance` (where numbers came from; glue), :mod:`~perflab.runs`
  (reference runs as data; is a notebook current?), :mod:`~perflab.plotting` (figure layout and
  provenance stamp), :mod:`~perflab.exercises` (lab checks), :mod:`~perflab.explorer` (the
  interactive roofline)

Submodules are imported on first use (``import perflab; perflab.roofline``) so that importing the
package stays cheap.
"""

import importlib
import warnings

# torch 2.11's profiler warns, once per process, that it "clears events at the end of each
# cycle" whenever acc_events is False, also for the single-cycle profiles the course takes, where
# there is nothing to clear; the warning would land in a notebook's stored output as stderr.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)

__version__ = "0.1.0"


def __getattr__(name):
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")
