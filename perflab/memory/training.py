"""Memory of one training step: predicted from first principles, measured, and reduced.

Four groups of helpers, one per question chapter 7 asks:

* **What should it take?** :func:`static_bytes` (parameters, gradients and Adam's two moments:
  ``4 + 4 + 8`` bytes per float32 parameter, the accounting of Rajbhandari et al. 2020, "ZeRO")
  and :func:`activation_bytes` (what autograd saves in a stack of transformer blocks; the
  per-layer count follows Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", section 4.1, redone for this module's float32 blocks without dropout).
* **The model.** :class:`BlockStackConfig` and :class:`BlockStack`: pre-LayerNorm transformer
  blocks with written-out attention (so the ``a s^2 b`` attention-score term is there to see),
  with ``checkpoint="none" | "full" | "selective"``.
* **What does it take?** :func:`saved_bytes` (saved tensors through
  ``torch.autograd.graph.saved_tensors_hooks``, via :mod:`perflab.internals.autograd`), :func:`peak_bytes`
  (the CUDA caching allocator's counters on a GPU; the profiler's memory events on a CPU, where
  that allocator does not exist), :func:`measure_phases` (forward, backward, optimizer step),
  :func:`state_bytes` (the bytes of parameters, gradients and optimizer state, counted tensor by
  tensor), and memory snapshots (:func:`record_snapshot`, :func:`cpu_memory_trace`,
  :func:`allocation_timeline`, :func:`largest_allocation`).
* **How to make it smaller?** :func:`train_step` with micro-batches (gradient accumulation done
  right), :func:`optimizer_in_backward`, :func:`max_relative_difference` for checking that a
  technique left the gradients alone, :func:`freed_without_gc` for reference cycles, and
  :func:`allocator_experiment` / :func:`run_allocator_experiment`: the fragmentation experiment,
  run in a fresh process because ``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA initializes
  (``python -m perflab.memory.training fragmentation --cap-mib 2048`` prints its JSON).

Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from perflab.internals.autograd import saved_tensors

__all__ = ["activation_bytes", "ADAM_BYTES_PER_PARAM", "allocation_timeline",
           "allocator_experiment", "allocator_rounding", "Block", "block_tensor_bytes",
           "BlockStack", "BlockStackConfig", "cpu_memory_trace", "driver_view", "freed_without_gc",
           "largest_allocation", "load_snapshot", "load_snapshot_config",
           "max_relative_difference", "measure_phases", "name_allocation", "optimizer_in_backward",
           "param_count", "Peak", "peak_bytes", "PhaseMemory", "record_snapshot",
           "run_allocator_experiment", "save_snapshot", "save_snapshot_config", "saved_bytes",
           "state_bytes", "static_bytes", "train_step", "warm_up"]

MiB = 2**20

# float32 training with Adam: the weight, its gradient, and Adam's exp_avg and exp_avg_sq
# (Rajbhandari et al. 2020, "ZeRO", section 3.1, count 16 bytes per parameter for mixed precision
# as 2 + 2 + 12; in plain float32 it is 4 + 4 + 8)
ADAM_BYTES_PER_PARAM = {"params": 4, "grads": 4, "optimizer": 8}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class BlockStackConfig:
    """Shape of a :class:`BlockStack`.

    Attributes:
        d_model: hidden size ``h``.
        n_heads: attention heads ``a`` (must divide ``d_model``).
        n_layers: blocks ``L``.
        seq_len: tokens per sequence ``s``.

    Raises:
        ValueError: a field that is not a positive int, or ``n_heads`` not dividing ``d_model``.
    """

    d_model: int = 1024
    n_heads: int = 16
    n_layers: int = 8
    seq_len: int = 1024

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_layers", "seq_len"):
            _positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")


def _save_matmuls_policy(ctx, op, *args, **kwargs):
    """Selective checkpointing: keep the outputs of the Linear layers' matrix products."""
    from torch.utils.checkpoint import CheckpointPolicy

    if op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``.

    The attention is written out (``q k^T``, softmax, ``@ v``) so that its ``(b, a, s, s)`` score
    tensor is visible in memory, as in Korthikanti et al. 2022; the MLP is ``h -> 4h -> h`` with
    GELU. Input and output: float ``(batch, seq_len, d_model)``.
    """

    def __init__(self, cfg: BlockStackConfig):
        super().__init__()
        h = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention of ``x`` ``(b, s, h)``, without mask or dropout."""
        b, s, h = x.shape
        a = self.n_heads
        q, k, v = self.qkv(x).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (h // a) ** -0.5     # (b, a, s, s)
        ctx = scores.softmax(dim=-1) @ v                            # (b, a, s, h/a)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class BlockStack(nn.Module):
    """``n_layers`` :class:`Block` s applied in turn; ``checkpoint`` picks what autograd keeps.

    * ``"none"``: every block saves what its backward needs (:func:`activation_bytes`).
    * ``"full"``: each block runs under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``:
      only its input is kept; the block's forward runs again in the backward pass.
    * ``"selective"``: the same, with a policy from
      ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` that keeps the outputs of
      the Linear layers' matrix products (``aten.addmm``/``aten.mm``) and recomputes the rest
      (LayerNorm, the attention scores and softmax, GELU).

    Input and output: float ``(batch, seq_len, d_model)``.

    Raises:
        ValueError: unknown ``checkpoint``.
    """

    MODES = ("none", "full", "selective")

    def __init__(self, cfg: BlockStackConfig, checkpoint: str = "none"):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.checkpoint = checkpoint

    @property
    def checkpoint(self) -> str:
        return self._checkpoint

    @checkpoint.setter
    def checkpoint(self, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError(f"checkpoint must be one of {self.MODES}, got {mode!r}")
        self._checkpoint = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        for block in self.blocks:
            if self.checkpoint == "none" or not torch.is_grad_enabled():
                x = block(x)
            elif self.checkpoint == "full":
                x = checkpoint(block, x, use_reentrant=False)
            else:
                context = functools.partial(create_selective_checkpoint_contexts,
                                            _save_matmuls_policy)
                x = checkpoint(block, x, use_reentrant=False, context_fn=context)
        return x


def warm_up(device: torch.device | str) -> None:
    """One training step of a tiny :class:`BlockStack` on ``device``, so that libraries allocate
    what they keep before a measurement starts.

    cuBLAS and cuBLASLt take their workspaces (tens of MiB on recent GPUs) from the caching
    allocator at their first matrix products and keep them for the process's life; a static
    memory measurement that starts before them counts them as the model's.
    """
    dev = torch.device(device)
    tiny = BlockStack(BlockStackConfig(d_model=64, n_heads=4, n_layers=1, seq_len=16)).to(dev)
    x = torch.randn(1, 16, 64, device=dev)
    train_step(tiny, torch.optim.Adam(tiny.parameters()), x, x)


def param_count(cfg: BlockStackConfig) -> int:
    """Parameters of a :class:`BlockStack`: ``L (12 h^2 + 13 h)``.

    Per block: the QKV, output, up and down projections hold ``3h^2 + h^2 + 4h^2 + 4h^2 = 12h^2``
    weights and ``3h + h + 4h + h = 9h`` biases; the two LayerNorms ``4h``.
    """
    h = cfg.d_model
    return cfg.n_layers * (12 * h * h + 13 * h)


def static_bytes(n_params: int, bytes_per_param: dict[str, int] | None = None) -> dict[str, int]:
    """Memory that lives through the whole of training: ``{"params", "grads", "optimizer", "total"}``.

    Args:
        n_params: number of parameters (> 0).
        bytes_per_param: bytes per parameter for each part; default :data:`ADAM_BYTES_PER_PARAM`
            (float32 weights and gradients, Adam's two float32 moments: 4 + 4 + 8).

    Raises:
        ValueError: ``n_params`` not a positive int, or a negative byte count.
    """
    _positive_int("n_params", n_params)
    per = dict(ADAM_BYTES_PER_PARAM if bytes_per_param is None else bytes_per_param)
    if any(v < 0 for v in per.values()):
        raise ValueError(f"bytes_per_param must be >= 0, got {per}")
    out = {k: n_params * v for k, v in per.items()}
    out["total"] = sum(out.values())
    return out


def activation_bytes(cfg: BlockStackConfig, batch: int, dtype_bytes: int = 4) -> dict[str, int]:
    """Bytes autograd keeps between forward and backward for a :class:`BlockStack` (no checkpointing).

    Per block, with ``b`` = batch, ``s`` = seq_len, ``h`` = d_model, ``a`` = n_heads, counting
    *distinct* tensors (a tensor saved by two operations counts once), after Korthikanti et al.
    2022, section 4.1 (their count is for 16-bit tensors with dropout; this one is for our
    float32 blocks without dropout):

    * attention, ``6 sbh + a s^2 b`` elements: the LayerNorm's input ``x`` and output (the QKV
      projection's input), the contiguous copies of ``q``, ``k`` and ``v`` that the batched
      products save, the softmax output (saved by softmax and by ``@ v``: ``a s^2 b``) and the
      output projection's input;
    * MLP, ``10 sbh``: LayerNorm input and output, the up-projection's output (GELU's input,
      ``4 sbh``) and GELU's output (the down-projection's input, ``4 sbh``);
    * the two LayerNorms' means and reciprocal standard deviations: ``4 sb``.

    The first block's input is the caller's tensor (not counted: it exists anyway); the loss
    (:func:`F.mse_loss`) keeps the stack's output, ``sbh``.

    Returns:
        ``{"per_layer", "attention_scores_per_layer", "total"}`` in bytes.

    Raises:
        ValueError: ``batch`` or ``dtype_bytes`` not a positive int.
    """
    _positive_int("batch", batch)
    _positive_int("dtype_bytes", dtype_bytes)
    b, s, h, a, L = batch, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers
    sbh = s * b * h
    scores = a * s * s * b
    per_layer = 16 * sbh + scores + 4 * s * b
    total = L * per_layer - sbh + sbh          # minus the caller's input, plus the loss's saved output
    return {"per_layer": per_layer * dtype_bytes, "attention_scores_per_layer": scores * dtype_bytes,
            "total": total * dtype_bytes}


def block_tensor_bytes(cfg: BlockStackConfig, batch: int, dtype_bytes: int = 4) -> dict[str, int]:
    """Sizes of the distinct tensors one block makes, by name, in bytes.

    ``"attention scores"`` ``(b, a, s, s)``, ``"MLP hidden"`` ``(b, s, 4h)``, ``"qkv"``
    ``(b, s, 3h)``, ``"activation"`` ``(b, s, h)``, ``"up-projection weight"`` ``(4h, h)`` (its
    gradient is as large). Used to name an allocation seen in a memory snapshot.

    Raises:
        ValueError: ``batch`` or ``dtype_bytes`` not a positive int.
    """
    _positive_int("batch", batch)
    _positive_int("dtype_bytes", dtype_bytes)
    b, s, h, a = batch, cfg.seq_len, cfg.d_model, cfg.n_heads
    sizes = {"attention scores": b * a * s * s, "MLP hidden": b * s * 4 * h, "qkv": b * s * 3 * h,
             "activation": b * s * h, "up-projection weight": 4 * h * h}
    return {k: v * dtype_bytes for k, v in sizes.items()}


# ----------------------------------------------------------------------------------------------
# measuring


def saved_bytes(fn: Callable[..., Any], *args, exclude: Iterable[torch.Tensor] = (), **kwargs) -> int:
    """Bytes of the distinct storages autograd saved while running ``fn(*args, **kwargs)``.

    Uses :func:`perflab.internals.autograd.saved_tensors` (``saved_tensors_hooks``) and leaves out the
    storages of tensor arguments and of ``exclude`` (pass ``model.parameters()``: the weights
    exist anyway). Works on every device. Under ``torch.utils.checkpoint`` the checkpoint's own
    hooks take over inside each checkpointed region, so that region's saves are not seen: use
    :func:`peak_bytes` for checkpointed models.

    Raises:
        TypeError: ``fn`` is not callable.
        RuntimeError: called with autograd disabled.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    rec = saved_tensors(fn, *args, **kwargs)
    seen: dict[int, int] = {}
    for t in rec.tensors:
        if not t.is_input and t.storage_ptr not in excluded:
            seen[t.storage_ptr] = max(seen.get(t.storage_ptr, 0), t.storage_nbytes)
    return sum(seen.values())


class _NativeStderrSilenced:
    """Send file descriptor 2 to /dev/null while the profiler runs on a CPU.

    The profiler's C++ side writes log lines there (start/stop lines, and a note when a block
    allocated before profiling is freed) that would land in a notebook's output as stderr.
    Python's own ``sys.stderr`` (warnings, tracebacks in Jupyter) is a different stream and is
    not affected; the descriptor is restored on exit, also when the code raises.
    """

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def _chrome_trace(fn: Callable[[], Any]) -> tuple[list[dict], Any]:
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory(prefix="perflab_mem_") as tmp:
        with _NativeStderrSilenced(), profile(activities=[ProfilerActivity.CPU],
                                              profile_memory=True) as prof:
            out = fn()
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return events, out


def _cpu_memory_events(events: list[dict]) -> list[dict]:
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    return sorted(mem, key=lambda e: e["ts"])


@dataclass(frozen=True)
class Peak:
    """Memory over one call, relative to what was allocated when it started (bytes).

    Attributes:
        peak: the highest allocated memory above the starting level.
        net: allocated at the end minus at the start (negative when the call freed memory).
        source: ``"cuda caching allocator"`` or ``"profiler memory events (cpu)"``.
    """

    peak: int
    net: int
    source: str


def peak_bytes(fn: Callable[[], Any], device: torch.device | str) -> tuple[Peak, Any]:
    """Run ``fn()`` once and return (:class:`Peak`, its result).

    On CUDA: ``torch.cuda.reset_peak_memory_stats`` before, then ``max_memory_allocated`` minus
    the ``memory_allocated`` at the start (the caching allocator's own counters, in 512-byte
    rounded blocks). On a CPU there is no caching allocator: the profiler (``profile_memory=True``)
    records every allocation and free of the CPU allocator with a running total, and the peak is
    the highest running total (allocations outside PyTorch's allocator, e.g. a BLAS library's
    scratch space, are not seen).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        return Peak(torch.cuda.max_memory_allocated(dev) - start,
                    torch.cuda.memory_allocated(dev) - start, "cuda caching allocator"), out
    events, out = _chrome_trace(fn)
    mem = _cpu_memory_events(events)
    if not mem:
        return Peak(0, 0, "profiler memory events (cpu)"), out
    # the running total is the CPU allocator's since the first profiled allocation of the process:
    # the level before this call is the first event's total minus its own size
    start = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    totals = [e["args"]["Total Allocated"] - start for e in mem]
    return Peak(int(max([0] + totals)), int(totals[-1]), "profiler memory events (cpu)"), out


@dataclass(frozen=True)
class PhaseMemory:
    """One phase of a training step: its peak above, and net change from, its starting level (bytes)."""

    phase: str
    peak: int
    net: int


def measure_phases(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, device: torch.device | str) -> list[PhaseMemory]:
    """Peak and net memory of forward (with the MSE loss), backward and ``optimizer.step()``.

    Gradients are set to None first, so the backward pass allocates them. Each phase is measured
    by :func:`peak_bytes` (CUDA counters on a GPU, profiler events on a CPU).

    Returns:
        three :class:`PhaseMemory`, in order ``forward``, ``backward``, ``step``.
    """
    optimizer.zero_grad(set_to_none=True)
    fwd, loss = peak_bytes(lambda: F.mse_loss(model(x), y), device)
    bwd, _ = peak_bytes(loss.backward, device)
    del loss
    step, _ = peak_bytes(optimizer.step, device)
    return [PhaseMemory("forward", fwd.peak, fwd.net), PhaseMemory("backward", bwd.peak, bwd.net),
            PhaseMemory("step", step.peak, step.net)]


def _storages_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                device: torch.device | str | None = None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state, counted tensor by tensor (distinct storages).

    Only tensors on ``device`` count (default: the parameters' device), so Adam's ``step`` counters,
    which live on the CPU when the model is on a GPU, are left out there.

    Returns:
        ``{"params", "grads", "optimizer", "total"}``.
    """
    params = list(model.parameters())
    dev = torch.device(device) if device is not None else (params[0].device if params else torch.device("cpu"))
    on = lambda ts: [t for t in ts if isinstance(t, torch.Tensor) and t.device == dev]  # noqa: E731
    out = {"params": _storages_bytes(on(params)),
           "grads": _storages_bytes(on(p.grad for p in params if p.grad is not None)),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = _storages_bytes(on(v for st in optimizer.state.values() for v in st.values()))
    out["total"] = sum(out.values())
    return out


def allocator_rounding(nbytes: int) -> dict[str, int]:
    """How the CUDA caching allocator serves a request of ``nbytes`` (its constants, PyTorch source
    ``c10/cuda/CUDACachingAllocator.cpp``; the CUDA semantics notes describe the same).

    * every block is a multiple of 512 bytes (``kMinBlockSize``);
    * requests up to 1 MiB come from the *small pool*, whose segments are 2 MiB;
    * larger requests come from the *large pool*: below 10 MiB from 20 MiB segments, from there on
      from a segment of their own, rounded up to a multiple of 2 MiB (10 MiB itself included).

    A segment is one ``cudaMalloc``; blocks are carved from it by splitting. Returns
    ``{"block": bytes counted as allocated, "segment": bytes reserved if a new segment is needed,
    "pool": 0 (small) or 1 (large)}`` for the default settings (no ``roundup_power2_divisions``,
    no expandable segments).

    Raises:
        ValueError: ``nbytes`` not a positive int.
    """
    _positive_int("nbytes", nbytes)
    block = -(-nbytes // 512) * 512
    if block <= MiB:
        return {"block": block, "segment": 2 * MiB, "pool": 0}
    if block < 10 * MiB:
        return {"block": block, "segment": 20 * MiB, "pool": 1}
    return {"block": block, "segment": -(-block // (2 * MiB)) * 2 * MiB, "pool": 1}


def driver_view(device: torch.device | str) -> dict[str, int]:
    """What the driver sees beside what PyTorch holds, on a CUDA device (bytes).

    ``used`` is ``total - free`` from ``torch.cuda.mem_get_info`` (every process and the CUDA
    context count there, as in ``nvidia-smi``); ``reserved`` and ``allocated`` are the caching
    allocator's; ``outside_allocator = used - reserved`` is the CUDA context, library workspaces
    that bypass the allocator, and any other process on the GPU.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"driver_view needs a CUDA device, got {dev}")
    free, total = torch.cuda.mem_get_info(dev)
    reserved = torch.cuda.memory_reserved(dev)
    return {"total": total, "used": total - free, "reserved": reserved,
            "allocated": torch.cuda.memory_allocated(dev), "outside_allocator": total - free - reserved}


# ----------------------------------------------------------------------------------------------
# memory snapshots


def record_snapshot(fn: Callable[[], Any], path: str | os.PathLike | None = None,
                    max_entries: int = 20000, max_frames: int | None = 12) -> dict:
    """Record the CUDA caching allocator's history while ``fn()`` runs; return (and save) the snapshot.

    Wraps ``torch.cuda.memory._record_memory_history(enabled="all", context="alloc",
    stacks="python", max_entries=...)`` and ``torch.cuda.memory._snapshot()``; the pickle written to
    ``path`` is what https://pytorch.org/memory_viz opens (``_dump_snapshot`` writes the same).
    Recording stops afterwards, also when ``fn`` raises. Each recorded stack is cut to its
    ``max_frames`` innermost frames (None: keep all), which keeps the file small.

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("record_snapshot needs CUDA: the caching allocator keeps the history")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    if max_frames is not None:
        _trim_frames(snap, max_frames)
    if path is not None:
        save_snapshot(snap, path)
    return snap


def _trim_frames(snapshot: dict, max_frames: int) -> None:
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = e["frames"][:max_frames]
    for seg in snapshot.get("segments", []):
        for blk in seg.get("blocks", []):
            if "frames" in blk:
                blk["frames"] = blk["frames"][:max_frames]
            for h in blk.get("history", []):
                if "frames" in h:
                    h["frames"] = h["frames"][:max_frames]


def save_snapshot_config(cfg: BlockStackConfig, batch: int, path: str | os.PathLike) -> Path:
    """Write ``{"config": ..., "batch": ...}`` beside a snapshot (``<path>.json``), so a reader of
    the snapshot can name its allocations with :func:`block_tensor_bytes`."""
    side = Path(str(path) + ".json")
    side.write_text(json.dumps({"config": cfg.__dict__, "batch": _positive_int("batch", batch)}))
    return side


def load_snapshot_config(path: str | os.PathLike) -> tuple[BlockStackConfig, int]:
    """The (config, batch) that :func:`save_snapshot_config` wrote beside the snapshot at ``path``.

    Raises:
        FileNotFoundError: no ``<path>.json``.
    """
    data = json.loads(Path(str(path) + ".json").read_text())
    return BlockStackConfig(**data["config"]), int(data["batch"])


def save_snapshot(snapshot: dict, path: str | os.PathLike) -> Path:
    """Write a snapshot as a pickle (the format of ``_dump_snapshot`` and pytorch.org/memory_viz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return path


def load_snapshot(path: str | os.PathLike) -> dict:
    """Read a snapshot pickle written by :func:`save_snapshot` or ``_dump_snapshot``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds no ``device_traces``.
    """
    with open(path, "rb") as f:
        snap = pickle.load(f)  # noqa: S301 -- our own snapshot files, as memory_viz reads them
    if not isinstance(snap, dict) or "device_traces" not in snap:
        raise ValueError(f"{path} is not a memory snapshot (no 'device_traces')")
    return snap


def _innermost_ops(events: list[dict]) -> Callable[[dict], str]:
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: e["ts"])

    def name(mem: dict) -> str:
        best, best_dur = "(outside any operator)", math.inf
        for op in ops:
            if op["ts"] > mem["ts"]:
                break
            if op["ts"] <= mem["ts"] <= op["ts"] + op.get("dur", 0) and op.get("dur", 0) < best_dur:
                best, best_dur = op["name"], op.get("dur", 0)
        return best

    return name


def cpu_memory_trace(fn: Callable[[], Any]) -> dict:
    """A memory trace of ``fn()`` on the CPU, in the layout of a CUDA snapshot's ``device_traces``.

    The profiler's memory events become ``{"action": "alloc" | "free_completed", "addr", "size",
    "time_us", "frames": [{"name": <innermost operator>, "filename": "", "line": 0}]}``, so
    :func:`allocation_timeline` and :func:`largest_allocation` read both alike. Returns
    ``{"segments": [], "device_traces": [events], "source": "cpu profiler"}``.
    """
    events, _ = _chrome_trace(fn)
    name = _innermost_ops(events)
    trace = []
    for e in _cpu_memory_events(events):
        nbytes = int(e["args"]["Bytes"])
        trace.append({"action": "alloc" if nbytes > 0 else "free_completed", "addr": e["args"].get("Addr", 0),
                      "size": abs(nbytes), "time_us": e["ts"],
                      "frames": [{"name": name(e), "filename": "", "line": 0}]})
    return {"segments": [], "device_traces": [trace], "source": "cpu profiler"}


def _trace(snapshot: dict, device_index: int) -> list[dict]:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device_index >= len(traces):
        raise ValueError(f"the snapshot has no trace for device {device_index}")
    return traces[device_index]


def allocation_timeline(snapshot: dict, device_index: int = 0) -> tuple[list[float], list[int]]:
    """Allocated bytes after each allocation or free in a snapshot's trace.

    Returns ``(times, allocated)``: times in milliseconds from the first event (event index when
    the trace has no ``time_us``), allocated bytes counted from the start of recording (memory
    allocated before recording began is not in the trace, so the curve starts at 0).

    Raises:
        ValueError: the snapshot has no trace for ``device_index``.
    """
    trace = [e for e in _trace(snapshot, device_index) if e.get("action") in ("alloc", "free_completed")]
    times, levels, level = [], [], 0
    t0 = trace[0].get("time_us", 0) if trace else 0
    for i, e in enumerate(trace):
        level += e["size"] if e["action"] == "alloc" else -e["size"]
        times.append((e["time_us"] - t0) / 1e3 if "time_us" in e else float(i))
        levels.append(level)
    return times, levels


def largest_allocation(snapshot: dict, device_index: int = 0) -> dict:
    """The largest single allocation in a snapshot's trace: ``{"size", "index", "frames"}``.

    ``size`` in bytes (on CUDA, rounded up to the allocator's block size), ``index`` its position
    in the trace, ``frames`` the stack recorded with it (innermost first).

    Raises:
        ValueError: no trace for ``device_index``, or no allocation in it.
    """
    allocs = [(e["size"], i, e) for i, e in enumerate(_trace(snapshot, device_index)) if e.get("action") == "alloc"]
    if not allocs:
        raise ValueError("the snapshot's trace holds no allocation")
    size, index, event = max(allocs, key=lambda t: (t[0], -t[1]))
    return {"size": int(size), "index": index, "frames": event.get("frames", [])}


def name_allocation(size: int, candidates: dict[str, int], rtol: float = 0.01) -> str | None:
    """The candidate whose size is within ``rtol`` of ``size`` (allocator rounding), or None."""
    for name, nbytes in sorted(candidates.items(), key=lambda kv: abs(kv[1] - size)):
        if abs(nbytes - size) <= rtol * nbytes:
            return name
    return None


# ----------------------------------------------------------------------------------------------
# the techniques


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer | None, x: torch.Tensor,
               y: torch.Tensor, micro_batches: int = 1, step: bool = True) -> float:
    """One training step of MSE loss on the batch ``(x, y)``, in ``micro_batches`` pieces.

    Gradient accumulation done right: gradients are cleared once, *before* the micro-batch loop
    (clearing them inside the loop would keep only the last micro-batch's gradient), and each
    micro-batch's loss is divided by ``micro_batches``, so the accumulated gradient is the
    gradient of the full batch's mean loss. Only one micro-batch's activations exist at a time.

    Args:
        x, y: ``(batch, ...)`` input and target; ``batch`` divisible by ``micro_batches``.
        optimizer: stepped once at the end when ``step`` (None or ``step=False``: gradients only).

    Returns:
        the full batch's loss (a float; the sum of the scaled micro-batch losses).

    Raises:
        ValueError: ``micro_batches`` not a positive int or not dividing the batch.
    """
    _positive_int("micro_batches", micro_batches)
    if x.shape[0] % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide the batch of {x.shape[0]}")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    total = torch.zeros((), device=x.device)
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        loss = F.mse_loss(model(xs), ys) / micro_batches
        loss.backward()
        total += loss.detach()
    if optimizer is not None and step:
        optimizer.step()
    return total.item()


