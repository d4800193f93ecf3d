"""Where a transformer's training step spends FLOPs, bytes and time, by operator class.

Ivanov et al. (2021), "Data Movement Is All You Need" (MLSys), profiled a BERT encoder layer and
grouped its operators into classes: tensor contractions did 99.8 % of the FLOPs but took only
61 % of the runtime; statistical normalizations (softmax, layer norm) and element-wise
operators, 0.2 % of the FLOPs, took the rest, because they move bytes and do almost no
arithmetic. This module rebuilds that table for any training step:

* :func:`classify_op` puts an ATen operator into one of :data:`CLASSES`;
  :func:`classify_kernel` does the same for a GPU kernel name (cuBLAS, FlashAttention, ATen's
  own kernels, and Inductor's Triton kernels, whose names list the operators they fuse:
  ``triton_per_fused_add_native_layer_norm_3`` is a layer norm with a residual add folded in).
* :func:`count_by_class` runs a step under a ``TorchDispatchMode`` and sums, per class, the
  FLOPs (``torch.utils.flop_counter`` for contractions, one per output element for elementwise
  operators, five per element for normalizations and softmax, fourteen per parameter for a
  fused Adam update) and the minimum bytes an unfused operator moves (each distinct input read
  once, each output written once; views move nothing), as :mod:`perflab.profiling.trace` counts them.
* :func:`time_by_class` profiles the step with ``torch.profiler`` and sums kernel time per
  class on a GPU (kernel name first, the launching operator when the name says nothing), or
  operator self time on a CPU.
* :func:`shares` turns any of these into fractions that sum to 1.

Times are seconds, FLOPs and bytes plain counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable
import torch
from perflab.core.validate import number
from perflab.machine.costs import (  # the cost model's count and operator tables
    NORM_FLOPS_PER_ELEMENT, _POINTWISE, _operator_bytes)
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count
from torch.utils._pytree import tree_flatten

__all__ = ["CLASSES", "PAPER_BERT", "StepBreakdown", "classify_kernel", "classify_op",
           "classify_triton", "count_by_class", "shares", "time_by_class", "training_step"]

CONTRACTION = "tensor contraction"
NORMALIZATION = "normalization"
ELEMENTWISE = "elementwise/activation"
SOFTMAX = "softmax/attention"
OPTIMIZER = "optimizer"
OTHER = "other"

#: The operator classes, in table order.
CLASSES: tuple[str, ...] = (CONTRACTION, NORMALIZATION, ELEMENTWISE, SOFTMAX, OPTIMIZER, OTHER)

#: Ivanov et al. (2021), table of a BERT encoder layer in PyTorch: (% of FLOPs, % of runtime)
#: per class. Their "statistical normalization" (softmax and layer norm together) is given under
#: normalization here; they report no optimizer or byte shares, hence None.
PAPER_BERT: dict[str, tuple[float | None, float | None]] = {
    CONTRACTION: (99.80, 61.0),
    NORMALIZATION: (0.17, 25.5),
    ELEMENTWISE: (0.03, 13.5),
    SOFTMAX: (None, None),
    OPTIMIZER: (None, None),
    OTHER: (None, None),
}

_CONTRACTION_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot",
                    "convolution", "convolution_backward", "_convolution", "cudnn_convolution",
                    "scaled_dot_product_attention", "_flash_attention_forward",
                    "_flash_attention_backward", "_efficient_attention_forward",
                    "_efficient_attention_backward"}
_NORMALIZATION_OPS = {"layer_norm", "native_layer_norm", "native_layer_norm_backward",
                      "group_norm", "native_group_norm", "native_group_norm_backward",
                      "batch_norm", "native_batch_norm", "native_batch_norm_backward",
                      "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                      "rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward"}
_SOFTMAX_OPS = {"softmax", "_softmax", "_softmax_backward_data", "log_softmax", "_log_softmax",
                "_log_softmax_backward_data", "cross_entropy_loss", "nll_loss",
                "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
                "nll_loss2d_backward", "_safe_softmax"}
_ELEMENTWISE_EXTRA = {"gelu_backward", "dropout", "native_dropout", "native_dropout_backward",
                      "silu_backward", "sigmoid_backward", "tanh_backward", "erf", "hardtanh",
                      "leaky_relu", "mish", "elu", "softplus", "masked_fill", "masked_fill_"}


def _base(name: str) -> str:
    """``"aten::add_.Tensor"`` -> ``"add_"``."""
    return name.split("::")[-1].split(".")[0]


def classify_op(name: str) -> str:
    """The class (one of :data:`CLASSES`) of an ATen operator, by name.

    Accepts ``"aten::addmm"``, ``"addmm"`` or ``"aten.addmm.default"`` spellings. Fused
    attention (``_scaled_dot_product_*``, ``_flash_attention_*``) counts as a tensor contraction,
    as Ivanov et al. count the attention's two batched products: FlashAttention keeps the softmax
    inside the contraction kernel, so there is no separate softmax to class. ``_foreach_*`` and
    ``_fused_adam*``/``_fused_sgd`` are optimizer updates; copies, casts, reductions, embedding
    look-ups and allocations are "other".

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    base = name.split("::")[-1]
    if base.startswith("aten."):
        base = base[len("aten."):]
    base = base.split(".")[0]
    if base in _CONTRACTION_OPS or base.startswith("_scaled_dot_product"):
        return CONTRACTION
    if base in _NORMALIZATION_OPS:
        return NORMALIZATION
    if base in _SOFTMAX_OPS:
        return SOFTMAX
    if base.startswith(("_foreach_", "_fused_adam", "_fused_sgd", "_fused_adagrad")):
        return OPTIMIZER
    if base in _POINTWISE or base in _ELEMENTWISE_EXTRA:
        return ELEMENTWISE
    return OTHER


