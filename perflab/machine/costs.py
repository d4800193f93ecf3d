"""What a computation costs: FLOPs done and the fewest bytes it must move through DRAM.

The one home of the course's cost models (chapters 1, 3 and 4 and the labs all count here):

* :class:`Cost` and the closed forms :func:`matmul_cost` (``2 m n k`` FLOPs) and
  :func:`elementwise_cost`; :func:`arithmetic_intensity` (FLOP/byte).
* :func:`count_cost`: FLOPs and minimum bytes of any call, counted operator by operator while it
  runs (a ``TorchDispatchMode`` plus torch's ``FlopCounterMode``).
* :func:`op_cost`: the same model for one ATen operator from the shapes a profiler trace recorded
  (used by :mod:`perflab.profiling.trace` to put achieved FLOP/s and bandwidth on each kernel).

Bytes are counted the way the roofline model counts DRAM traffic (Williams, Waterman and
Patterson, CACM 52(4), 2009): each input read once, each output written once. Units: FLOPs, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from perflab.core.validate import number, positive, positive_int

__all__ = [
    "NORM_FLOPS_PER_ELEMENT",
    "Cost",
    "arithmetic_intensity",
    "count_cost",
    "elementwise_cost",
    "matmul_cost",
    "op_cost",
]


@dataclass(frozen=True)
class Cost:
    """FLOPs done and the fewest bytes a kernel must move through DRAM (each input read once,
    each output written once)."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return arithmetic_intensity(self.flops, self.bytes)