def optimizer_in_backward(model: nn.Module, make_optimizer: Callable[[list], torch.optim.Optimizer]) -> dict:
    """Fuse the optimizer step into the backward pass: each parameter is updated, and its gradient
    freed, as soon as that gradient is complete.

    One optimizer per parameter, stepped from ``Tensor.register_post_accumulate_grad_hook`` (PyTorch
    tutorial "How to save memory by fusing the optimizer step into the backward pass"); the full set
    of gradients never exists at once. Call ``loss.backward()`` only: no ``optimizer.step()``.
    Gradient accumulation cannot be combined with it (each backward steps).

    Returns:
        ``{parameter: its optimizer}``; keep it alive as long as the hooks should run.
    """
    optimizers = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        optimizers[p] = make_optimizer([p])

        def hook(param: torch.Tensor) -> None:
            optimizers[param].step()
            optimizers[param].zero_grad(set_to_none=True)

        p.register_post_accumulate_grad_hook(hook)
    return optimizers


def max_relative_difference(a: Iterable[torch.Tensor | None], b: Iterable[torch.Tensor | None]) -> float:
    """``max |a_i - b_i| / max |b_i|`` over matching tensors (e.g. two models' gradients).

    Raises:
        ValueError: different numbers of tensors, mismatched shapes, or a None on one side only.
    """
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"got {len(a)} and {len(b)} tensors")
    diff, scale = 0.0, 0.0
    for i, (u, v) in enumerate(zip(a, b)):
        if (u is None) != (v is None):
            raise ValueError(f"tensor {i} is None on one side only")
        if u is None:
            continue
        if u.shape != v.shape:
            raise ValueError(f"tensor {i}: shapes {tuple(u.shape)} and {tuple(v.shape)} differ")
        diff = max(diff, (u.detach().double() - v.detach().double()).abs().max().item())
        scale = max(scale, v.detach().double().abs().max().item())
    return diff / scale if scale else diff


