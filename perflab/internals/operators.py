"""Operators: the ATen library, the dispatcher, the cost of one call, and the call path.

Every PyTorch operation on tensors ends in an *operator* of ATen, PyTorch's C++ tensor library,
registered with the *dispatcher*. The dispatcher picks a kernel for each call from the tensors'
*dispatch keys* (device, autograd, autocast, ...). Counting, reading the registrations and timing
calls are done here so chapters can show each step in a few lines.

Units: seconds for times, elements for sizes. Sources: the dispatcher's design is described in
Edward Yang's "Let's talk about the PyTorch dispatcher" (2020) and in PyTorch's
``aten/src/ATen/native/README.md``; the registration queries used below are the private
``torch._C._dispatch_*`` functions that PyTorch's own tests use, so they may change between
releases (each function says which one it calls).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from perflab.core.fits import fit_line
from perflab.core.validate import positive_int

try:  # POSIX only: page faults of this process (None on Windows)
    import resource
except ImportError:
    resource = None

__all__ = [
    "CallCost",
    "CallPathRow",
    "call_path",
    "fit_call_cost",
    "has_kernel",
    "page_faults_per_call",
    "operator_counts",
]


# ---------------------------------------------------------------------------------------------
# The operator library
# ---------------------------------------------------------------------------------------------

def operator_counts() -> dict[str, Any]:
    """Count the operators registered with this PyTorch's dispatcher.

    Reads ``torch._C._dispatch_get_all_op_names()`` (every registered operator, one name per
    *overload*, e.g. ``"aten::add.Tensor"`` and ``"aten::add.out"``) and the schemas from
    ``torch._C._jit_get_all_schemas()``. Returns a dict:

    * ``total``: registered operator overloads in all namespaces;
    * ``namespaces``: ``Counter`` of overloads per namespace (``aten``, ``quantized``, ``prims`` ...);
    * ``aten_overloads``: overloads in the ``aten`` namespace;
    * ``aten_operators``: distinct ``aten`` operator names (overloads merged: ``add.Tensor``,
      ``add.Scalar`` and ``add.out`` count once as ``add``);
    * ``aten_inplace``: distinct ``aten`` names of in-place variants (ending in ``_``, like ``add_``;
      dunder names such as ``__iand__`` are not counted);
    * ``aten_out``: ``aten`` overloads with an ``out=`` argument (a schema argument marked ``is_out``);
    * ``aten_composite_implicit``: ``aten`` overloads whose only implementation is written in terms
      of other operators (a ``CompositeImplicitAutograd`` kernel and no ``CPU`` kernel);
    * ``aten_with_cpu_kernel`` / ``aten_with_cuda_kernel``: overloads with a kernel registered for the
      ``CPU`` / ``CUDA`` dispatch key (the CUDA count is 0 in a CPU-only build of PyTorch).

    Returns plain Python numbers (and one Counter); nothing is cached, the count is of the running
    build.
    """
    names = list(torch._C._dispatch_get_all_op_names())
    namespaces = Counter(n.split("::", 1)[0] for n in names)
    aten = [n for n in names if n.startswith("aten::")]
    schemas = {}
    for s in torch._C._jit_get_all_schemas():
        schemas[s.name + (f".{s.overload_name}" if s.overload_name else "")] = s
    base = {n.split(".", 1)[0] for n in aten}
    inplace = {b for b in base if b.endswith("_") and not b.startswith("aten::__")}
    out_variants = sum(1 for n in aten if n in schemas and any(a.is_out for a in schemas[n].arguments))
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    composite = sum(1 for n in aten if has(n, "CompositeImplicitAutograd") and not has(n, "CPU"))
    return {
        "total": len(names),
        "namespaces": namespaces,
        "aten_overloads": len(aten),
        "aten_operators": len(base),
        "aten_inplace": len(inplace),
        "aten_out": out_variants,
        "aten_composite_implicit": composite,
        "aten_with_cpu_kernel": sum(1 for n in aten if has(n, "CPU")),
        "aten_with_cuda_kernel": sum(1 for n in aten if has(n, "CUDA")),
    }


def has_kernel(op: str, key: str) -> bool:
    """True when operator overload ``op`` (e.g. ``"aten::add.Tensor"``) has a kernel for dispatch key ``key``.

    ``key`` is a dispatch key name such as ``"CPU"``, ``"CUDA"``, ``"Meta"``, ``"AutogradCPU"`` or an
    alias key such as ``"Autograd"``, ``"CompositeImplicitAutograd"`` or
    ``"CompositeExplicitAutograd"``. Calls ``torch._C._dispatch_has_kernel_for_dispatch_key``.

    Raises:
        ValueError: ``op`` is not a registered operator overload (give the overload name; an
            operator without a default overload, like ``aten::add``, needs e.g. ``aten::add.Tensor``),
            or ``key`` is not a dispatch key name.
    """
    if not isinstance(op, str) or "::" not in op:
        raise ValueError(f"op must be a qualified operator name like 'aten::add.Tensor', got {op!r}")
    if op not in set(torch._C._dispatch_get_all_op_names()):
        raise ValueError(f"op {op!r} is not a registered operator overload "
                         "(use the overload name, e.g. 'aten::add.Tensor')")
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))
    except RuntimeError as err:
        raise ValueError(f"key {key!r} is not a dispatch key name: {err}") from None


# ---------------------------------------------------------------------------------------------
# The cost of one call against tensor size
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallCost:
    """The linear cost model of one operator call, ``t(numel) = fixed_s + per_element_s * numel``.

    Attributes:
        fixed_s: the per-call cost that does not depend on size (Python, dispatcher, allocation,
            kernel launch), in seconds.
        per_element_s: the cost of each further element (the kernel's memory traffic), in seconds.
    """

    fixed_s: float
    per_element_s: float

    @property
    def crossover_numel(self) -> float:
        """Elements at which the size-dependent cost equals the fixed cost: ``fixed_s / per_element_s``.

        Below it a call is overhead-bound (making the tensor smaller saves almost nothing);
        above it the kernel's own work dominates.
        """
        return self.fixed_s / self.per_element_s

    def seconds(self, numel: float) -> float:
        """The model's time for one call on ``numel`` elements, in seconds."""
        return self.fixed_s + self.per_element_s * numel


def fit_call_cost(numels: Sequence[float], seconds: Sequence[float]) -> CallCost:
    """Fit ``t = fixed + per_element * numel`` to measured per-call times.

    A least-squares fit of the *relative* error, minimising ``sum(((fixed + c*n_i) - t_i) / t_i)^2``,
    so the small sizes (which set ``fixed``) weigh as much as the large ones (which set ``c``); with
    plain least squares the largest times would decide both: :func:`perflab.core.fits.fit_line` with
    ``relative=True``.

    Args:
        numels: tensor sizes in elements, at least two distinct values.
        seconds: measured time of one call at each size, in seconds (same length, all > 0).

    Raises:
        ValueError: mismatched or too-short inputs, a non-positive size or time, or a fit without a
            positive fixed cost or a positive per-element cost (the sweep did not reach sizes where
            one of them shows: extend it).
    """
    n = np.asarray(list(numels), dtype=float)
    t = np.asarray(list(seconds), dtype=float)
    if n.shape != t.shape:
        raise ValueError(f"numels and seconds must have the same length, got {n.size} and {t.size}")
    if n.size < 2 or np.unique(n).size < 2:
        raise ValueError("need at least two distinct sizes to fit a fixed and a per-element cost")
    if (n <= 0).any() or not np.isfinite(n).all():
        raise ValueError("numels must all be positive and finite")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("seconds must all be positive and finite")
    fit = fit_line(n, t, relative=True)
    fixed, per_element = fit.fixed, fit.slope
    if fixed <= 0:
        raise ValueError(f"the fit found no positive fixed cost ({fixed:.3g} s): add smaller sizes to the sweep")
    if per_element <= 0:
        raise ValueError(f"the fit found no positive per-element cost ({per_element:.3g} s): "
                         "add larger sizes to the sweep")
    return CallCost(float(fixed), float(per_element))


def plot_call_costs(sweeps: dict, model_s: Callable[[str, int], float]):
    """Draw chapter 3's call-cost figure: the time of one call (µs, log) against elements per
    call (log), for each device kind in ``sweeps`` (``{kind: {numel: Spread of seconds}}``, as
    :func:`perflab.internals.callcost.call_cost_sweep` returns per kind): the medians as dots,
    the line :func:`fit_call_cost` fits to them, the page's model ``model_s(kind, numel)``
    (seconds) dashed, and the fit's crossover dotted. Returns the matplotlib Figure, not yet
    shown (:func:`perflab.record.plotting.finish` shows it).

    Raises:
        ValueError: an empty ``sweeps`` (and :func:`fit_call_cost`'s errors).
    """
    if not sweeps:
        raise ValueError("sweeps must hold at least one device kind's sweep")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (kind, points) in enumerate(sweeps.items()):
        sizes = list(points)
        line = fit_call_cost(sizes, [points[n].median for n in sizes])
        ax.loglog(sizes, [points[n].median * 1e6 for n in sizes], "o", ms=4,
                  color=f"C{i}", label=f"{kind}: measured")
        ax.loglog(sizes, [line.seconds(n) * 1e6 for n in sizes], "-", color=f"C{i}", lw=1,
                  label=f"{kind}: fit $t_0 + c\\,n$")
        ax.loglog(sizes, [model_s(kind, n) * 1e6 for n in sizes], "--", color=f"C{i}", lw=1,
                  label=f"{kind}: model")
        ax.axvline(line.crossover_numel, color=f"C{i}", ls=":", lw=1.2)
    ax.set(xlabel="elements per call (float32)", ylabel="time per call (µs)",
           title="y = x * 2: fixed cost, then the kernel")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def page_faults_per_call(fn: Callable[[], object], calls: int = 20) -> float | None:
    """Minor page faults the process takes per call of ``fn()`` (the operating system mapping a
    fresh page on first touch), from ``getrusage``'s ``ru_minflt`` before and after ``calls``
    calls; None where the OS has no ``resource`` module (Windows).

    A CPU operator whose output is fresh memory from the operating system (large allocations
    are ``mmap``-ed by the C library and returned with ``munmap`` when freed) faults once per 4
    KiB page of it on every call; writing into a preallocated output (``out=``) faults not at
    all. Call ``fn`` once before (first-call costs stay out).

    Raises:
        ValueError: ``calls`` < 1.
    """
    positive_int("calls", calls)
    if resource is None:
        return None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


# ---------------------------------------------------------------------------------------------
# The call path, from the profiler
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallPathRow:
    """One event of a profiled call, in call order.

    Attributes:
        depth: nesting depth below the profiled Python function (0 = the function itself).
        name: the event's name (Python frame, binding, ``aten::`` operator, CUDA API or kernel).
        layer: ``"Python"``, ``"Python binding (C++)"``, ``"ATen operator"``, ``"CUDA runtime"``,
            ``"GPU kernel"`` or ``"other"``.
        total_us: time from the event's start to its end, children included, in microseconds
            (for a GPU kernel: its run time on the GPU).
        self_us: ``total_us`` minus the children's time, in microseconds.
        shapes: input shapes the profiler recorded (``aten::`` events only, else empty).
    """

    depth: int
    name: str
    layer: str
    total_us: float
    self_us: float
    shapes: tuple = ()


_PY_FRAME = re.compile(r"^.+\(\d+\): .+$")
_PY_FRAME_PARTS = re.compile(r"^(.+)\((\d+)\): (.+)$")
_ADDRESS = re.compile(r" (of .*?)?object at 0x[0-9a-fA-F]+")


# events the profiler records about itself (Kineto allocating its trace buffers on the first
# CUDA activity), not part of the call being traced
_PROFILER_INTERNAL = {"Activity Buffer Request"}


def _layer(name: str) -> str:
    if name.startswith("aten::"):
        return "ATen operator"
    if name.startswith("<built-in"):
        return "Python binding (C++)"
    if _PY_FRAME.match(name):
        return "Python"
    if name.startswith(("cuda", "cu")) and not name.startswith("cutlass"):
        return "CUDA runtime"
    return "other"


def _label(name: str) -> str:
    """A short label: Python frames as ``func() [file.py:line]`` (no location for notebook cells)."""
    frame = _PY_FRAME_PARTS.match(name)
    if frame:
        path, line, func = frame.groups()
        where = "" if "ipykernel" in path else f" [{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}]"
        return f"{func}(){where}"
    return _ADDRESS.sub("", name)


def call_path(fn: Callable, *args, **kwargs) -> list[CallPathRow]:
    """Profile one call of ``fn(*args, **kwargs)`` and return its nested events, outermost first.

    Runs ``fn`` once to warm up, then three times under ``torch.profiler.profile`` with a
    schedule (``wait=1, warmup=1, active=1``: only the third call, warm for the profiler too,
    is kept) and ``record_shapes=True``, plus the CUDA activity when any tensor argument is on a GPU. The call
    is wrapped in a ``record_function`` range named ``"<fn name>()"``; the rows are the event tree
    below that range: each ``aten::`` operator (nested by which operator called which), the CUDA
    runtime calls made inside them and, as children of the operator that launched them, the GPU
    kernels. Python frames are not traced (``with_stack`` is off: see the comment in the code).

    ``fn`` must be a named Python function (``def``), so its frame can be found by name.

    Raises:
        TypeError: ``fn`` is not a Python function.
        RuntimeError: the profiler recorded no range for the call, so the call path cannot be cut
            out of the trace.
    """
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not name or name == "<lambda>":
        raise TypeError("fn must be a named Python function (def), not a lambda or other callable")
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    on_gpu = any(t.is_cuda for t in tensors)
    fn(*args, **kwargs)
    if on_gpu:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])

    root_name = f"{name}()"
    # no with_stack: its Python tracer keeps raw pointers to code objects, and a code object
    # freed during profiling (an import inside record_function on torch 2.13, say) later decodes
    # as garbage (UnicodeDecodeError in evt.name(); pytorch/pytorch#64345, seen in this course's CI)
    # a schedule: one step skipped, one traced and thrown away (the profiler's own start-up,
    # CUPTI's first buffers), one kept, so the rows describe a warm call, not a first one
    steps = schedule(wait=1, warmup=1, active=1, repeat=1)
    with profile(activities=activities, record_shapes=True, schedule=steps) as prof:
        for _ in range(3):
            # a named range around the call: the root of the tree on every build, whether or
            # not this build's profiler also records Python frames (torch 2.11's did not)
            with record_function(root_name):
                fn(*args, **kwargs)
            if on_gpu:
                torch.cuda.synchronize()
            prof.step()
    # the Python frame of fn where this build records Python frames (then the range's other
    # children are the profiler's own Python); else the range, whose children are then the
    # operators alone
    roots = [e for e in prof.events() if _PY_FRAME.match(e.name) and e.name.endswith(f": {name}")]
    roots = roots or [e for e in prof.events() if e.name == root_name]
    if not roots:
        raise RuntimeError(f"the profiler recorded no range named {root_name!r}, so the call path "
                           "cannot be cut out of the trace")
    rows: list[CallPathRow] = []

    def visit(event, depth: int) -> None:
        if event.name in _PROFILER_INTERNAL:
            return
        label = _label(event.name)
        shapes = tuple(tuple(s) for s in event.input_shapes) if event.name.startswith("aten::") else ()
        layer = "Python" if event.name == root_name else _layer(event.name)
        rows.append(CallPathRow(depth, label, layer, float(event.cpu_time_total),
                                float(event.self_cpu_time_total), shapes))
        for kernel in getattr(event, "kernels", []) or []:
            rows.append(CallPathRow(depth + 1, kernel.name, "GPU kernel", float(kernel.duration),
                                    float(kernel.duration)))
        for child in sorted(event.cpu_children, key=lambda e: e.time_range.start):
            visit(child, depth + 1)

    visit(roots[0], 0)
    return rows