def _itemsize(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def matmul_cost(m: int, n: int, k: int, dtype: torch.dtype = torch.float32) -> Cost:
    """Cost of ``C[m,n] = A[m,k] @ B[k,n]``: ``2*m*n*k`` FLOPs (one multiply and one add per
    term) and ``(m*k + k*n + m*n) * itemsize`` bytes.

    Raises:
        ValueError: a dimension is not a positive integer.
        TypeError: ``dtype`` is not a torch.dtype.
    """
    m, n, k = (positive_int(name, v) for name, v in (("m", m), ("n", n), ("k", k)))
    size = _itemsize(dtype)
    return Cost(2.0 * m * n * k, float((m * k + k * n + m * n) * size))


def elementwise_cost(
    numel: int,
    flops_per_element: float,
    dtype: torch.dtype = torch.float32,
    inputs: int = 1,
    outputs: int = 1,
) -> Cost:
    """Cost of an elementwise kernel over ``numel`` elements that reads ``inputs`` tensors and
    writes ``outputs`` tensors of ``dtype``, doing ``flops_per_element`` FLOPs per element.

    Example: ``x * 2`` repeated ``r`` times and fused is ``elementwise_cost(n, r)``; ``a + b`` is
    ``elementwise_cost(n, 1, inputs=2)``.

    Raises:
        ValueError: ``numel``, ``inputs`` or ``outputs`` not positive, or negative FLOPs.
        TypeError: ``dtype`` is not a torch.dtype.
    """
    positive_int("numel", numel)
    positive_int("inputs", inputs)
    positive_int("outputs", outputs)
    number("flops_per_element", flops_per_element, minimum=0)
    size = _itemsize(dtype)
    return Cost(float(numel) * flops_per_element, float(numel * size * (inputs + outputs)))


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved. Raises ValueError when ``nbytes`` is not positive or ``flops`` < 0."""
    positive("nbytes", nbytes)
    number("flops", flops, minimum=0)
    return flops / nbytes


# ---------------------------------------------------------------------------------------------
# Counting a call's FLOPs and bytes by watching every ATen operator it runs
# ---------------------------------------------------------------------------------------------

# Operators that create a tensor without reading or writing its elements.
_NO_TRAFFIC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
               "lift_fresh", "set_", "resize_", "_local_scalar_dense"}
# Operators that only write their output (no element is read).
_WRITE_ONLY = {"fill_", "zero_", "zeros", "ones", "zeros_like", "ones_like", "full", "full_like",
               "new_zeros", "new_ones", "new_full", "scalar_tensor", "arange", "randn", "rand",
               "normal_", "uniform_", "randn_like", "rand_like"}


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _operator_bytes(func, args, kwargs, out) -> int:
    """Bytes one ATen operator must move if each distinct input is read once and each output
    written once (views and allocations move nothing)."""
    schema = func._schema
    base = schema.name.split("::")[-1]
    if base in _NO_TRAFFIC:
        return 0
    first_return = schema.returns[0] if schema.returns else None
    if first_return is not None and first_return.alias_info is not None and not first_return.alias_info.is_write:
        return 0  # a view: shares its input's storage, touches no element
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    written = sum(_tensor_bytes(t) for t in outputs)
    if base in _WRITE_ONLY:
        return written
    seen = set()
    read = 0
    for t in tree_flatten((args, kwargs or {}))[0]:
        if isinstance(t, torch.Tensor) and t.numel() > 1:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype)
            if key not in seen:
                seen.add(key)
                read += _tensor_bytes(t)
    return read + written


def count_cost(fn: Callable, *args, **kwargs):
    """FLOPs and minimum DRAM bytes of one call of ``fn(*args, **kwargs)``, counted operator by operator.

    Every ATen operator the call runs (forward, backward and optimizer alike) is intercepted with
    a ``TorchDispatchMode``. FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``
    (matrix products, convolutions and attention: ``2*m*n*k`` for a product), plus one FLOP per
    output element of each elementwise arithmetic operator (``mul``, ``add``, ``relu``, ...). Bytes are the traffic an *unfused* operator cannot avoid: each
    distinct tensor input read once, each output written once; views and allocations move
    nothing; fills only write. Scalars and 1-element tensors are not counted as reads.

    This is a lower bound for eager code on tensors larger than the caches (each operator makes
    at least this many DRAM round trips) and an upper bound for fused code (a fused kernel skips
    the intermediates). The function really runs, so pass inputs on the device you will time.

    Returns:
        :class:`Cost` with ``flops`` (FLOPs) and ``bytes`` (bytes).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")

    class _ByteCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0
            self.flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.bytes += _operator_bytes(func, args, kwargs, out)
            if func._schema.name.split("::")[-1] in _POINTWISE and isinstance(out, torch.Tensor):
                self.flops += out.numel()
            return out

    flop_mode = FlopCounterMode(display=False)
    byte_mode = _ByteCounter()
    with flop_mode, byte_mode:
        fn(*args, **kwargs)
    return Cost(float(flop_mode.get_total_flops() + byte_mode.flops), float(byte_mode.bytes))


# ---------------------------------------------------------------------------------------------
# Reading a Chrome/Perfetto trace exported by torch.profiler
# ---------------------------------------------------------------------------------------------
#
# ``prof.export_chrome_trace(path)`` writes the Chrome trace-event format: a JSON object whose
# ``traceEvents`` list holds complete events (``"ph": "X"``) with ``name``, ``cat``, ``ts`` and
# ``dur`` in microseconds, and ``args``. The categories used here: ``cpu_op`` (an ATen operator
# on a CPU thread, with ``Input Dims`` / ``Input type`` when ``record_shapes=True``), ``kernel``
# (a GPU kernel, with ``grid``, ``block``, ``blocks per SM`` and ``stream``), ``user_annotation``
# (``record_function`` ranges and the schedule's ``ProfilerStep#N``). A kernel's ``External id``
# equals that of the CPU operator that launched it, which links a kernel to its operator's shapes.

_ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
             "c10::Float8_e5m2": 1, "long int": 8, "long": 8, "int": 4, "short int": 2,
             "signed char": 1, "unsigned char": 1, "bool": 1}

# Elementwise operators: one FLOP per output element (0 for pure data movement).
_POINTWISE = {"add", "sub", "mul", "div", "add_", "sub_", "mul_", "div_", "addcmul", "addcmul_",
              "addcdiv", "addcdiv_", "lerp", "lerp_", "relu", "relu_", "gelu", "gelu_",
              "gelu_backward", "threshold_backward", "sigmoid", "sigmoid_backward", "tanh",
              "tanh_backward", "silu", "silu_", "silu_backward", "neg", "exp", "log", "cos", "sin",
              "sqrt", "rsqrt", "pow", "square", "abs", "clamp", "clamp_min", "clamp_max", "where",
              "maximum", "minimum", "reciprocal", "sign", "mse_loss", "mse_loss_backward"}
