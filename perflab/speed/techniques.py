"""Single-GPU training speed: the pieces chapter 6 measures, each usable on a CPU.

* :func:`synthetic_images` and :class:`SmallCNN`: a small image-classification task with
  learnable structure, built in memory (chapter 5 builds real loaders; this chapter needs only
  a fixed stream of batches so that every optimization sees the same data).
* :class:`Prefetcher`: copies the next batch to the GPU on a side CUDA stream while the current
  batch computes (double buffering). On a CPU it is a plain iterator.
* :class:`StepConfig`, :data:`LADDER`, :func:`train_run`, :func:`run_ladder`: the training
  ladder, one optimization per rung, each rung's samples/s and losses measured in one run.
* :class:`GraphedStep`: a whole training step (forward, backward, optimizer) captured into one
  CUDA graph with static inputs and a capturable optimizer (PyTorch documentation, "CUDA
  Graphs", whole-network capture, https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
* :func:`overlap_fraction` and :func:`trace_intervals`: how much of the host-to-device copy
  time a profiler trace shows running under a kernel.
* :func:`fold_batchnorm`: an inference-time ``Conv2d``/``Linear`` with a following
  ``BatchNorm`` folded into its weights and bias.
* :func:`capture_logs`: ``torch._logging`` output (for example why ``torch.compile`` skipped
  CUDA graphs) returned as text instead of written to stderr.

Units: samples per second, seconds; images are ``uint8`` in ``[0, 255]``, shape ``(N, 3, H, W)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["capture_logs", "fold_batchnorm", "graph_replay_semantics", "GraphedStep",
           "host_batches", "LADDER", "ladder_configs", "ladder_table", "loss_within",
           "make_optimizer", "MEAN", "normalize", "overlap_fraction", "Prefetcher",
           "profile_overlap", "run_ladder", "Rung", "RungResult", "SmallCNN", "STD", "StepConfig",
           "synthetic_images", "trace_intervals", "train_run", "wall_time"]

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
    if n < 1 or classes < 2:
        raise ValueError(f"n must be >= 1 and classes >= 2, got n={n}, classes={classes}")
    if size < 4:
        raise ValueError(f"size must be >= 4 pixels, got {size}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
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
        if width < 1 or classes < 2:
            raise ValueError(f"width must be >= 1 and classes >= 2, got {width}, {classes}")
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


def make_optimizer(params: Iterable[torch.nn.Parameter], kind: str, lr: float = 2e-3,
                   capturable: bool = False) -> torch.optim.AdamW:
    """AdamW in one of its three implementations.

    * ``"forloop"``: ``foreach=False, fused=False``: a Python loop, several kernels per tensor;
    * ``"foreach"``: ``foreach=True``: multi-tensor kernels, a few launches for all tensors;
    * ``"fused"``: ``fused=True``: one fused kernel (per device and dtype group).

    ``capturable=True`` keeps the step count on the device so that the step can be captured in
    a CUDA graph (needed by :class:`GraphedStep`).

    Raises:
        ValueError: unknown ``kind``.
    """
    opts = {"forloop": dict(foreach=False, fused=False), "foreach": dict(foreach=True),
            "fused": dict(fused=True)}
    if kind not in opts:
        raise ValueError(f"kind must be one of {sorted(opts)}, got {kind!r}")
    return torch.optim.AdamW(params, lr=lr, capturable=capturable, **opts[kind])


class Prefetcher:
    """Iterate over batches already on ``device``, the next one copied while the current computes.

    ``batches`` yields tuples of CPU tensors (pin them for truly asynchronous copies). On CUDA,
    the copy of batch ``i + 1`` is issued with ``non_blocking=True`` on a side stream right
    after batch ``i`` is handed out, so it overlaps batch ``i``'s compute (double buffering: two
    batches in flight). Before a batch is handed out the current stream waits for its copy, and
    ``record_stream`` tells the caching allocator that the current stream uses the memory.
    On any other device it is a plain iterator that moves each batch with ``.to(device)``.

    Raises:
        TypeError: ``batches`` is not iterable.
    """

    def __init__(self, batches: Iterable[Sequence[torch.Tensor]], device: torch.device | str):
        if not hasattr(batches, "__iter__"):
            raise TypeError(f"batches must be iterable, got {type(batches).__name__}")
        self.batches = batches
        self.device = torch.device(device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        dev = self.device
        if dev.type != "cuda":
            for batch in self.batches:
                yield tuple(t.to(dev) for t in batch)
            return
        stream = torch.cuda.Stream(dev)

        def load(batch):
            if batch is None:
                return None
            with torch.cuda.stream(stream):
                return tuple(t.to(dev, non_blocking=True) for t in batch)

        source = iter(self.batches)
        ahead = load(next(source, None))
        while ahead is not None:
            current = torch.cuda.current_stream(dev)
            current.wait_stream(stream)          # the copy of `ahead` has finished
            for t in ahead:
                t.record_stream(current)
            batch, ahead = ahead, load(next(source, None))
            yield batch


def host_batches(images: torch.Tensor, labels: torch.Tensor, batch_size: int, steps: int,
                 float_on_cpu: bool, pinned: bool = False) -> Iterator[tuple[torch.Tensor, ...]]:
    """``steps`` batches in a fixed order, cycling through the data set, on the CPU.

    ``float_on_cpu=True`` normalizes each ``uint8`` batch on the CPU (4 bytes per value over
    the bus; images that are already floating point are shipped as they are); otherwise
    batches stay ``uint8`` (1 byte per value) for :func:`normalize` on the device.
    ``pinned=True`` expects ``images``/``labels`` already pinned (slices of a pinned tensor are
    pinned) and pins CPU-normalized batches.

    Raises:
        ValueError: ``batch_size`` does not divide the number of images, or ``steps`` < 1.
    """
    n = images.shape[0]
    if batch_size < 1 or n % batch_size:
        raise ValueError(f"batch_size must divide the {n} images, got {batch_size}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    for i in range(steps):
        lo = (i * batch_size) % n
        x, y = images[lo:lo + batch_size], labels[lo:lo + batch_size]
        if float_on_cpu and x.dtype == torch.uint8:
            x = normalize(x)
            if pinned:
                x = x.pin_memory()
        yield x, y


@dataclass(frozen=True)
class StepConfig:
    """How one training run moves data and steps the model (one switch per optimization).

    Attributes:
        sync_every_step: read the loss with ``.item()`` and log it every step (a host sync).
        uint8_transfer: copy ``uint8`` images and normalize on the device (else on the CPU).
        pinned: pinned host memory and ``non_blocking=True`` copies.
        prefetch: copy the next batch on a side stream (:class:`Prefetcher`).
        optimizer: ``"forloop"``, ``"foreach"`` or ``"fused"`` AdamW.
        cuda_graph: replay the whole step from a CUDA graph (CUDA only; eager elsewhere).
    """

    sync_every_step: bool = True
    uint8_transfer: bool = False
    pinned: bool = False
    prefetch: bool = False
    optimizer: str = "forloop"
    cuda_graph: bool = False


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a name, what it changes (``StepConfig`` fields), and why."""

    name: str
    changes: dict
    why: str


