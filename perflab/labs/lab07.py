"""Lab 7's checks: static memory, a leaner step, a leak fixed, the largest allocation named.

Each raises :class:`~perflab.labs.exercises.ExerciseFailed` with one sentence saying what is wrong;
exercise 2's names the mistake its accumulated gradient shows.
"""

from __future__ import annotations

import gc
import math
import weakref
from typing import Any, Callable

import torch
from torch import nn

from perflab.labs.exercises import (ExerciseFailed, NotPlain, as_float, check_choice, check_close,
                                    check_true, not_done, plain)
from perflab.memory.allocator import freed_without_gc
from perflab.memory.measure import max_relative_difference, peak_bytes, state_bytes
from perflab.memory.model import BlockStackConfig
from perflab.memory.predict import block_tensor_bytes
from perflab.memory.snapshots import largest_allocation, name_allocation

__all__ = ["check_largest_allocation", "check_no_leak", "check_peak_cut", "check_static_prediction"]


def check_static_prediction(predicted: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                            device: torch.device | str, measured: int | None = None,
                            rtol: float = 0.05) -> bool:
    """Lab 7, exercise 1: ``predicted`` (bytes) within ``rtol`` of the static memory of a model
    after one Adam step.

    ``measured`` is the allocator's figure when the lab measured it on a GPU; otherwise (None) the
    bytes of parameters, gradients and optimizer state are counted with :func:`state_bytes`.

    Raises:
        ExerciseFailed: no answer, or one more than ``rtol`` away.
    """
    if predicted is None:
        raise not_done(1, "set predicted_static to your prediction in bytes")
    truth = measured if measured is not None else state_bytes(model, optimizer, device)["total"]
    return check_close(predicted, truth, "predicted static memory", rtol=rtol, unit="iB",
                       hint="parameters, gradients and Adam's two moments, each float32")


def _diagnose_gradients(baseline: nn.Module, lean: nn.Module) -> None:
    """Lab 7, exercise 2: name what is wrong with the lean step's accumulated gradients (left in
    ``.grad`` after the step) against the baseline's, when both are there: scaled by a factor
    (the micro-batch losses not divided by their number) or pointing elsewhere (cleared inside
    the loop: only the last micro-batch's). Silent when they agree or one side has none."""
    pairs = [(p.grad, q.grad) for p, q in zip(lean.parameters(), baseline.parameters())]
    if not pairs or any(g is None or h is None for g, h in pairs):
        return
    g = torch.cat([a.detach().double().flatten() for a, _ in pairs])
    h = torch.cat([b.detach().double().flatten() for _, b in pairs])
    dot, hh, gg = float(g @ h), float(h @ h), float(g @ g)
    if hh == 0 or gg == 0:
        return
    scale, cosine = dot / hh, dot / math.sqrt(gg * hh)
    if cosine > 0.999 and abs(scale - 1) > 0.01:
        raise ExerciseFailed(
            f"✗ lean_step's accumulated gradient is {scale:.3g} times the batch's: divide each "
            "micro-batch's loss by the number of micro-batches, so that their sum is the mean.")
    if cosine <= 0.999:
        raise ExerciseFailed(
            f"✗ lean_step's accumulated gradient points elsewhere than the batch's (cosine "
            f"{cosine:.3f}): clear the gradients once, before the micro-batch loop; cleared "
            "inside it, only the last micro-batch's gradient is left.")


def check_peak_cut(make_model: Callable[[], nn.Module], baseline_step: Callable, lean_step: Callable | None,
                   x: torch.Tensor, y: torch.Tensor, device: torch.device | str,
                   max_ratio: float = 0.6, loss_rtol: float = 1e-5, param_rtol: float = 1e-4) -> float:
    """Lab 7, exercise 2: ``lean_step`` trains exactly like ``baseline_step`` with at most
    ``max_ratio`` of its peak memory.

    Two identical models (``make_model()`` twice, so it must seed) with Adam; each does one
    warm-up step (the optimizer state then exists), then one measured step: ``baseline_step`` on
    one, ``lean_step`` on the other, each ``(model, optimizer, x, y) -> loss`` (a number or a
    one-element tensor; the lab passes chapter 7's :func:`perflab.memory.steps.train_step`). The peak
    is :func:`peak_bytes` above the step's start, both measured in this run. Passing needs the
    same loss (``loss_rtol``), the same parameters afterwards (``param_rtol``, relative to the
    largest parameter) and ``lean peak / baseline peak <= max_ratio``.

    Returns:
        the ratio of the two peaks.

    Raises:
        ExerciseFailed: not written yet, a different loss or update, or not enough memory saved.
    """
    if lean_step is None:
        raise not_done(2, "write lean_step")
    models, losses, peaks = [], [], []
    for step in (lean_step, baseline_step):               # the student's first: no baseline exists yet
        m = make_model().to(device)
        o = torch.optim.Adam(m.parameters(), lr=1e-3)
        baseline_step(m, o, x, y)                         # the same warm-up for both
        try:
            peak, loss = peak_bytes(lambda: step(m, o, x, y), device)
        except NotImplementedError:
            raise not_done(2, "lean_step still raises NotImplementedError") from None
        if step is lean_step:
            loss = as_float("lean_step's loss (return the batch's loss as a number)", loss)
        models.insert(0, m)
        losses.insert(0, loss)
        peaks.insert(0, peak.peak)
    _diagnose_gradients(models[0], models[1])
    base_loss, lean_loss = as_float("baseline_step's loss", losses[0]), losses[1]
    check_true(abs(lean_loss - base_loss) <= loss_rtol * abs(base_loss),
               f"lean_step's loss {lean_loss:.4f} equals the baseline's.",
               f"lean_step returns the loss {lean_loss:.4f}, the baseline {base_loss:.4f}: "
               "return the full batch's mean loss (the sum of the scaled micro-batch losses).")
    diff = max_relative_difference(models[1].parameters(), models[0].parameters())
    check_true(diff <= param_rtol,
               "after the step the parameters equal the baseline's.",
               f"after the step the parameters differ from the baseline's (by {diff:.2g} of the "
               "largest): the update is not the batch's; step the optimizer once, after all "
               "micro-batches, with the same optimizer.")
    ratio = peaks[1] / peaks[0] if peaks[0] else float("inf")
    check_true(ratio <= max_ratio,
               f"lean_step's peak is {ratio:.2f}x the baseline's (at most {max_ratio} required).",
               f"lean_step's peak is {ratio:.2f}x the baseline's; at most {max_ratio} is required.")
    return ratio