_TRITON = re.compile(r"^triton_(?P<kind>[a-z]+)_(?P<ops>.*?)(?:_\d+)*$")
_MOVE_WORDS = {"fused", "to", "copy", "clone", "view", "permute", "transpose", "t", "unsqueeze",
               "squeeze", "expand", "slice", "cat", "select", "split", "reshape", "alias", "zeros",
               "ones", "full", "fill", "new", "empty", "like", "embedding", "dense", "sum",
               "mean", "amax", "max", "scatter", "gather", "index", "put", "constant", "pad",
               "as", "strided", "arange", "lift", "detach", "clamp", "scalar", "tensor", ""}


def classify_triton(name: str) -> str:
    """The class of an Inductor-generated Triton kernel, from the operators its name lists.

    Inductor names a kernel ``triton_<kind>_fused_<op>_<op>..._<n>`` (kind ``poi`` pointwise,
    ``red``/``per`` reduction, ``tem`` template such as a matrix product). The rules, first match
    wins: a template or an ``mm``/``bmm``/``addmm``/``convolution`` op -> tensor contraction; a
    ``*_norm`` op -> normalization; softmax or log-softmax -> softmax/attention; any arithmetic
    op (add, mul, gelu, tanh, pow, ...) -> elementwise; only copies, casts, views or plain
    reductions -> other. A fused kernel is one kernel, so it lands in one class: a residual add
    fused into the next layer norm counts as normalization.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is not an Inductor Triton kernel name (does not start ``triton_``).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    m = _TRITON.match(name)
    if not m:
        raise ValueError(f"name must be an Inductor Triton kernel name (triton_...), got {name!r}")
    kind, ops = m.group("kind"), m.group("ops")
    words = ops.split("_")
    if kind == "tem" or {"mm", "bmm", "addmm", "baddbmm", "convolution"} & set(words):
        return CONTRACTION
    if "norm" in words:
        return NORMALIZATION
    if "softmax" in words or "logsumexp" in words:
        return SOFTMAX
    if "adam" in words or "adamw" in words or "foreach" in words:
        return OPTIMIZER
    if any(w not in _MOVE_WORDS for w in words):
        return ELEMENTWISE
    return OTHER


# Substrings of GPU kernel names (lower case), checked in this order; first match wins.
_KERNEL_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (OPTIMIZER, ("adam", "multi_tensor_apply", "sgd")),
    (CONTRACTION, ("gemm", "gemv", "nvjet", "cutlass", "xmma", "wgmma", "splitkreduce", "cublas",
                   "flash", "fmha", "sdpa", "attention", "dot_kernel", "conv")),
    (NORMALIZATION, ("layer_norm", "layernorm", "gammabeta", "rms_norm", "rmsnorm", "batch_norm",
                     "batchnorm", "group_norm", "groupnorm")),
    (SOFTMAX, ("softmax", "nll_loss", "cross_entropy")),
    (OTHER, ("copy", "fill", "reduce_kernel", "cat_", "index", "embedding", "gather", "scatter",
             "memset", "memcpy")),
    (ELEMENTWISE, ("elementwise", "gelu", "tanh", "relu", "silu", "sigmoid", "dropout", "add",
                   "mul", "functor")),
)


def classify_kernel(name: str) -> str | None:
    """The class of a GPU kernel from its name, or None when the name does not say.

    Inductor kernels (``triton_...``) go through :func:`classify_triton`; others are matched by
    substrings (``gemm``/``nvjet``/``cutlass`` and ``flash``/``fmha`` are contractions,
    ``layer_norm``/``GammaBeta`` normalization, ``softmax`` softmax, ``multi_tensor_apply`` and
    ``adam`` optimizer, ``copy``/``fill``/``reduce_kernel`` other, remaining
    ``elementwise_kernel`` instances elementwise). Callers fall back to the launching operator
    (:func:`classify_op`) for None.

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if _TRITON.match(name):
        return classify_triton(name)
    low = name.lower()
    for cls, subs in _KERNEL_PATTERNS:
        if any(s in low for s in subs):
            return cls
    return None