#: the chapter's ladder; each rung keeps the previous rungs' changes
LADDER: tuple[Rung, ...] = (
    Rung("naive", {}, "float32 made on the CPU, pageable copy, .item() every step, "
         "for-loop AdamW"),
    Rung("no per-step sync", {"sync_every_step": False},
         "losses stay on the device; read once at the end"),
    Rung("uint8 over the bus", {"uint8_transfer": True},
         "4x fewer bytes copied; normalize on the device"),
    Rung("pinned + prefetch", {"pinned": True, "prefetch": True},
         "async copy on a side stream, overlapped with compute"),
    Rung("fused AdamW", {"optimizer": "fused"}, "one optimizer kernel instead of ~7 per tensor"),
    Rung("CUDA graph", {"cuda_graph": True}, "the whole step replayed with one launch"),
)


def ladder_configs(rungs: Sequence[Rung] = LADDER) -> list[tuple[Rung, StepConfig]]:
    """Each rung with its cumulative :class:`StepConfig` (the changes of all rungs up to it).

    Raises:
        ValueError: empty ``rungs`` or a change that names no ``StepConfig`` field.
    """
    if not rungs:
        raise ValueError("rungs must not be empty")
    cfg, out = StepConfig(), []
    for rung in rungs:
        unknown = set(rung.changes) - set(StepConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"rung {rung.name!r} changes unknown fields {sorted(unknown)}")
        cfg = replace(cfg, **rung.changes)
        out.append((rung, cfg))
    return out