_MOVES = {"copy_", "clone", "contiguous", "_to_copy"}
#: FLOPs counted per element of a normalization (layer norm, RMS norm, batch norm) and of a
#: softmax: one per step (mean, variance, normalize, scale, shift), the count FLOP counters use.
#: The arithmetic is a few operations more (a variance is a subtraction, a square and a sum),
#: which changes nothing for a kernel that is bandwidth-bound: its time is its bytes. The one
#: count of the course: chapters 1 and 4, the explorer, lab 2 and :mod:`perflab.speed.datamovement`.
NORM_FLOPS_PER_ELEMENT = 5
_NORMS = {"layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
          "native_batch_norm", "_native_batch_norm_legit", "softmax", "_softmax", "log_softmax", "_log_softmax"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm"}


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _tensor_args(dims, types):
    """(numel, itemsize) of each tensor argument; scalars and None are skipped; None if a
    tensor's dtype is unknown."""
    out = []
    for d, t in zip(dims or [], types or []):
        if t in ("", "Scalar", "ScalarList", "TensorList", "GenericList") or not isinstance(d, list):
            continue
        if d and isinstance(d[0], list):  # a list of tensors: not modelled
            return None
        if t not in _ITEMSIZE:
            return None
        out.append((_numel(d), _ITEMSIZE[t]))
    return out


def op_cost(name: str, input_dims, input_types):
    """FLOPs and minimum bytes of one ATen operator call, from the shapes the profiler recorded.

    Args:
        name: operator name as in the trace, e.g. ``"aten::addmm"``.
        input_dims: the trace's ``Input Dims``: one list of sizes per argument (``[]`` for a
            scalar or None).
        input_types: the trace's ``Input type``: one C++ type name per argument (``"float"``,
            ``"c10::BFloat16"``, ``"Scalar"``, ...).

    Returns:
        :class:`Cost`, or None for an operator this model does not cover (or a shape it
        cannot read). Matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``linear``,
        ``matmul``): ``2*m*n*k`` FLOPs per product, bytes for reading both operands (and bias)
        and writing the result (Williams et al., 2009, count DRAM traffic the same way).
        Elementwise operators: one FLOP per output element and every tensor read and written
        once; copies move bytes and do no FLOPs; reductions read their input once;
        normalizations and softmax read the input and write the output once, at about 5 FLOPs
        per element (mean, variance, normalize, scale, shift).

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    base = name.split("::")[-1]
    dims = list(input_dims or [])
    tensors = _tensor_args(dims, input_types)
    if tensors is None or not tensors:
        return None
    size = tensors[0][1]
    try:
        if base == "mm":
            (m, k), (_, n) = dims[0], dims[1]
            return Cost(2.0 * m * n * k, float((m * k + k * n + m * n) * size))
        if base == "addmm":
            bias, (m, k), (_, n) = dims[0], dims[1], dims[2]
            size = tensors[1][1]
            return Cost(2.0 * m * n * k, float((_numel(bias) + m * k + k * n + m * n) * size))
        if base in ("bmm", "baddbmm"):
            a, b = (dims[0], dims[1]) if base == "bmm" else (dims[1], dims[2])
            (bs, m, k), (_, _, n) = a, b
            extra = _numel(dims[0]) if base == "baddbmm" else 0
            return Cost(2.0 * bs * m * n * k, float((bs * (m * k + k * n + m * n) + extra) * size))
        if base == "linear":
            x, w = dims[0], dims[1]
            n, k = w
            m = _numel(x) // k
            bias = _numel(dims[2]) if len(dims) > 2 and dims[2] else 0
            return Cost(2.0 * m * n * k, float((m * k + n * k + m * n + bias) * size))
        if base == "matmul":
            a, b = dims[0], dims[1]
            if len(a) < 2 or len(b) < 2:
                return None
            m, k, n = a[-2], a[-1], b[-1]
            batch = max(_numel(a[:-2]), _numel(b[:-2]))
            return Cost(2.0 * batch * m * n * k, float((_numel(a) + _numel(b) + batch * m * n) * size))
    except (ValueError, TypeError, IndexError, ZeroDivisionError):
        return None
    if base in _POINTWISE or base in _MOVES or base in ("fill_", "zero_"):
        out_numel = max(n for n, _ in tensors)
        if base in ("fill_", "zero_"):
            return Cost(0.0, float(tensors[0][0] * tensors[0][1]))
        if base == "copy_" and len(tensors) >= 2:  # copy_(dst, src): write dst, read src
            return Cost(0.0, float(sum(n * s for n, s in tensors[:2])))
        read = sum(n * s for n, s in tensors)
        # in place (``add_``): the write goes to self; otherwise a new output of the broadcast size
        written = tensors[0][0] * tensors[0][1] if base.endswith("_") else out_numel * size
        flops = 0.0 if base in _MOVES else float(out_numel)
        return Cost(flops, float(read + written))
    if base in _NORMS:  # read the input once, write the output once
        n, s = tensors[0]
        return Cost(float(NORM_FLOPS_PER_ELEMENT * n), float(2 * n * s + sum(m * z for m, z in tensors[1:])))
    if base in _REDUCTIONS:
        n, s = tensors[0]
        return Cost(float(n), float(n * s))
    return None