def shares(values: dict[str, float]) -> dict[str, float]:
    """Each class's fraction of the total, in :data:`CLASSES` order (missing classes get 0).

    Raises:
        ValueError: an unknown class, a negative value, or a total of 0.
    """
    for k, v in values.items():
        if k not in CLASSES:
            raise ValueError(f"unknown class {k!r}; classes are {CLASSES}")
        number(f"the value of {k}", v, minimum=0)
    total = float(sum(values.values()))
    if total <= 0:
        raise ValueError("values sum to 0: nothing was counted")
    return {c: float(values.get(c, 0.0)) / total for c in CLASSES}


# FLOPs per element that the counters below assign beyond torch.utils.flop_counter's
_NORM_FLOPS_PER_ELEMENT = NORM_FLOPS_PER_ELEMENT   # the course's one count (perflab.machine.costs)
_ADAM_FLOPS_PER_PARAM = 14      # two moment updates (7), the bias-corrected step (6), decay (1)


def _tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _bytes(func, args, kwargs, out) -> int:
    """Minimum bytes of one operator (perflab.profiling.trace's rule), plus the writes of in-place
    list operators (``_foreach_*_``, ``_fused_adamw_``) that return nothing."""
    n = _operator_bytes(func, args, kwargs, out)
    if not _tensors(out):
        for arg, value in zip(func._schema.arguments, args):
            if arg.alias_info is not None and arg.alias_info.is_write:
                n += sum(t.numel() * t.element_size() for t in _tensors(value) if t.numel() > 1)
    return n


def _extra_flops(base: str, cls: str, args, out) -> float:
    """FLOPs that torch.utils.flop_counter does not count, by the module's conventions."""
    outs = _tensors(out)
    if cls == ELEMENTWISE and base in _POINTWISE | _ELEMENTWISE_EXTRA and outs:
        return float(outs[0].numel())
    if cls in (NORMALIZATION, SOFTMAX) and args and isinstance(args[0], torch.Tensor):
        return float(_NORM_FLOPS_PER_ELEMENT * args[0].numel())
    if cls == OPTIMIZER and base.startswith("_fused_adam") and args:
        return float(_ADAM_FLOPS_PER_PARAM * sum(t.numel() for t in _tensors(args[0])))
    if cls == OPTIMIZER and base.startswith("_foreach_"):
        written = _tensors(out) or _tensors(args[0] if args else [])
        return float(sum(t.numel() for t in written))
    return 0.0


