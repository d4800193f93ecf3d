"""Lab 4's three mystery training steps, and the check of a student's diagnosis.

Each of :func:`step_a`, :func:`step_b` and :func:`step_c` builds a small model, its data and an
optimizer, and returns a :class:`MysteryStep` whose call runs one training step (forward,
backward, optimizer update). One is compute-bound, one bandwidth-bound and one overhead-bound, on
a GPU and on a CPU alike (sizes come from :func:`perflab.hardware.pick`); which is which is for the
student to find out by measuring. Reading the code is allowed (it is the *prediction*); the check
wants the measurement.

:func:`check_diagnosis` verifies a diagnosis: the regime named, and the evidence behind it (the
step's FLOPs and bytes, its time, the ceilings, the busy fraction) against its own measurement.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .costs import count_cost
from .exercises import ExerciseFailed
from .hardware import device as default_device, pick
from .profiling import REGIMES, regime  # a diagnosis names one of regime()'s verdicts
from .timing import benchmark

__all__ = ["REGIMES", "MysteryStep", "check_diagnosis", "step_a", "step_b", "step_c"]

# sha256 of "<step name>:<regime>" for the right answers, so the answer is not in plain sight.
_ANSWERS = {
    "a": "ab86151688d70328704cb44d790d982d80b87aa7bd65d3eb89984de7818ddbc6",
    "b": "f4bd6f0367a6f5fd8042c1c38ee88a6b6b60302dd62dfb237a1cafa9b9a068b5",
    "c": "7e8f216f54df0347a2b42b23270a39111f0db78bd2cf6d25b7cf57c94dfa0e3c",
}


def _digest(name: str, regime: str) -> str:
    return hashlib.sha256(f"perflab-lab4:{name}:{regime}".encode()).hexdigest()


@dataclass
class MysteryStep:
    """One training step to diagnose; call it to run the step once.

    Attributes:
        name: ``"a"``, ``"b"`` or ``"c"``.
        device: where it runs.
        dtype: the dtype of its parameters and activations (the compute ceiling to compare with
            is the matrix-multiply rate of this dtype).
        model: the ``torch.nn.Module`` it trains.
        inputs: the input batch (a tensor).
    """

    name: str
    device: torch.device
    dtype: torch.dtype
    model: torch.nn.Module
    inputs: torch.Tensor
    _step: Callable[[], torch.Tensor] = field(repr=False, default=None)

    def __call__(self) -> torch.Tensor:
        """Run one training step; returns the loss (a 0-d tensor, not synchronized)."""
        return self._step()


def _device(device) -> torch.device:
    return torch.device(device) if device is not None else default_device()


def _train_step(model, inputs, optimizer):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(inputs).float().square().mean()
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


class _Affine(torch.nn.Module):
    """Per-feature scale and shift followed by GELU, then a residual: all elementwise."""

    def __init__(self, features: int):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(features))
        self.shift = torch.nn.Parameter(torch.zeros(features))

    def forward(self, x):
        return x + torch.nn.functional.gelu(x * self.scale + self.shift)


def step_a(device: torch.device | str | None = None, seed: int = 0) -> MysteryStep:
    """Mystery step A: a stack of per-feature affine + GELU blocks on a large activation.

    Sizes: GPU 32768 x 4096 float32 activations (512 MiB); CPU 512 x 4096 (8 MiB).

    Raises:
        ValueError: ``device`` names a GPU the machine does not have.
    """
    dev = _device(device)
    torch.manual_seed(seed)
    rows = pick(cpu=512, gpu=32768)
    features = 4096
    model = torch.nn.Sequential(*[_Affine(features) for _ in range(3)]).to(dev)
    x = torch.randn(rows, features, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return MysteryStep("a", dev, torch.float32, model, x, _train_step(model, x, opt))


def step_b(device: torch.device | str | None = None, seed: int = 0) -> MysteryStep:
    """Mystery step B: a deep, narrow multilayer perceptron on a small batch.

    Sizes: 24 layers of width 32, batch 32 (GPU and CPU), momentum SGD with one update per
    parameter tensor (``foreach=False``).

    Raises:
        ValueError: ``device`` names a GPU the machine does not have.
    """
    dev = _device(device)
    torch.manual_seed(seed)
    width, depth, batch = 32, 24, 32
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).to(dev)
    x = torch.randn(batch, width, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=False)
    return MysteryStep("b", dev, torch.float32, model, x, _train_step(model, x, opt))


def step_c(device: torch.device | str | None = None, seed: int = 0) -> MysteryStep:
    """Mystery step C: a wide multilayer perceptron on a large batch.

    Sizes: GPU 4 layers of 4096 x 4096 in bfloat16, batch 8192; CPU 3 layers of 512 x 512 in
    float32, batch 1024.

    Raises:
        ValueError: ``device`` names a GPU the machine does not have.
    """
    dev = _device(device)
    torch.manual_seed(seed)
    width, depth, batch = pick(cpu=(512, 3, 1024), gpu=(4096, 4, 8192))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, bias=False), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev, dtype)
    x = torch.randn(batch, width, device=dev, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return MysteryStep("c", dev, dtype, model, x, _train_step(model, x, opt))


_EVIDENCE_KEYS = ("seconds", "flops", "bytes", "flops_ceiling", "bandwidth_ceiling", "busy_fraction")


def _finite(name: str, evidence: dict, key: str) -> float:
    value = evidence.get(key)
    if value is None or value is Ellipsis:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] has no value yet.")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] must be a number, got {value!r}.") from None
    if not math.isfinite(v) or v < 0:
        raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] = {v} is not a finite, non-negative number.")
    return v


def check_diagnosis(step: MysteryStep, answer: Any, evidence: dict, time_tolerance: float | None = None) -> bool:
    """Check a diagnosis of a mystery step: the regime and the evidence for it.

    ``evidence`` holds what the student measured in this run:

    * ``seconds``: median time of one step (s);
    * ``flops`` and ``bytes``: the step's FLOPs and minimum bytes
      (:func:`perflab.profiling.count_cost`);
    * ``flops_ceiling`` (FLOP/s, the matrix-multiply rate of ``step.dtype``) and
      ``bandwidth_ceiling`` (bytes/s, the copy bandwidth), measured on this machine;
    * ``busy_fraction``: the share of the step's wall time in which kernels ran (on a CPU: ATen
      operators), from a profiler trace (:func:`perflab.profiling.summarize_trace`).

    The check recounts FLOPs and bytes (they must match within 1 %), re-times the step (the
    student's time must be within ``time_tolerance`` x of it either way; default 5 on a GPU,
    where a timer that does not wait for the kernels is off by far more, and 20 on a CPU, which
    has no queue to forget and whose timings on a shared machine scatter widely), requires the achieved fractions to stay below 2 x the ceilings (a
    ceiling measured wrongly shows up as an impossible fraction), requires ``answer`` to follow
    from the evidence by :func:`perflab.profiling.regime`, and finally compares it with the right
    answer.

    Returns True (after printing one sentence) when all hold.

    Raises:
        ExerciseFailed: the first thing that does not hold, in one sentence.
        TypeError: ``step`` is not a MysteryStep or ``evidence`` not a dict.
        ValueError: ``time_tolerance`` < 1.
    """
    if not isinstance(step, MysteryStep):
        raise TypeError(f"step must be a MysteryStep (from step_a/step_b/step_c), got {type(step).__name__}")
    if not isinstance(evidence, dict):
        raise TypeError(f"evidence must be a dict, got {type(evidence).__name__}")
    name = step.name
    if answer not in REGIMES:
        raise ExerciseFailed(f"✗ step {name}: the answer must be one of {list(REGIMES)}, got {answer!r}.")
    missing = [k for k in _EVIDENCE_KEYS if k not in evidence]
    if missing:
        raise ExerciseFailed(f"✗ step {name}: evidence lacks {missing}.")
    ev = {k: _finite(name, evidence, k) for k in _EVIDENCE_KEYS}
    if ev["seconds"] <= 0 or ev["flops_ceiling"] <= 0 or ev["bandwidth_ceiling"] <= 0:
        raise ExerciseFailed(f"✗ step {name}: seconds and both ceilings must be positive.")
    if ev["busy_fraction"] > 1:
        raise ExerciseFailed(f"✗ step {name}: busy_fraction is a share of wall time, at most 1; got {ev['busy_fraction']:.3g}.")
    step()  # not the first step: the optimizer's state (momentum buffers) exists, as in a real run
    cost = count_cost(step)
    for key, true in (("flops", cost.flops), ("bytes", cost.bytes)):
        if not math.isclose(ev[key], true, rel_tol=0.01):
            raise ExerciseFailed(f"✗ step {name}: evidence[{key!r}] = {ev[key]:.4g} but the step does {true:.4g} "
                                 f"(count it with perflab.profiling.count_cost(step)).")
    if time_tolerance is None:
        time_tolerance = 5.0 if step.device.type == "cuda" else 20.0
    if time_tolerance < 1:
        raise ValueError(f"time_tolerance must be >= 1, got {time_tolerance}")
    seconds = benchmark(step, step.device, min_run_time_s=0.2)
    ratio = ev["seconds"] / seconds
    if not 1 / time_tolerance <= ratio <= time_tolerance:
        raise ExerciseFailed(f"✗ step {name}: your step time {ev['seconds'] * 1e3:.3g} ms is {ratio:.2g}x the "
                             f"check's {seconds * 1e3:.3g} ms: time it with warm-up and synchronization.")
    flops_fraction = ev["flops"] / ev["seconds"] / ev["flops_ceiling"]
    bandwidth_fraction = ev["bytes"] / ev["seconds"] / ev["bandwidth_ceiling"]
    for label, frac in (("FLOP/s", flops_fraction), ("bandwidth", bandwidth_fraction)):
        if frac > 2.0:
            raise ExerciseFailed(f"✗ step {name}: achieved {label} is {frac:.2g}x its ceiling, which is impossible: "
                                 f"re-measure the ceiling (right dtype, large enough sizes).")
    busy = ev["busy_fraction"] if step.device.type == "cuda" else None
    implied = regime(flops_fraction, bandwidth_fraction, busy)
    if answer != implied:
        raise ExerciseFailed(f"✗ step {name}: your evidence ({flops_fraction:.1%} of the compute ceiling, "
                             f"{bandwidth_fraction:.1%} of the bandwidth, busy {ev['busy_fraction']:.0%}) says "
                             f"{implied!r}, not {answer!r}.")
    if _digest(name, answer) != _ANSWERS[name]:
        raise ExerciseFailed(f"✗ step {name}: {answer!r} follows from your numbers but is not the right "
                             f"regime: check the ceilings and the counts.")
    print(f"✓ step {name} is {answer}: {flops_fraction:.1%} of the compute ceiling, "
          f"{bandwidth_fraction:.1%} of the copy bandwidth, busy {ev['busy_fraction']:.0%} of the step.")
    return True
