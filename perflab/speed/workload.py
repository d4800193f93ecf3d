"""Chapter 6's workload: a small image-classification task built in memory, and its model.

:func:`synthetic_images` makes a labelled image set with learnable structure (chapter 5 builds real
loaders; this chapter needs only a fixed stream of batches so that every optimization sees the
same data); :func:`normalize` turns its ``uint8`` images into normalized ``float32`` on any device
(the same function on the CPU and on the GPU); :class:`SmallCNN` is the model the speed ladder
trains. Images are ``uint8`` in ``[0, 255]``, shape ``(N, 3, H, W)``. :func:`fused_on_gpu` is
the one choice of Adam's and AdamW's implementation by device that the chapters' steps share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from perflab.core.validate import number

__all__ = ["MEAN", "STD", "synthetic_images", "normalize", "SmallCNN", "fused_on_gpu"]


#: per-channel mean and standard deviation of :func:`synthetic_images` (in [0, 1] units)
MEAN = (0.5, 0.5, 0.5)


STD = (0.25, 0.25, 0.25)


def synthetic_images(n: int, classes: int = 10, size: int = 32, noise: float = 60.0,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A CIFAR-like labelled image set with learnable structure, built in memory.

    Each class has a smooth random template (a 4 x 4 pattern per channel, upsampled); an image
    is ``128 + 50 * template[label] + noise * N(0, 1)``, rounded and clipped to ``uint8``. A
    small CNN learns it within a few hundred steps, but the noise keeps the loss well above 0.

    Returns:
        ``(images, labels)``: ``uint8`` of shape ``(n, 3, size, size)`` and ``int64`` of shape
        ``(n,)``, both on the CPU.

    Raises:
        ValueError: ``n``, ``classes`` or ``size`` < 1 (``size`` < 4), or negative ``noise``.
    """
    number("n", n, minimum=1)
    number("classes", classes, minimum=2)
    number("size", size, minimum=4)           # pixels
    number("noise", noise, minimum=0)
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 3, 4, 4, generator=g)
    templates = F.interpolate(templates, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.randint(0, classes, (n,), generator=g)
    images = 128 + 50 * templates[labels] + noise * torch.randn(n, 3, size, size, generator=g)
    return images.round().clamp(0, 255).to(torch.uint8), labels


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``uint8`` images to normalized ``float32``: ``(x / 255 - MEAN) / STD``, on their device.

    The same function runs on the CPU (the naive loader's work) and on the GPU (after a
    ``uint8`` copy), so both paths compute the same numbers. The mean and standard deviation
    tensors are made once per device, so the function can be captured in a CUDA graph.

    Raises:
        ValueError: ``images`` is not a 4-D tensor with 3 channels.
    """
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape (N, 3, H, W), got {tuple(images.shape)}")
    mean, std = _stats(images.device)
    return (images.float() / 255 - mean) / std


_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _stats(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # made once per device: a CPU-to-GPU copy may not run while a CUDA graph is being captured
    if dev not in _STATS:
        _STATS[dev] = (torch.tensor(MEAN, device=dev).view(1, 3, 1, 1),
                       torch.tensor(STD, device=dev).view(1, 3, 1, 1))
    return _STATS[dev]


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks (the last two with stride 2), global average pool, a linear head.

    Input ``(N, 3, H, W)`` float32; output ``(N, classes)`` logits. Channels ``width``,
    ``2 * width``, ``4 * width``; 11 parameter tensors, so an optimizer step that loops over
    parameters launches a few kernels per tensor.
    """

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        number("width", width, minimum=1)
        number("classes", classes, minimum=2)
        chans = (3, width, 2 * width, 4 * width)
        layers: list[nn.Module] = []
        for i in range(3):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, stride=1 if i == 0 else 2,
                                 padding=1, bias=False),
                       nn.BatchNorm2d(chans[i + 1]), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(chans[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def fused_on_gpu(device: torch.device | str) -> bool | None:
    """The ``fused=`` argument of ``torch.optim.Adam`` / ``AdamW`` for a step on ``device``: True
    on a CUDA device (the whole update in one kernel per parameter group, chapter 6's fused
    optimizer step), None elsewhere (PyTorch's own choice: on a CPU, the for-loop step over the
    parameters).

    Pass it as ``torch.optim.AdamW(params, lr=..., fused=fused_on_gpu(dev))``. On a CPU, None
    and False give the same step (torch picks ``foreach`` only for tensors on an accelerator, and
    fuses only when asked), so pages that once wrote ``fused=cuda`` step exactly as before.

    Raises:
        RuntimeError: ``device`` is not a device string torch knows.
    """
    return True if torch.device(device).type == "cuda" else None