def _sdpa_cpu_flops(base: str, args) -> float:
    """FLOPs of the CPU flash-attention operators, which torch.utils.flop_counter does not
    register (the same formula it uses for the CUDA ones)."""

    shapes = [tuple(a.shape) for a in args[:4] if isinstance(a, torch.Tensor)]
    if base.endswith("_backward") and len(shapes) >= 4:
        return float(sdpa_backward_flop_count(*shapes[:4]))
    if len(shapes) >= 3:
        return float(sdpa_flop_count(*shapes[:3]))
    return 0.0


@dataclass(frozen=True)
class StepBreakdown:
    """FLOPs and bytes of one step per class (plain counts), and the operators seen per class.

    Attributes:
        flops, bytes: class -> total, every class of :data:`CLASSES` present (0 when unused).
        ops: class -> sorted ATen operator names counted in it.
    """

    flops: dict[str, float]
    bytes: dict[str, float]
    ops: dict[str, list[str]]


def count_by_class(fn: Callable, *args, optimizer_step: Callable | None = None,
                   **kwargs) -> StepBreakdown:
    """Run ``fn(*args, **kwargs)`` (then ``optimizer_step()`` if given) and count per class.

    Every ATen operator is seen by a ``TorchDispatchMode``; its FLOPs are what
    ``torch.utils.flop_counter.FlopCounterMode`` adds while it runs (matrix products
    ``2 m n k``, fused attention its two products forward and five backward) plus the module's
    conventions for the rest (see the module docstring); its bytes are the minimum traffic of an
    unfused operator. Operators run by ``optimizer_step`` count as optimizer whatever their name
    (a non-fused optimizer is a loop of ordinary ``mul_``/``add_`` calls).

    Returns:
        StepBreakdown.

    Raises:
        TypeError: ``fn`` or ``optimizer_step`` is not callable.
    """

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if optimizer_step is not None and not callable(optimizer_step):
        raise TypeError(f"optimizer_step must be callable, got {type(optimizer_step).__name__}")
    flops = {c: 0.0 for c in CLASSES}
    nbytes = {c: 0.0 for c in CLASSES}
    ops: dict[str, set] = {c: set() for c in CLASSES}
    flop_mode = FlopCounterMode(display=False)
    state = {"optimizer": False}

    class _PerClass(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            before = flop_mode.get_total_flops()
            out = func(*args, **kwargs)
            counted = float(flop_mode.get_total_flops() - before)
            base = func._schema.name.split("::")[-1]
            cls = OPTIMIZER if state["optimizer"] else classify_op(base)
            if counted == 0 and "scaled_dot_product" in base and "for_cpu" in base:
                counted = _sdpa_cpu_flops(base, args)
            flops[cls] += counted + _extra_flops(base, classify_op(base), args, out)
            nbytes[cls] += _bytes(func, args, kwargs, out)
            ops[cls].add(base)
            return out

    with flop_mode, _PerClass():
        fn(*args, **kwargs)
        if optimizer_step is not None:
            state["optimizer"] = True
            optimizer_step()
    return StepBreakdown(flops, nbytes, {c: sorted(v) for c, v in ops.items()})


def _is_kernel(e) -> bool:
    return (e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset", "[memory]")))


def _op_class(e) -> str:
    """Class of a CPU profiler event from its operator chain: optimizer if inside an
    ``Optimizer.step`` range, else the innermost ATen operator with a class other than
    "other"."""
    chain = []
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    if any(n.startswith("Optimizer.step") for n in chain):
        return OPTIMIZER
    for n in chain:
        if n.startswith("aten::"):
            cls = classify_op(n)
            if cls != OTHER:
                return cls
    return OTHER


def _add(seconds, record, cls, name, s, steps):
    seconds[cls] += s
    if record is not None:
        names = record.setdefault(cls, {})
        names[name] = names.get(name, 0.0) + s / steps


def time_by_class(step: Callable[[], object], steps: int = 3, warmup: int = 2,
                  record: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Seconds per step spent in each class, from ``torch.profiler``.

    ``step()`` runs ``warmup`` times, then ``steps`` times under the profiler. On a GPU (CUDA
    available) the result sums device kernel durations (memcpy/memset excluded), each kernel
    classed by :func:`classify_kernel`, falling back to its launching operator's chain when the
    name does not say; on a CPU it sums each ATen operator's self CPU time, classed by the
    operator chain (code outside any ATen operator, such as a compiled C++ kernel, is not
    counted).

    Args:
        step: one training step, called with no arguments.
        steps, warmup: profiled steps (>= 1) and unprofiled ones before them (>= 0).
        record: if given, filled with class -> {kernel or operator name: seconds per step},
            to show what went where.

    Returns:
        class -> seconds per step, every class of :data:`CLASSES` present.

    Raises:
        TypeError: ``step`` is not callable.
        ValueError: ``steps`` < 1 or ``warmup`` < 0.
        RuntimeError: the profiler recorded no time.
    """

    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    number("steps", steps, minimum=1)
    number("warmup", warmup, minimum=0)
    gpu = torch.cuda.is_available()
    for _ in range(warmup):
        step()
    if gpu:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if gpu:
            torch.cuda.synchronize()
    events = prof.events()
    seconds = {c: 0.0 for c in CLASSES}
    if gpu:
        by_id = {e.id: e for e in events if e.device_type == torch.autograd.DeviceType.CPU}
        for e in events:
            if not _is_kernel(e):
                continue
            cls = classify_kernel(e.name)
            if cls is None:
                launcher = by_id.get(getattr(e, "linked_correlation_id", None))
                cls = _op_class(launcher) if launcher is not None else OTHER
            _add(seconds, record, cls, e.name, (e.time_range.end - e.time_range.start) * 1e-6,
                 steps)
    else:
        for e in events:
            if e.name.startswith("aten::") and e.device_type == torch.autograd.DeviceType.CPU:
                _add(seconds, record, _op_class(e), e.name, e.self_cpu_time_total * 1e-6, steps)
    if sum(seconds.values()) <= 0:
        raise RuntimeError("the profiler recorded no kernel or operator time for step")
    return {c: s / steps for c, s in seconds.items()}


def training_step(model: torch.nn.Module, inputs: torch.Tensor, optimizer: torch.optim.Optimizer,
                  dtype: torch.dtype | None = torch.bfloat16) -> tuple[Callable, Callable]:
    """A training step on a stack of blocks, split so the optimizer can be counted apart.

    ``forward_backward()`` runs ``model(inputs)`` under autocast to ``dtype`` (None: no
    autocast), takes the mean square of the output in float32 as the loss (a stand-in for a
    task loss: one elementwise operator and one reduction) and back-propagates.
    ``optimizer_step()`` applies and clears the gradients.

    Args:
        model: maps ``inputs`` to a tensor (e.g. a ``torch.nn.Sequential`` of GPT-2 blocks).
        inputs: its input, e.g. activations ``(B, T, d)``.
        optimizer: over ``model``'s parameters.
        dtype: autocast dtype (bf16 by default), or None.

    Returns:
        ``(forward_backward, optimizer_step)``; call both for one full step.

    Raises:
        TypeError: ``inputs`` is not a tensor.
    """
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a tensor, got {type(inputs).__name__}")
    device_type = inputs.device.type

    def forward_backward():
        with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(inputs)
        loss = out.float().square().mean()
        loss.backward()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return forward_backward, optimizer_step