class GraphedStep:
    """A whole training step captured in one CUDA graph, replayed with static inputs.

    ``GraphedStep(model, optimizer, example_x, example_y, prepare)`` captures
    ``loss = cross_entropy(model(prepare(x)), y); loss.backward(); optimizer.step()`` reading
    from two static input tensors. ``step(x, y)`` copies ``x``/``y`` into them, replays the
    graph and returns the static loss tensor (overwritten by the next replay: copy it to keep
    it). Only the recorded kernels replay: Python code in the step (counters, prints, a new
    tensor bound to a name) runs once, during capture. The optimizer must be capturable
    (``make_optimizer(..., capturable=True)``), and its state must exist before capture, so
    ``warmup_batches`` real steps run eagerly on a side stream first (PyTorch documentation,
    "CUDA Graphs", whole-network capture).

    Raises:
        RuntimeError: the model is not on a CUDA device.
        ValueError: ``warmup_batches`` is empty.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 warmup_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x):
        dev = next(model.parameters()).device
        if dev.type != "cuda":
            raise RuntimeError("GraphedStep needs a model on a CUDA device")
        if not warmup_batches:
            raise ValueError("warmup_batches must hold at least one (x, y) batch")
        self.model, self.optimizer, self.prepare = model, optimizer, prepare
        self.warmup_losses = []
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for x, y in warmup_batches:
                self.warmup_losses.append(self._eager(x, y).detach())
        torch.cuda.current_stream(dev).wait_stream(side)
        x0, y0 = warmup_batches[0]
        self.static_x, self.static_y = torch.empty_like(x0), torch.empty_like(y0)
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.static_loss = self._eager(self.static_x, self.static_y, zero=False)

    def _eager(self, x, y, zero=True):
        if zero:
            self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self.prepare(x)), y)
        loss.backward()
        self.optimizer.step()
        return loss

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Copy the batch into the static inputs, replay, return the (static) loss tensor."""
        self.static_x.copy_(x, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.static_loss


@dataclass
class RungResult:
    """One training run: ``samples_per_s`` over the timed steps, all per-step ``losses``."""

    name: str
    config: StepConfig
    samples_per_s: float
    seconds: float
    losses: list[float]
    graphed: bool
    log: list[str] = field(default_factory=list, repr=False)

    @property
    def final_loss(self) -> float:
        """Mean loss over the last fifth of the steps (at least one)."""
        k = max(1, len(self.losses) // 5)
        return sum(self.losses[-k:]) / k


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_run(config: StepConfig, images: torch.Tensor, labels: torch.Tensor, steps: int,
              batch_size: int, device: torch.device | str, width: int = 32, warmup: int = 3,
              seed: int = 0, name: str = "") -> RungResult:
    """Train a fresh :class:`SmallCNN` (same seed, same batches) for ``warmup + steps`` steps.

    The first ``warmup`` steps run untimed (first-call costs, optimizer state, the CUDA graph's
    warm-up and capture); the next ``steps`` are timed with the device synchronized before and
    after. Every run sees the same batches in the same order, so losses can be compared.

    ``images`` are ``uint8`` (normalized on the CPU or, with ``uint8_transfer``, on the
    device) or already-normalized ``float32`` (shipped as they are).

    Returns:
        :class:`RungResult`, ``samples_per_s = steps * batch_size / seconds``.

    Raises:
        ValueError: ``steps`` or ``warmup`` < 1, a bad ``batch_size``, or ``uint8_transfer``
            with images that are not ``uint8``.
    """
    if steps < 1 or warmup < 1:
        raise ValueError(f"steps and warmup must be >= 1, got {steps}, {warmup}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(seed)
    model = SmallCNN(width).to(dev)
    graphed = config.cuda_graph and cuda
    opt = make_optimizer(model.parameters(), config.optimizer, capturable=graphed)
    pin = config.pinned and cuda
    if pin:
        images, labels = images.pin_memory(), labels.pin_memory()
    source = host_batches(images, labels, batch_size, warmup + steps,
                          float_on_cpu=not config.uint8_transfer, pinned=pin)
    if config.prefetch:
        batches: Iterable = Prefetcher(source, dev)
    else:
        batches = ((x.to(dev, non_blocking=pin), y.to(dev, non_blocking=pin))
                   for x, y in source)
    if config.uint8_transfer and images.dtype != torch.uint8:
        raise ValueError("uint8_transfer needs uint8 images")
    prepare = normalize if config.uint8_transfer else (lambda x: x)
    it = iter(batches)
    log: list[str] = []
    losses = torch.zeros(warmup + steps, device=dev)
    host_losses: list[float] = []

    def eager(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(prepare(x)), y)
        loss.backward()
        opt.step()
        return loss

    graph = None
    if graphed:
        warm = [next(it) for _ in range(warmup)]
        graph = GraphedStep(model, opt, warm, prepare)
        for i, loss in enumerate(graph.warmup_losses):
            losses[i] = loss
        step_fn = graph.step
    else:
        step_fn = eager
    seconds = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(dev)
            t0 = time.perf_counter()
        if graphed and i < warmup:
            continue
        x, y = next(it)
        loss = step_fn(x, y)
        if config.sync_every_step:
            value = loss.item()
            host_losses.append(value)
            log.append(f"step {i}: loss {value:.4f}")   # as print(...) every step would
        else:
            losses[i].copy_(loss.detach())
    _sync(dev)
    seconds = time.perf_counter() - t0
    if config.sync_every_step:
        values = ([float(v) for v in losses[:warmup].tolist()] if graphed else []) + host_losses
    else:
        values = losses.tolist()
    return RungResult(name or "run", config, steps * batch_size / seconds, seconds, values,
                      graphed, log)


def run_ladder(images: torch.Tensor, labels: torch.Tensor, steps: int, batch_size: int,
               device: torch.device | str, rungs: Sequence[Rung] = LADDER, width: int = 32,
               warmup: int = 3, progress: Callable[[str], None] | None = None
               ) -> list[RungResult]:
    """Run every rung of ``rungs`` (cumulative configs) on the same data, one after the other.

    ``progress(name)`` (optional) is called before each rung. Returns one
    :class:`RungResult` per rung, in order.
    """
    out = []
    for rung, cfg in ladder_configs(rungs):
        if progress is not None:
            progress(rung.name)
        out.append(train_run(cfg, images, labels, steps, batch_size, device, width=width,
                             warmup=warmup, name=rung.name))
    return out


def loss_within(loss: float, reference: float, rtol: float = 0.05, atol: float = 0.02) -> bool:
    """True when ``|loss - reference| <= rtol * |reference| + atol`` (a rung kept the results).

    Raises:
        ValueError: negative tolerances or a loss that is not finite.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got {rtol}, {atol}")
    if not (math.isfinite(loss) and math.isfinite(reference)):
        raise ValueError(f"losses must be finite, got {loss}, {reference}")
    return abs(loss - reference) <= rtol * abs(reference) + atol


def ladder_table(results: Sequence[RungResult], rtol: float = 0.05, atol: float = 0.02) -> str:
    """A plain-text table: rung, samples/s, speedup over the first rung and over the previous
    rung, final loss, and whether it is within tolerance of the first rung's.

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("results must not be empty")
    base = results[0]
    lines = [f"{'rung':22s} {'samples/s':>11s} {'vs naive':>9s} {'vs prev':>8s} "
             f"{'loss':>7s}  same result"]
    prev = base
    for r in results:
        ok = loss_within(r.final_loss, base.final_loss, rtol, atol)
        lines.append(f"{r.name:22s} {r.samples_per_s:11,.0f} "
                     f"{r.samples_per_s / base.samples_per_s:8.2f}x "
                     f"{r.samples_per_s / prev.samples_per_s:7.2f}x {r.final_loss:7.4f}  "
                     f"{'yes' if ok else 'NO'}")
        prev = r
    return "\n".join(lines)


def overlap_fraction(copies: Sequence[tuple[float, float]],
                     computes: Sequence[tuple[float, float]]) -> float:
    """Fraction of the total copy time during which at least one compute interval runs.

    Intervals are ``(start, end)`` in any one time unit. Overlapping compute intervals are
    merged first, so a copy under two concurrent kernels is not counted twice.

    Raises:
        ValueError: no copies, zero total copy time, or an interval with ``end < start``.
    """
    for s, e in list(copies) + list(computes):
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e})")
    total = sum(e - s for s, e in copies)
    if not copies or total <= 0:
        raise ValueError("copies must hold at least one interval of positive length")
    merged: list[list[float]] = []
    for s, e in sorted(computes):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    covered = 0.0
    for cs, ce in copies:
        for ks, ke in merged:
            covered += max(0.0, min(ce, ke) - max(cs, ks))
    return covered / total


def trace_intervals(trace: dict | str | os.PathLike) -> tuple[list[tuple[float, float]],
                                                               list[tuple[float, float]]]:
    """Host-to-device copy and kernel intervals (microseconds) from a Chrome trace.

    ``trace`` is the JSON written by ``torch.profiler.profile(...).export_chrome_trace(path)``
    (a dict, or the path). Copies are events of category ``gpu_memcpy`` whose name contains
    ``HtoD``; kernels are events of category ``kernel``.

    Raises:
        ValueError: the trace has no ``traceEvents`` list.
    """
    if not isinstance(trace, dict):
        with open(trace) as f:
            trace = json.load(f)
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("trace must be a Chrome trace with a 'traceEvents' list")
    copies, kernels = [], []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        span = (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
        cat = str(ev.get("cat", "")).lower()
        if cat == "gpu_memcpy" and "htod" in str(ev.get("name", "")).lower():
            copies.append(span)
        elif cat == "kernel":
            kernels.append(span)
    return copies, kernels


def profile_overlap(fn: Callable[[], object]) -> tuple[float, int, int]:
    """Profile ``fn()`` on the GPU and return ``(overlap fraction, copies, kernels)``.

    The trace is written to a temporary directory (removed afterwards) and read back with
    :func:`trace_intervals`; the fraction is :func:`overlap_fraction`.

    Raises:
        RuntimeError: no CUDA GPU, or the trace holds no host-to-device copy.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("profile_overlap needs a CUDA GPU")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        copies, kernels = trace_intervals(path)
    if not copies:
        raise RuntimeError("the trace holds no host-to-device copy")
    return overlap_fraction(copies, kernels), len(copies), len(kernels)


def fold_batchnorm(layer: nn.Module, bn: nn.Module) -> nn.Module:
    """A copy of ``layer`` (``Conv2d`` or ``Linear``) with the eval-mode ``bn`` after it folded in.

    In eval mode BatchNorm is affine per channel: ``y = gamma * (z - mu) / sqrt(var + eps) +
    beta``. With ``s = gamma / sqrt(var + eps)`` the folded layer has weight ``W * s`` (per
    output channel) and bias ``(b - mu) * s + beta``, one operator instead of two. Valid for
    inference only: in training the statistics come from the batch.

    Raises:
        TypeError: ``layer`` is not ``Conv2d``/``Linear`` or ``bn`` not ``BatchNorm1d/2d``.
        ValueError: channel counts differ.
    """
    if not isinstance(layer, (nn.Conv2d, nn.Linear)):
        raise TypeError(f"layer must be nn.Conv2d or nn.Linear, got {type(layer).__name__}")
    if not isinstance(bn, (nn.BatchNorm1d, nn.BatchNorm2d)):
        raise TypeError(f"bn must be nn.BatchNorm1d or nn.BatchNorm2d, got {type(bn).__name__}")
    out_ch = layer.out_channels if isinstance(layer, nn.Conv2d) else layer.out_features
    if bn.num_features != out_ch:
        raise ValueError(f"bn has {bn.num_features} channels, layer outputs {out_ch}")
    import copy

    fused = copy.deepcopy(layer)
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        shape = (-1,) + (1,) * (layer.weight.dim() - 1)
        fused.weight.copy_(layer.weight * scale.view(shape))
        bias = layer.bias if layer.bias is not None else torch.zeros_like(bn.running_mean)
        fused.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)
    return fused.eval()


def capture_logs(fn: Callable[[], Any], **set_logs: Any) -> tuple[Any, str]:
    """Run ``fn()`` with ``torch._logging.set_logs(**set_logs)`` and return ``(result, log text)``.

    ``torch._logging`` writes through ``logging.StreamHandler`` objects bound to ``sys.stderr``
    when ``set_logs`` installs them; installing them while stderr is redirected to a buffer
    binds them to the buffer, so the log can be printed in a notebook cell as text (nothing goes
    to stderr); anything else ``fn`` writes to stderr is returned too. Logging is reset to the
    defaults afterwards, even when ``fn`` raises.
    Example: ``capture_logs(run, perf_hints=True, cudagraphs=True)`` shows why
    ``torch.compile(mode="reduce-overhead")`` skipped CUDA graphs.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            torch._logging.set_logs(**set_logs)
            out = fn()
    finally:
        torch._logging.set_logs()             # outside the redirect: defaults go to stderr
    return out, buf.getvalue()


def graph_replay_semantics(device: torch.device | str | None = None) -> dict[str, Any]:
    """Show what a CUDA graph replays and what it does not, on a tiny ``y = x * 2 + 1``.

    Returns a dict: ``python_calls`` (times the Python body ran: 1, at capture, however many
    replays), ``replays``, ``new_name_result`` (output after binding the name ``x`` to a new
    tensor and replaying: still the old input's result), ``copied_result`` (after ``copy_``
    into the static input: the new result).

    Raises:
        RuntimeError: no CUDA GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("graph_replay_semantics needs a CUDA GPU")
    dev = torch.device(device or "cuda")
    calls = {"n": 0}
    x = torch.full((4,), 1.0, device=dev)

    def body(inp):
        calls["n"] += 1                       # a Python side effect
        return inp * 2 + 1

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        body(x)                               # warm-up (counts as one Python call)
    torch.cuda.current_stream(dev).wait_stream(side)
    calls["n"] = 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = body(x)
    for _ in range(5):
        g.replay()
    static_x = x
    x = torch.full((4,), 10.0, device=dev)    # new tensor, old name: the graph never sees it
    g.replay()
    new_name = y[0].item()
    static_x.copy_(x)                         # the right way: copy into the static input
    g.replay()
    copied = y[0].item()
    return {"python_calls": calls["n"], "replays": 7, "new_name_result": new_name,
            "copied_result": copied}


def wall_time(fn: Callable[[], object], device: torch.device | str, reps: int = 5,
              warmup: int = 1, stat: str = "median") -> float:
    """Wall-clock seconds of one call of ``fn()``, the device synchronized around each call.

    ``stat="median"`` (default) or ``"min"`` over ``reps`` calls after ``warmup`` calls; the
    minimum is the estimate least disturbed by other processes (use it for checks that compare
    two loops on a shared machine).

    For whole training loops (or steps) whose cost is partly on the CPU: the calls run as in a
    real loop, with nothing between them. (:func:`perflab.core.timing.benchmark` on a GPU flushes the
    L2 between calls; the flush kernel gives the CPU a head start that hides part of an
    overhead-bound step's cost, which is what a loop measurement must include.)

    Raises:
        ValueError: ``reps`` < 1, ``warmup`` < 0 or an unknown ``stat``.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0] if stat == "min" else times[len(times) // 2]