def freed_without_gc(make: Callable[[], Any], attribute: Callable[[Any], torch.Tensor]) -> bool:
    """True when the tensor ``attribute(obj)`` of ``obj = make()`` is freed as soon as ``obj`` is deleted.

    Reference counting frees an object the moment its last reference goes; objects in a reference
    cycle wait for the cyclic garbage collector. The check runs with ``gc`` disabled, drops the
    last reference and looks at a weak reference to the tensor.
    """
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        obj = make()
        ref = weakref.ref(attribute(obj))
        del obj
        alive = ref() is not None
    finally:
        if was:
            gc.enable()
        gc.collect()
    return not alive


# ----------------------------------------------------------------------------------------------
# the fragmentation experiment (runs in its own process)


def allocator_experiment(cap_mib: int = 2048, big_mib: int = 1600, piece_mib: int = 100,
                         request_mib: int = 500, device: str = "cuda") -> dict:
    """Fragment the caching allocator under a memory cap, then ask for one large block.

    1. cap the process at ``cap_mib`` (``torch.cuda.set_per_process_memory_fraction``);
    2. allocate and free one ``big_mib`` tensor: the allocator keeps that segment (reserved);
    3. allocate ``big_mib // piece_mib`` tensors of ``piece_mib``: the cached segment is split;
    4. free every other piece: half the segment is free, in ``piece_mib`` holes;
    5. ask for ``request_mib`` (more than a hole, less than the free total).

    With the default allocator a segment can only be returned to the driver when all of it is
    free, so step 5 needs new memory beyond the cap: an out-of-memory error although enough is
    free. With ``expandable_segments:True`` the allocator unmaps the free pages of a segment and
    maps them again where they are needed. On a CPU the same pattern runs without a cap (there is
    no caching allocator): only the bookkeeping is exercised.

    Returns a JSON-ready dict: ``alloc_conf`` (the environment variable as read), ``oom`` (bool),
    ``error`` (first line of the message or None), and ``allocated_mib``/``reserved_mib`` before
    the request (``before``) and at the end (``after``) (None on a CPU).

    Raises:
        ValueError: sizes that are not positive or a pattern that does not fit under the cap.
    """
    for name, v in (("cap_mib", cap_mib), ("big_mib", big_mib), ("piece_mib", piece_mib),
                    ("request_mib", request_mib)):
        _positive_int(name, v)
    if big_mib >= cap_mib or piece_mib > big_mib or request_mib <= piece_mib:
        raise ValueError("need piece_mib <= big_mib < cap_mib and request_mib > piece_mib")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is None:  # set_per_process_memory_fraction needs an index
        dev = torch.device("cuda", torch.cuda.current_device())

    def counters():
        if not cuda:
            return {"allocated_mib": None, "reserved_mib": None}
        return {"allocated_mib": torch.cuda.memory_allocated(dev) / MiB,
                "reserved_mib": torch.cuda.memory_reserved(dev) / MiB}

    mib = lambda n: torch.empty(n * MiB, dtype=torch.uint8, device=dev)  # noqa: E731
    if cuda:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(cap_mib * MiB / total, dev)
    big = mib(big_mib)
    del big
    pieces = [mib(piece_mib) for _ in range(big_mib // piece_mib)]
    for i in range(0, len(pieces), 2):
        pieces[i] = None
    before = counters()
    oom, error = False, None
    try:
        request = mib(request_mib)
        del request
    except torch.OutOfMemoryError as err:      # the outcome under study, reported, not hidden
        oom, error = True, str(err).splitlines()[0]
    after = counters()
    return {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "device": str(dev),
            "cap_mib": cap_mib, "big_mib": big_mib, "piece_mib": piece_mib, "request_mib": request_mib,
            "free_in_holes_mib": piece_mib * ((big_mib // piece_mib + 1) // 2),
            "oom": oom, "error": error, "before": before, "after": after}


def run_allocator_experiment(alloc_conf: str | None, device: str = "cuda", timeout_s: float = 120,
                             **sizes: int) -> dict:
    """Run :func:`allocator_experiment` in a fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF``
    set to ``alloc_conf`` (None: unset), and return its JSON result.

    The allocator reads the variable once, when CUDA initializes, so a notebook that already uses
    the GPU cannot change it for itself.

    Raises:
        RuntimeError: the child process failed (its stderr is in the message).
    """
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    args = [sys.executable, "-m", "perflab.memory.training", "fragmentation", "--device", device]
    for k, v in sizes.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"allocator experiment failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.memory.training")
    sub = parser.add_subparsers(dest="cmd", required=True)
    frag = sub.add_parser("fragmentation", help="the fragmentation experiment; prints JSON")
    frag.add_argument("--device", default="cuda")
    for name, default in (("cap-mib", 2048), ("big-mib", 1600), ("piece-mib", 100), ("request-mib", 500)):
        frag.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args(argv)
    result = allocator_experiment(args.cap_mib, args.big_mib, args.piece_mib, args.request_mib, args.device)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------------------------
# lab 7's checks (each raises perflab.labs.exercises.ExerciseFailed with one sentence when wrong)
