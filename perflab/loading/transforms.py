"""Decoding and augmenting images: one image at a time on the CPU, a whole batch at once on the GPU.

* on the CPU, with Pillow: :func:`decode_resized` (decode and resize, optionally a reduced-size
  draft decode), :func:`decode_scaled` (libjpeg's DCT scaling), :func:`pil_pipeline` (the classic
  decode, random resized crop, flip, normalize), :func:`decode_pil`, :func:`decode_blur` and
  :func:`decode_augment`;
* batched, on any device: :func:`gpu_augment` (random resized crop, flip and normalize of a batch
  of equal-sized images with one ``grid_sample``), :func:`gpu_augment_list` (images of different
  sizes, gathered from one buffer), :class:`AugmentBatch` (the same as a ``collate_fn``);
* on the GPU: :func:`gpu_decode` (nvJPEG through ``torchvision.io.decode_jpeg``).

Images are ``uint8`` RGB; normalized outputs use :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`.
"""

from __future__ import annotations

import io
import math
import os
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from perflab.core.validate import one_of, positive_int

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "decode_resized", "decode_scaled", "pil_pipeline",
           "gpu_augment", "gpu_augment_list", "decode_blur", "AugmentBatch", "decode_pil",
           "gpu_decode", "decode_augment"]


# ImageNet channel statistics (RGB, on the 0-1 scale), the constants torchvision's models use.
IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


def decode_resized(data: bytes | str | os.PathLike, side: int, draft: bool = False) -> np.ndarray:
    """Decode one JPEG (bytes or path) and resize its shorter side to ``side``, centre-cropped to a
    square: a ``(side, side, 3)`` uint8 RGB array (Pillow, bilinear with antialiasing).

    ``draft=True`` asks libjpeg for a reduced-size decode first (Pillow's ``Image.draft``): the
    decoder scales by 1/2, 1/4 or 1/8 inside the inverse DCT, choosing the smallest scale that
    keeps the image at least ``side`` pixels on its shorter side, so fewer pixels are made and
    fewer resampled; the entropy decoding of the whole file remains.

    Raises:
        ValueError: ``side`` not a positive integer.
    """

    positive_int("side", side)
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    with Image.open(src) as im:
        if draft:
            w, h = im.size
            k = side / min(w, h)                      # the shorter side must stay >= side
            im.draft("RGB", (math.ceil(w * k), math.ceil(h * k)))
        w, h = im.size
        s = min(w, h)
        box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        return np.array(im.convert("RGB").resize((side, side), Image.BILINEAR, box=box))


