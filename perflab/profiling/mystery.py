"""Lab 4's three mystery training steps: one compute-bound, one bandwidth-bound, one overhead-bound.

Each of :func:`step_a`, :func:`step_b` and :func:`step_c` builds a small model, its data and an
optimizer, and returns a :class:`MysteryStep` whose call runs one training step (forward,
backward, optimizer update). One is compute-bound, one bandwidth-bound and one overhead-bound, on
a GPU and on a CPU alike (sizes come from :func:`perflab.core.device.pick`); which is which is for the
student to find out by measuring. Reading the code is allowed (it is the *prediction*); the check
wants the measurement.

:func:`perflab.labs.lab04.check_diagnosis` verifies a diagnosis: the regime named, and the
evidence behind it (the step's FLOPs and bytes, its time, the ceilings, the busy fraction)
against its own measurement.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from perflab.core.device import device as default_device, pick
from perflab.profiling.trace import REGIMES, regime  # a diagnosis names one of regime()'s verdicts

__all__ = ["MysteryStep", "REGIMES", "step_a", "step_b", "step_c"]

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

    Sizes: 24 layers of width 32, batch 32 on a GPU; width 16, batch 16 on a CPU, where
    width 32 moved ~13 % of the copy bandwidth at rest and up to ~25 % when other work
    slowed the DRAM copy more than these cache-resident operators (a regime's edge); momentum
    SGD with one update per parameter tensor (``foreach=False``).

    Raises:
        ValueError: ``device`` names a GPU the machine does not have.
    """
    dev = _device(device)
    torch.manual_seed(seed)
    width, depth, batch = pick(cpu=(16, 24, 16), gpu=(32, 24, 32))
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