def check_no_leak(fixed_cls: type | None, leaky_cls: type, size: int, device: torch.device | str,
                  cycle_attribute: Any) -> bool:
    """Lab 7, exercise 3: name the attribute that closes the reference cycle of ``leaky_cls``, and
    write ``fixed_cls``, whose hook still works and whose buffer is freed without ``gc``.

    Both classes are built as ``cls(size)``; they hold ``.activations`` (a tensor) and
    ``.hooks["after_step"]`` (a callable that stores its argument in ``.activations``).

    Raises:
        ExerciseFailed: not done, the wrong attribute, a broken hook, or a buffer still leaking.
    """
    if fixed_cls is None or cycle_attribute is None:
        raise not_done(3, "set cycle_attribute and write FixedMonitor")
    try:
        cycle_attribute = plain(cycle_attribute)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ cycle_attribute must be an attribute's name, got {err}.") from None
    names = sorted(vars(leaky_cls(1)).keys())
    truth = _cycle_attribute(leaky_cls, names)
    check_choice(cycle_attribute, truth, "the attribute that closes the cycle", choices=names,
                 hint="which attribute leads, through other objects, back to the instance?")
    t = torch.ones(3, device=device)
    try:
        obj = fixed_cls(size)
    except NotImplementedError:
        raise not_done(3, "FixedMonitor still raises NotImplementedError") from None
    obj.hooks["after_step"](t)
    check_true(obj.activations is t, "FixedMonitor's hook still records its value.",
               "FixedMonitor.hooks['after_step'](value) must store value in .activations.")
    del obj
    return check_true(freed_without_gc(lambda: fixed_cls(size), lambda o: o.activations),
                      "FixedMonitor's buffer is freed as soon as the monitor is deleted.",
                      "FixedMonitor's buffer outlives the monitor until gc runs: a cycle remains.")


def _cycle_attribute(cls: type, names: list[str]) -> str:
    """The instance attribute whose removal lets reference counting free the instance."""
    for name in names:
        was = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            obj = cls(1)
            delattr(obj, name)
            ref = weakref.ref(obj)
            del obj
            freed = ref() is None
        finally:
            if was:
                gc.enable()
            gc.collect()
        if freed:
            return name
    raise ValueError(f"{cls.__name__} has no single attribute that closes a cycle")


def check_largest_allocation(snapshot: dict, cfg: BlockStackConfig, batch: int,
                             predicted_sizes: Any, largest_bytes: Any, largest_tensor: Any) -> bool:
    """Lab 7, exercise 4: the bytes of each of one block's tensors predicted from their shapes
    (``predicted_sizes``, ``{name: bytes}`` for the names of :func:`block_tensor_bytes`), the size
    of the snapshot's largest allocation, and which of those tensors it is.

    Raises:
        ExerciseFailed: not done, a wrong prediction, a wrong size or a wrong name.
    """
    if predicted_sizes is None or largest_bytes is None or largest_tensor is None:
        raise not_done(4, "set predicted_sizes, largest_bytes and largest_tensor")
    try:
        predicted_sizes, largest_tensor = plain(predicted_sizes), plain(largest_tensor)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ predicted_sizes and largest_tensor must be plain data, got {err}.") from None
    largest = as_float("the largest allocation's size (bytes)", largest_bytes)
    truth = block_tensor_bytes(cfg, batch)
    if not isinstance(predicted_sizes, dict) or set(predicted_sizes) != set(truth):
        raise ExerciseFailed(f"✗ predicted_sizes must map each of {sorted(truth)} to bytes.")
    for name in sorted(truth):
        # sizes in one format (KiB, MiB), never "1.049M" beside "2097152" (reader review M2)
        check_close(predicted_sizes[name], truth[name], f"predicted size of {name!r}",
                    rtol=0.0, unit="iB",
                    hint="elements from the shape, times 4 bytes per float32")
    big = largest_allocation(snapshot)
    check_close(int(largest), big["size"], "the largest allocation's size", rtol=0.0,
                unit="iB", hint="look at every 'alloc' event of snapshot['device_traces'][0]")
    return check_choice(largest_tensor, name_allocation(big["size"], truth),
                        "the tensor it holds", choices=sorted(truth),
                        hint="which of your predicted sizes is it?")