def decode_scaled(data: bytes, scale: int) -> np.ndarray:
    """Decode JPEG bytes at ``1/scale`` of their size in libjpeg's inverse DCT (``scale`` 1, 2,
    4 or 8; Pillow's ``Image.draft``): an ``(H/scale, W/scale, 3)`` uint8 array, rounded up.

    Raises:
        ValueError: ``scale`` not 1, 2, 4 or 8.
    """

    one_of("scale", scale, (1, 2, 4, 8))     # libjpeg's DCT scales
    with Image.open(io.BytesIO(data)) as im:
        if scale > 1:
            w, h = im.size
            im.draft("RGB", (w // scale, h // scale))
        return np.asarray(im.convert("RGB"))


def pil_pipeline(data: bytes | str | os.PathLike, out: int, generator: torch.Generator | None = None,
                 scale: tuple[float, float] = (0.25, 1.0)) -> torch.Tensor:
    """The classic per-image CPU pipeline: decode, random resized crop, flip, normalize.

    The crop is a square covering a uniform draw from ``scale`` of the image's area (at most its
    shorter side), at a random place, resized to ``out`` x ``out`` (bilinear).

    Random numbers come from torch (``generator`` or the global stream), which DataLoader seeds
    differently in every worker and epoch. Returns a ``(3, out, out)`` float32 tensor normalized
    with :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`.
    """

    positive_int("out", out)
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    r = torch.rand(4, generator=generator).tolist()
    with Image.open(src) as im:
        w, h = im.size
        s = math.sqrt((scale[0] + r[0] * (scale[1] - scale[0])) * w * h)
        cw = ch = max(1, min(w, h, int(s)))
        x0, y0 = int(r[1] * (w - cw)), int(r[2] * (h - ch))
        im = im.convert("RGB").resize((out, out), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if r[3] < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std


def _crop_boxes(h: torch.Tensor, w: torch.Tensor, generator: torch.Generator | None,
                scale: tuple[float, float], flip: bool) -> tuple[torch.Tensor, ...]:
    """Random square crop boxes for images of heights ``h`` and widths ``w`` (float64 ``(B,)``
    on the CPU): ``(y0, x0, side, sign)``, ``sign`` -1 for a horizontal flip. One draw of
    ``torch.rand(B, 4)`` from ``generator``, so both augment functions crop alike."""
    b = h.shape[0]
    r = torch.rand(b, 4, generator=generator, dtype=torch.float64)
    s = torch.sqrt((scale[0] + r[:, 0] * (scale[1] - scale[0])) * h * w)
    side = torch.minimum(s, torch.minimum(h, w))  # square crops: the output is square
    y0, x0 = r[:, 1] * (h - side), r[:, 2] * (w - side)
    sign = torch.where(r[:, 3] < 0.5, -1.0, 1.0) if flip else torch.ones(b, dtype=torch.float64)
    return y0, x0, side, sign


def _normalize(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1) * 255
    return (x - mean) / std


def gpu_augment(batch: torch.Tensor, out: int, generator: torch.Generator | None = None,
                scale: tuple[float, float] = (0.25, 1.0), flip: bool = True) -> torch.Tensor:
    """Random resized crop + horizontal flip + normalize of a whole batch in a few kernels.

    ``batch``: uint8 ``(B, 3, H, W)`` on any device, images of one size. Each crop is a square
    covering ``scale`` of the image's area (at most its shorter side) at a random place. One
    affine grid per image (crop box, and a mirrored x axis for a flip) and one bilinear
    ``F.grid_sample`` do every crop and resize at once; the result is float32
    ``(B, 3, out, out)`` normalized with :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`. Random
    numbers come from ``generator`` (on the CPU) so the same seed gives the same crops on any
    device. For images of different sizes, :func:`gpu_augment_list`.

    Raises:
        ValueError: ``batch`` not a 4-d uint8 tensor with 3 channels.
    """
    if batch.dim() != 4 or batch.shape[1] != 3 or batch.dtype != torch.uint8:
        raise ValueError(f"batch must be uint8 (B, 3, H, W), got {batch.dtype} {tuple(batch.shape)}")
    positive_int("out", out)
    b, _, H, W = batch.shape
    dev = batch.device
    h = torch.full((b,), float(H), dtype=torch.float64)
    w = torch.full((b,), float(W), dtype=torch.float64)
    y0, x0, side, sign = _crop_boxes(h, w, generator, scale, flip)
    # crop box -> normalized [-1, 1] coordinates (align_corners=False)
    theta = torch.zeros(b, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = sign * side / W
    theta[:, 0, 2] = (2 * x0 + side) / W - 1
    theta[:, 1, 1] = side / H
    theta[:, 1, 2] = (2 * y0 + side) / H - 1
    grid = F.affine_grid(theta.float().to(dev), [b, 3, out, out], align_corners=False)
    x = F.grid_sample(batch.float(), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)
    return _normalize(x)


def _resample(flat: torch.Tensor, p: torch.Tensor, out: int) -> torch.Tensor:
    """Bilinear crops of the images packed in ``flat`` (uint8, each image ``(3, h, w)``
    contiguous) to float32 ``(B, 3, out, out)``, normalized. ``p``: float64 ``(B, 7)`` rows of
    (y0, x0, side, sign, h, w, offset of the image in ``flat``). About twenty kernels over
    ``(B, 3, out, out)`` tensors, whatever ``B``."""
    dev = flat.device
    y0, x0, side, sign, h, w, start = p.unbind(1)
    centres = (torch.arange(out, device=dev, dtype=torch.float64) + 0.5) / out
    # source pixel coordinates (pixel centres at integers), a flip mirrors x inside the box
    ys = y0[:, None] + side[:, None] * centres - 0.5
    xs = torch.where(sign[:, None] > 0, x0[:, None] + side[:, None] * centres,
                     x0[:, None] + side[:, None] * (1 - centres)) - 0.5
    ys = torch.minimum(ys.clamp(min=0), h[:, None] - 1)
    xs = torch.minimum(xs.clamp(min=0), w[:, None] - 1)
    y_lo, x_lo = ys.floor(), xs.floor()
    wy = (ys - y_lo).float()[:, None, :, None]               # (B, 1, out, 1)
    wx = (xs - x_lo).float()[:, None, None, :]               # (B, 1, 1, out)
    y_hi = torch.minimum(y_lo + 1, h[:, None] - 1)
    x_hi = torch.minimum(x_lo + 1, w[:, None] - 1)
    width = w.long()[:, None]
    chan = (start[:, None] + torch.arange(3, device=dev) * (h * w)[:, None]).long()
    chan = chan[:, :, None, None]                           # (B, 3, 1, 1)
    rows = [chan + (y.long() * width)[:, None, :, None] for y in (y_lo, y_hi)]
    cols = [x.long()[:, None, None, :] for x in (x_lo, x_hi)]

    def at(r, c):                                           # (B, 3, out, out)
        return torch.take(flat, r + c).float()

    top = torch.lerp(at(rows[0], cols[0]), at(rows[0], cols[1]), wx)
    bottom = torch.lerp(at(rows[1], cols[0]), at(rows[1], cols[1]), wx)
    mean = torch.tensor(IMAGENET_MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=dev).view(1, 3, 1, 1) * 255
    return torch.addcmul(-mean / std, torch.lerp(top, bottom, wy), 1 / std)


def gpu_augment_list(images: Sequence[torch.Tensor], out: int,
                     generator: torch.Generator | None = None,
                     scale: tuple[float, float] = (0.25, 1.0), flip: bool = True) -> torch.Tensor:
    """:func:`gpu_augment` for images of different sizes (what a batched JPEG decode returns),
    with a number of kernels that does not grow with the batch.

    ``images``: uint8 ``(3, H_i, W_i)`` tensors on one device. They are concatenated into one
    flat buffer (one ``torch.cat``); every output pixel's four bilinear neighbours are then
    gathered from it by index arithmetic on the whole batch at once (``torch.take``), with
    coordinates clamped to each image's own border (``grid_sample``'s ``padding_mode="border"``,
    ``align_corners=False``). Same crops, flips and result as :func:`gpu_augment` for the same
    ``generator`` when the images share one size. Returns float32 ``(B, 3, out, out)``.

    The gathers and blends write int64 indices and float32 values for every output element:
    about 130 bytes of memory traffic per output element (4 written in the end).

    Raises:
        ValueError: ``images`` empty, or an image not uint8 ``(3, H, W)``.
    """
    if len(images) == 0:
        raise ValueError("images is empty")
    for k, t in enumerate(images):
        if t.dim() != 3 or t.shape[0] != 3 or t.dtype != torch.uint8:
            raise ValueError(f"images[{k}] must be uint8 (3, H, W), got {t.dtype} {tuple(t.shape)}")
    positive_int("out", out)
    dev = images[0].device
    hw = torch.tensor([[t.shape[1], t.shape[2]] for t in images], dtype=torch.float64)
    h, w = hw[:, 0], hw[:, 1]
    y0, x0, side, sign = _crop_boxes(h, w, generator, scale, flip)
    start = torch.cumsum(3 * h * w, 0) - 3 * h * w          # each image's offset in the buffer
    # one host-to-device copy of every per-image number: (B, 7) float64
    p = torch.stack([y0, x0, side, sign, h, w, start], 1).to(dev)
    flat = torch.cat([t.reshape(-1) for t in images])
    return _resample(flat, p, out)


def decode_blur(path: str | os.PathLike, side: int = 144) -> torch.Tensor:
    """Decode and resize one image (:func:`decode_resized`), then blur it with a 7 x 7 box filter
    in torch (``F.conv2d``, a float32 ``(3, side, side)`` result): torch work big enough
    (3 x 144 x 144 outputs x 49 taps) that torch splits it over its intra-op threads."""
    x = torch.from_numpy(decode_resized(path, side)).permute(2, 0, 1).float().unsqueeze(1)
    k = torch.full((1, 1, 7, 7), 1 / 49)
    return F.conv2d(x, k, padding=3).squeeze(1)


class AugmentBatch:
    """``collate_fn`` for a batch-reading dataset (``batch_size=None``): ``(uint8 (B, 3, H, W),
    labels)`` -> ``(gpu_augment(x, out), labels)``, the batched crop/flip/normalize on the CPU
    (picklable, so it also works in workers)."""

    def __init__(self, out: int, seed: int | None = None):
        self.out = positive_int("out", out)
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def __call__(self, batch):
        x, y = batch
        return gpu_augment(x, self.out, generator=self.generator), y


def decode_pil(data: bytes) -> torch.Tensor:
    """Decode JPEG bytes with Pillow: uint8 ``(H, W, 3)`` tensor (shares the array's memory)."""

    with Image.open(io.BytesIO(data)) as im:
        return torch.from_numpy(np.array(im.convert("RGB")))


def gpu_decode(blobs: Sequence[bytes | torch.Tensor],
               device: str | torch.device = "cuda") -> list[torch.Tensor]:
    """Decode a batch of JPEGs on the GPU: ``torchvision.io.decode_jpeg(list, device=device)``.

    ``blobs``: the files' bytes, or 1-d uint8 CPU tensors of them. The compressed bytes are copied
    to the GPU inside the call (counted in its time). torchvision asks nvJPEG for its *hardware*
    back end (the JPEG decoding engines of an A100, H100 or H200) and falls back to the default,
    CUDA, back end where the GPU has none (torchvision's ``decode_jpegs_cuda.cpp``). Returns uint8
    ``(3, H, W)`` tensors on ``device``.
    """
    # torchvision is optional (the "vision" extra): the CPU wheels of torch this course pins have
    # no matching torchvision on PyPI, so only GPU code paths import it.
    from torchvision.io import decode_jpeg, ImageReadMode

    data = [b if isinstance(b, torch.Tensor) else torch.frombuffer(bytearray(b), dtype=torch.uint8)
            for b in blobs]
    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def decode_augment(path: str | os.PathLike, out: int = 128, side: int = 144) -> torch.Tensor:
    """The loading ladder's per-image CPU work: decode and resize to the ``side`` x ``side``
    centre square (:func:`decode_resized`, what the memory map stores), then :func:`gpu_augment`'s
    random resized crop to ``out``, flip and normalization of that one image, on the CPU: float32
    ``(3, out, out)``. The offline rung does the same arithmetic, on the GPU, for a whole batch,
    so every rung trains on the same distribution of crops."""
    x = torch.from_numpy(decode_resized(path, side)).permute(2, 0, 1)
    return gpu_augment(x.unsqueeze(0), out)[0]
