"""GPT-2 training ladders: every rung of chapter 10's speed ladder and memory ladder.

A *rung* (:class:`Rung`) is one complete training configuration of :class:`perflab.gpt2.model.GPT`:
batch, precision, compilation, attention kernel, optimizer, vocabulary, input pipeline,
gradient accumulation, activation checkpointing, head, residual dtype, CUDA graphs. The training
step itself, and the two ladders (lists of rungs, each one change away from the one before), are
written on chapter 10's page and exported from it to :mod:`perflab.gpt2.steps`; this module
measures them. :func:`train` runs a rung for a number of steps on real tokens (chapter 5's
offline corpus, :func:`perflab.loading.datasets.text_corpus`) and returns a :class:`RunResult`: tokens
per second over the timed steps, model FLOP utilization (MFU), peak memory, the loss of every
step and the GPU telemetry (clock, power cap) of the timed steps.

Conventions:

* tokens per second count the tokens the model is trained on (``batch x seq_len x accum`` per
  optimizer step), after ``warmup`` untimed steps (compilation, allocator warm-up, cuDNN/cuBLAS
  heuristics), over ``steps`` back-to-back steps with one synchronization at the end;
* MFU = tokens/s x :meth:`perflab.gpt2.model.GPT.flops_per_token` / peak FLOP/s (Chowdhery et al.,
  2022, appendix B), where the FLOPs count attention over the full ``T x T`` matrix although a
  causal kernel skips half of it: the convention nanoGPT and the PaLM paper use;
* every rung starts from the same initial weights (``seed``) and reads the same token windows in
  the same order, so the losses of two rungs over the same steps are comparable.
"""

from __future__ import annotations

import gc
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile as _profile

try:
    from torch.distributed.fsdp import fully_shard  # torch >= 2.6
except ImportError:  # torch 2.4-2.5 kept FSDP2 under its composable-API name
    from torch.distributed._composable.fsdp import fully_shard

from perflab.core.sampler import Telemetry
from perflab.core.timing import Stopwatch, synchronize
from perflab.core.validate import integer, positive, positive_int
from perflab.gpt2 import model as gpt2
from perflab.gpt2 import steps as gpt2_steps
from perflab.gpt2.steps import memory_ladder, speed_ladder
from perflab.memory import training as memory
from perflab.profiling import trace as profiling

__all__ = ["Rung", "RunResult", "StepBreakdown", "Timeline", "speed_ladder", "memory_ladder",
           "train", "last_parallel_rung", "ladder_table", "memory_table", "saving_table",
           "previous", "predict_peak", "logits_bytes", "rung_from_dict", "token_ids",
           "batches", "window_ids", "kernel_kind", "losses_agree", "mfu", "step_breakdown",
           "weight_matmul_flops"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ATTENTIONS = ("math", "sdpa")
RESIDUALS = ("fp32", "bf16")
OPTIMIZERS = ("foreach", "fused", "in_backward")
LOADERS = ("simple", "pinned")


@dataclass(frozen=True)
class Rung:
    """One training configuration of GPT-2.

    Attributes:
        name: the rung's label in tables and charts.
        model: a :data:`perflab.gpt2.model.CONFIGS` name (``"124M"`` ...).
        changes: fields of :class:`perflab.gpt2.model.GPTConfig` to change, as ``(name, value)`` pairs
            (a tiny model for a CPU: ``(("n_layer", 2), ("n_embd", 128), ("n_head", 4))``).
        batch: sequences per micro-batch.
        seq_len: tokens per sequence T (<= the model's ``block_size``).
        accum: micro-batches per optimizer step (gradient accumulation).
        precision: ``"fp32"`` (strict IEEE float32 matmuls), ``"tf32"`` (float32 tensors,
            TF32 tensor-core matmuls), ``"fp16"`` (``torch.autocast`` to float16 with
            ``torch.amp.GradScaler``) or ``"bf16"`` (autocast to bfloat16); weights, gradients
            and optimizer state stay float32.
        compile: compile each transformer block and the loss head with ``torch.compile``
            (regional compilation: one compilation serves all identical blocks).
        attention: ``"math"`` (softmax(QK^T)V written out) or ``"sdpa"``
            (``scaled_dot_product_attention``, PyTorch's choice of fused kernel).
        optimizer: AdamW ``"foreach"`` (PyTorch's default: a few kernels per group of tensors),
            ``"fused"`` (one fused kernel for all parameters) or ``"in_backward"`` (a fused
            step per parameter as soon as its gradient is complete, then the gradient is
            freed: in the last micro-batch's backward only, so with ``accum > 1`` every
            gradient still lives through the earlier micro-batches).
        vocab: rows of the embedding: 50,257 (GPT-2's tokenizer) or 50,304 (padded to a
            multiple of 64 and 128).
        loader: ``"simple"`` (the batch cut in the main process, copied pageable and blocking)
            or ``"pinned"`` (a ``DataLoader`` with two workers, pinned memory, non-blocking copies).
        checkpoint: recompute each block's activations in the backward
            (``torch.utils.checkpoint``, non-reentrant) instead of storing them.
        fp8: run the blocks' linear layers (qkv, attention projection, MLP) in FP8 with
            per-tensor dynamic scales through ``torch._scaled_mm`` (:func:`perflab.kernels.fp8.convert`:
            forward and both gradients; the tied head/embedding stays in the rung's precision).
            Needs FP8 tensor cores (compute capability >= 8.9) on a GPU; widths multiples of 16.
        fused_ce: the head by :func:`perflab.kernels.crossentropy.linear_cross_entropy`: product, loss
            and the gradient of the logits in one operator, the loss and gradient in one pass
            over the logits in the forward (a Triton kernel on a GPU).
        fp8_head: run the tied head's three products in FP8 with the fused loss
            (:func:`perflab.kernels.fp8.head_cross_entropy`: dynamic scales for features and weight,
            a static one for the logits' gradient, which a mean cross-entropy bounds by
            1 / tokens; ``fused_ce`` is then implied). Needs a vocabulary and width that are
            multiples of 16.
        residual: dtype of the residual stream (the embedding sum and every block's output):
            ``"fp32"`` (what autocast leaves it) or ``"bf16"`` (half the bytes of every layer
            norm and residual addition; the layer norms still compute in float32).
        graphs: compile the whole forward (embeddings, blocks, head and loss) as one graph
            with ``mode="reduce-overhead"``, so forward and backward replay as CUDA graphs
            (one launch each instead of hundreds of kernel launches); needs ``compile``, one
            process (not with DDP) and no activation checkpointing. On a CPU the same code
            compiles without graphs.
        step_graph: compile the whole forward plainly and capture the whole step (forward,
            backward and a capturable fused AdamW) as one CUDA graph by hand, replayed after
            the next batch is copied into its static inputs; needs ``compile``, bf16, the
            fused optimizer, one micro-batch, one process and no checkpointing. On a CPU the
            step runs uncaptured.
    """

    name: str
    model: str = "124M"
    changes: tuple = ()
    batch: int = 16
    seq_len: int = 1024
    accum: int = 1
    precision: str = "fp32"
    compile: bool = False
    attention: str = "math"
    optimizer: str = "foreach"
    vocab: int = gpt2.GPT2_VOCAB
    loader: str = "simple"
    checkpoint: bool = False
    fp8: bool = False
    fused_ce: bool = False
    fp8_head: bool = False
    residual: str = "fp32"
    graphs: bool = False
    step_graph: bool = False

    def __post_init__(self):
        for name in ("batch", "seq_len", "accum", "vocab"):
            v = getattr(self, name)
            positive_int(name, v)
        for name, allowed in (("precision", PRECISIONS), ("attention", ATTENTIONS),
                              ("optimizer", OPTIMIZERS), ("loader", LOADERS),
                              ("residual", RESIDUALS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.model not in gpt2.CONFIGS:
            raise ValueError(f"model must be one of {list(gpt2.CONFIGS)}, got {self.model!r}")
        if self.seq_len > self.config().block_size:
            raise ValueError(f"seq_len {self.seq_len} exceeds the model's block_size")
        if self.fp8_head and (self.vocab % 16 or self.config().n_embd % 16):
            raise ValueError(f"fp8_head needs vocab and n_embd that are multiples of 16, got "
                             f"vocab={self.vocab}, n_embd={self.config().n_embd}")
        if self.graphs and (not self.compile or self.checkpoint):
            raise ValueError("graphs needs compile=True and checkpoint=False")
        if self.step_graph and (not self.compile or self.checkpoint or self.graphs
                                or self.accum != 1 or self.precision != "bf16"
                                or self.optimizer != "fused"):
            raise ValueError("step_graph needs compile, bf16, the fused optimizer, accum=1, "
                             "and neither checkpoint nor graphs")
        if self.precision == "fp16" and self.optimizer == "in_backward":
            raise ValueError("the gradient scaler of fp16 cannot unscale a step taken inside "
                             "the backward: use bf16 with optimizer='in_backward'")
        if self.residual == "bf16" and self.precision != "bf16":
            raise ValueError("a bf16 residual stream needs bf16 autocast")

    def config(self) -> gpt2.GPTConfig:
        """The model's :class:`perflab.gpt2.model.GPTConfig` (vocabulary, attention and changes applied)."""
        att = "math" if self.attention == "math" else "sdpa"
        return gpt2.config(self.model, vocab_size=self.vocab, attention=att, **dict(self.changes))

    def then(self, name: str, **changes) -> "Rung":
        """This rung with ``changes`` applied, under a new ``name`` (the next rung of a ladder)."""
        return replace(self, name=name, **changes)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: ``batch x seq_len x accum``."""
        return self.batch * self.seq_len * self.accum


def padded(vocab: int, multiple: int = 64) -> int:
    """``vocab`` rounded up to a multiple of ``multiple`` (50,257 -> 50,304).

    Raises:
        ValueError: non-positive arguments.
    """
    if vocab < 1 or multiple < 1:
        raise ValueError(f"vocab and multiple must be positive, got {vocab}, {multiple}")
    return -(-vocab // multiple) * multiple


def last_parallel_rung(ladder: Sequence[Rung]) -> Rung:
    """The last rung of ``ladder`` that can run under DDP (not a ``graphs`` or ``step_graph``
    rung, which is compiled or captured for one process).

    Raises:
        ValueError: no such rung.
    """
    for rung in reversed(list(ladder)):
        if not (rung.graphs or rung.step_graph):
            return rung
    raise ValueError("every rung of the ladder is a graphs rung")


#: the name of the rung the issue calls "plain compiled bf16" (bf16, compile, SDPA, fused AdamW)
PLAIN_RUNG = "fused AdamW"


@dataclass
class RunResult:
    """What :func:`train` measured for one rung.

    Attributes:
        rung: the rung (as a dict).
        tokens_per_s: trained tokens per second over the timed steps.
        step_s: seconds per optimizer step over the timed steps (mean).
        flops_per_token: training FLOPs per token (6N + 12 L d T).
        peak_bytes: peak memory the caching allocator handed out (GPU) during the run, above
            what was already allocated when it started (tensors of earlier runs still alive in
            the process are not this rung's), else None.
        losses: the loss of every step, warm-up steps included (floats, nats).
        compile_s: seconds of the first step (compilation included) minus a timed step's.
        telemetry: the clock sentence of the timed steps (:meth:`TelemetrySummary.sentence`).
        clock_fraction: median SM clock / the chip's maximum over the timed steps (None on CPU).
        params: parameters counted by ``GPT.num_params()`` (non-embedding).
    """

    rung: dict
    tokens_per_s: float
    step_s: float
    flops_per_token: float
    peak_bytes: int | None
    losses: list[float]
    compile_s: float
    telemetry: str
    clock_fraction: float | None
    params: int
    extra: dict = field(default_factory=dict)

    def mfu(self, peak_flops: float) -> float:
        """Model FLOP utilization against ``peak_flops`` (FLOP/s). Raises ValueError if <= 0."""
        return mfu(self.tokens_per_s, self.flops_per_token, peak_flops)

    def as_dict(self) -> dict:
        return asdict(self)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOP utilization: ``tokens_per_s x flops_per_token / peak_flops`` (a fraction).

    Source of the definition: Chowdhery et al. (2022), PaLM, appendix B.

    Raises:
        ValueError: a non-positive peak or flops_per_token, or negative tokens_per_s.
    """
    if not peak_flops > 0 or not flops_per_token > 0 or tokens_per_s < 0:
        raise ValueError(f"need peak_flops > 0, flops_per_token > 0, tokens_per_s >= 0; got "
                         f"{peak_flops}, {flops_per_token}, {tokens_per_s}")
    return tokens_per_s * flops_per_token / peak_flops


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def window_ids(step: int, batch: int, n_windows: int, rank: int = 0, world: int = 1,
               start: int = 0) -> list[int]:
    """The token windows that ``rank`` of ``world`` reads in micro-step ``step`` (0, 1, ...).

    Data parallelism shards one stream, as ``torch.utils.data.DistributedSampler`` does (no
    shuffle): the windows are dealt round-robin to the ranks, so micro-step ``k`` of rank ``r``
    reads windows ``start + (k * batch + b) * world + r`` for ``b < batch`` (modulo
    ``n_windows``). In one micro-step the ranks read ``world x batch`` distinct windows, and
    consecutive micro-steps (gradient accumulation, the next optimizer step) never read a
    window again until the stream wraps around. With ``world == 1`` the windows are simply
    consecutive.

    Raises:
        ValueError: ``rank`` outside ``[0, world)``, or fewer windows than one micro-step of all
            ranks needs.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world={world}), got {rank}")
    if n_windows < batch * world:
        raise ValueError(f"{n_windows} windows cannot feed {world} rank(s) x batch={batch}")
    return [(start + (step * batch + b) * world + rank) % n_windows for b in range(batch)]


def batches(tokens: np.ndarray, batch: int, seq_len: int, start: int = 0, rank: int = 0,
            world: int = 1):
    """``(x, y)`` int64 CPU batches ``(batch, seq_len)`` from a 1-D token array, for one rank.

    Window ``i`` is ``tokens[i*seq_len : (i+1)*seq_len + 1]`` (``x`` its first ``seq_len``
    tokens, ``y`` the same shifted by one); micro-step ``k`` reads the windows
    :func:`window_ids` gives ``rank`` of ``world`` (consecutive windows for one process), so
    every rung reads the same tokens in the same order and no two ranks read the same window.

    Raises:
        ValueError: fewer tokens than one micro-step of all ranks needs.
    """
    n_windows = (len(tokens) - 1) // seq_len
    if n_windows < batch * world:
        raise ValueError(f"{len(tokens)} tokens hold {n_windows} windows of {seq_len}; "
                         f"need at least batch x world = {batch * world}")
    step = 0
    while True:
        rows = window_ids(step, batch, n_windows, rank, world, start)
        w = np.stack([tokens[r * seq_len: r * seq_len + seq_len + 1] for r in rows])
        w = torch.from_numpy(w.astype(np.int64))
        yield w[:, :-1], w[:, 1:]
        step += 1


class _Windows(torch.utils.data.Dataset):
    """Window ``i`` of a token array as ``(x, y)`` (for the DataLoader of the pinned loader)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i):
        L = self.seq_len
        w = torch.from_numpy(self.tokens[i * L: i * L + L + 1].astype(np.int64))
        return w[:-1], w[1:]


def _pinned_batches(tokens: np.ndarray, batch: int, seq_len: int, rank: int = 0,
                    world: int = 1):
    ds = _Windows(tokens, seq_len)
    if len(ds) < batch * world:
        raise ValueError(f"{len(tokens)} tokens hold {len(ds)} windows; need batch x world = "
                         f"{batch * world}")
    # the order of batches(): this rank's windows rank, rank + world, ... (a distributed
    # sampler without shuffling), the ragged end dropped
    mine = range(rank, len(ds) - len(ds) % (batch * world), world)
    while True:
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=mine, num_workers=2,
                                             pin_memory=torch.cuda.is_available(),
                                             drop_last=True, prefetch_factor=4)
        yield from loader


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

#: the most allocator events a snapshot keeps (one eager step of 8 micro-batches makes ~40,000)
_SNAPSHOT_EVENTS = 400_000


def _counting(stream, read: list):
    """``stream``'s batches, appending each micro-step's index to ``read`` as it is taken."""
    for item in stream:
        read.append(len(read))
        yield item


def train(rung: Rung, tokens: np.ndarray, steps: int, device: torch.device | str,
          warmup: int = 2, seed: int = 0, lr: float = 3e-4, ddp: Any = None,
          profile: bool = False, snapshot: str | None = None,
          snapshot_events: int = _SNAPSHOT_EVENTS) -> RunResult:
    """Train GPT-2 by ``rung`` for ``warmup + steps`` optimizer steps; time the last ``steps``.

    Args:
        rung: the configuration.
        tokens: 1-D array of token ids (uint16 memmap or any integer array), all ids below
            ``rung.vocab``.
        steps: timed optimizer steps (>= 1).
        device: where to train.
        warmup: untimed steps first (compilation happens in the first).
        seed: initial weights (the same for every rung with the same seed and model on the
            same device: they are drawn on ``device``, so a GPU's differ from a CPU's).
        lr: AdamW learning rate (betas 0.9, 0.95, weight decay 0.1 on matrices).
        ddp: a callable wrapping the model for data parallelism (e.g. ``DistributedDataParallel``
            with its arguments bound), or None. With DDP each rank reads its own windows.
        profile: after the timed steps, profile one more step with ``torch.profiler`` and put
            its kernels in ``result.extra["kernels"]``: ``[(name, seconds), ...]``, the
            12 longest rows of the profiler's table (device time on a GPU, where ATen operators
            and the kernels they launch both appear, so do not sum it; self CPU time on a
            CPU), and every device kernel in ``result.extra["device_kernels"]`` (GPU: the
            device-side events only, each kernel counted once, for :func:`step_breakdown`;
            CPU: every operator's self CPU time), and the step's busy time and idle gaps in
            ``result.extra["timeline"]`` (a :class:`Timeline`, or None).
        snapshot: a file to write a CUDA memory snapshot of one more step to
            (``torch.cuda.memory._dump_snapshot``, for https://pytorch.org/memory_viz); ignored
            on a CPU (``result.extra["snapshot"]`` is None there).
        snapshot_events: the most allocator events the snapshot keeps (the last ones; about
            100 bytes of file each); ``result.extra["snapshot_complete"]`` says whether the
            whole step fitted.

    Returns:
        A :class:`RunResult`; the model and optimizer are freed before it returns.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 0, or token ids outside the vocabulary.
    """
    positive_int("steps", steps)
    integer("warmup", warmup, 0)
    if not isinstance(rung, Rung):
        raise TypeError(f"rung must be a Rung, got {type(rung).__name__}")
    device = torch.device(device)
    top = int(np.max(tokens[: 1 << 20])) if len(tokens) else 0
    if top >= rung.vocab:
        raise ValueError(f"tokens hold id {top}, outside the vocabulary of {rung.vocab}")
    cfg = rung.config()
    if (rung.graphs or rung.step_graph) and ddp is not None:
        raise ValueError("a graphs or step_graph rung runs in one process: train it without ddp")
    torch.compiler.reset()
    held = 0
    if device.type == "cuda":
        gc.collect()                     # earlier runs' models in reference cycles
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)   # not this run's: left out
    torch.manual_seed(seed)
    with device:        # the weights are made where they train: no host init, no copy
        model = gpt2.GPT(cfg)
    # the page's step (chapter 10, perflab.gpt2.steps): this function only measures it
    net = gpt2_steps.make_net(model, rung, ddp)
    opt = gpt2_steps.make_optimizer(model, rung, lr)
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    # one stream of windows dealt to the ranks (window_ids): no two ranks, and no two
    # micro-steps, read the same tokens
    if rung.loader == "pinned":
        stream = _pinned_batches(tokens, rung.batch, rung.seq_len, rank, world)
    else:
        stream = batches(tokens, rung.batch, rung.seq_len, rank=rank, world=world)
    n_windows = (len(tokens) - 1) // rung.seq_len
    read: list[int] = []      # micro-steps read so far (their windows: window_ids)
    stream = _counting(stream, read)
    if rung.step_graph and device.type == "cuda":
        # two eager warm-up steps, then the capture: time only replays
        warmup = max(warmup, 3)
        one_step = gpt2_steps.make_graphed_step(net, opt, rung, stream, device, warmup=2)
    else:
        one_step = gpt2_steps.make_step(net, opt, rung, stream, device)
    losses: list[torch.Tensor] = []

    def step():
        losses.append(one_step())

    first_step = Stopwatch(device).start()
    first = None
    for i in range(warmup):
        step()
        if i == 0:
            first = first_step.elapsed()
    with Telemetry(index=device.index or 0 if device.type == "cuda" else 0) as tel:
        with Stopwatch(device) as timed:
            for _ in range(steps):
                step()
    summary = tel.summary()
    step_s = timed.seconds / steps
    # the losses of the warm-up and timed steps only: a profiled or snapshot step (CUDA only)
    # would give rungs different counts, and the memory table compares them element by element
    n_losses = len(losses)
    # the windows of the timed steps, so that a data-parallel run can count distinct tokens
    timed_reads = read[len(read) - steps * rung.accum:]
    extra = {"windows": sorted({w for k in timed_reads for w in window_ids(
        k, rung.batch, n_windows, rank, world)})}
    if profile:
        extra.update(_profile_step(step, device))
    if snapshot is not None:
        extra["snapshot"] = None
        if device.type == "cuda":
            # the step's last `snapshot_events` events (the default keeps every event of
            # an eager step of 8 micro-batches), stacks cut to 8 frames
            snap = memory.record_snapshot(step, max_entries=snapshot_events, max_frames=8)
            events = sum(len(t) for t in snap.get("device_traces", []))
            extra["snapshot_events"] = events
            extra["snapshot_complete"] = events < snapshot_events
            memory.save_snapshot(snap, snapshot)
            extra["snapshot"] = str(snapshot)
    peak = torch.cuda.max_memory_allocated(device) - held if device.type == "cuda" else None
    result = RunResult(
        rung=asdict(rung), tokens_per_s=rung.tokens_per_step / step_s, step_s=step_s,
        flops_per_token=model.flops_per_token(rung.seq_len), peak_bytes=peak,
        losses=[float(v) for v in torch.stack(losses[:n_losses]).cpu()],
        compile_s=max(0.0, (first if first is not None else step_s) - step_s),
        telemetry=summary.sentence(), clock_fraction=summary.clock_fraction,
        params=model.num_params(), extra=extra)
    del net, model, opt, one_step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


@dataclass(frozen=True)
class Timeline:
    """When a profiled step's device was busy (from its trace, :func:`perflab.profiling.trace.summarize_trace`).

    Attributes:
        window_s: first kernel's start to last kernel's end (CPU: outermost ATen operators), s.
        busy_s: time in which at least one kernel ran, s.
        kernels: kernels in the window.
        gaps_s: every idle gap between consecutive busy intervals, in order, s.
    """

    window_s: float
    busy_s: float
    kernels: int
    gaps_s: tuple

    @property
    def idle_s(self) -> float:
        """Idle time inside the window (s): ``window_s - busy_s``."""
        return self.window_s - self.busy_s

    def idle_in_gaps_below(self, threshold_s: float) -> float:
        """Seconds of idle time in gaps shorter than ``threshold_s`` (the boundaries between
        back-to-back kernels), as opposed to long waits.

        Raises:
            ValueError: ``threshold_s`` <= 0.
        """
        positive("threshold_s", threshold_s)
        return sum(g for g in self.gaps_s if g < threshold_s)

    @property
    def median_gap_s(self) -> float:
        """Median idle gap (s); 0 without gaps."""
        return float(np.median(self.gaps_s)) if self.gaps_s else 0.0


def _timeline(prof) -> Timeline | None:
    """The :class:`Timeline` of a finished ``torch.profiler`` session (None if its trace holds
    no work)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        try:
            t = profiling.summarize_trace(str(path))
        except ValueError:
            return None
    return Timeline(t.window_us * 1e-6, t.busy_us * 1e-6, t.items,
                    tuple(g * 1e-6 for g in t.gaps_us))


def _profile_step(step, device: torch.device, n: int = 12) -> dict:
    """Profile one call of ``step()``: ``{"kernels": the n longest rows of the profiler's
    table, "device_kernels": every device-side event (GPU) or operator (CPU), by name}``,
    each ``[(name, seconds), ...]``, the longest first, and ``"timeline"``: the step's
    :class:`Timeline` (busy time and idle gaps)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _profile(activities=acts) as prof:
        step()
        synchronize(device)
    timeline = _timeline(prof)
    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = e.self_cuda_time_total
        else:
            t = e.self_cpu_time_total
        if t > 0:
            rows.append((e.key, t * 1e-6))
    rows.sort(key=lambda r: -r[1])
    if device.type != "cuda":
        return {"kernels": rows[:n], "device_kernels": rows, "timeline": timeline}
    # an ATen operator's row carries the device time of the kernels it launched, and a
    # kernel Inductor launches under a record_function of its own name shares that name:
    # only the device-side events count each kernel once
    return {"kernels": rows[:n], "device_kernels": _device_rows(prof.events()),
            "timeline": timeline}


def _device_rows(events) -> list[tuple[str, float]]:
    """``[(name, seconds)]`` summed over the device-side events (kernels, copies, memsets) of a
    profile's ``events()``, the longest first; host-side operators are left out."""
    totals: dict[str, float] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time_total * 1e-6
    return sorted(((k, v) for k, v in totals.items() if v > 0), key=lambda r: -r[1])


#: substrings of attention kernels (flash, cuDNN's SDPA, xFormers/CUTLASS fmha, ATen's CPU SDPA)
_ATTENTION = ("flash", "fmha", "sdpa", "attention", "scaled_dot_product")
#: substrings of matrix-product kernels (cuBLAS: gemm, nvjet (Hopper), cutlass, xmma; ATen ops
#: on a CPU; Inductor's Triton matmul templates ``triton_tem_*mm*``)
_MATMUL = ("gemm", "nvjet", "cublas", "cutlass", "xmma")
_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
               "aten::addbmm", "aten::matmul")


def kernel_kind(name: str) -> str:
    """``"attention"``, ``"matmul"`` or ``"other"`` for a profiled kernel (or CPU operator) name.

    Attention is tested first (a fused attention kernel multiplies matrices too, and its name
    may say so); Inductor's pointwise and reduction kernels (``triton_poi_``, ``triton_red_``,
    ``triton_per_``) are ``"other"`` even when their name lists the ``addmm`` whose bias they
    fused.

    Raises:
        TypeError: ``name`` is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    low = name.lower()
    if any(k in low for k in _ATTENTION):
        return "attention"
    if low.startswith(("triton_poi", "triton_red", "triton_per")):
        return "other"
    if any(k in low for k in _MATMUL) or low.split("(")[0].strip() in _MATMUL_OPS:
        return "matmul"
    if low.startswith("triton_tem") and "mm" in low:
        return "matmul"
    return "other"


@dataclass(frozen=True)
class StepBreakdown:
    """A profiled step's device time split into matrix products, attention and the rest.

    Attributes:
        matmul_s, attention_s, other_s: seconds of kernels of each kind (:func:`kernel_kind`).
    """

    matmul_s: float
    attention_s: float
    other_s: float

    @property
    def total_s(self) -> float:
        """All kernel time (s): the device's busy time if kernels do not overlap."""
        return self.matmul_s + self.attention_s + self.other_s

    def share(self, kind: str) -> float:
        """Fraction of :attr:`total_s` spent in ``kind`` (``"matmul"``, ``"attention"``,
        ``"other"``).

        Raises:
            ValueError: an unknown kind, or no kernel time at all.
        """
        if kind not in ("matmul", "attention", "other"):
            raise ValueError(f"kind must be 'matmul', 'attention' or 'other', got {kind!r}")
        if self.total_s <= 0:
            raise ValueError("the breakdown holds no kernel time")
        return getattr(self, f"{kind}_s") / self.total_s

    def rate(self, matmul_flops: float) -> float:
        """Achieved matrix-product rate (FLOP/s) if the step's matmuls do ``matmul_flops``.

        Raises:
            ValueError: ``matmul_flops`` negative, or no matmul time.
        """
        if matmul_flops < 0:
            raise ValueError(f"matmul_flops must be >= 0, got {matmul_flops}")
        if self.matmul_s <= 0:
            raise ValueError("the breakdown holds no matmul time")
        return matmul_flops / self.matmul_s


def step_breakdown(kernels: Sequence[tuple[str, float]]) -> StepBreakdown:
    """Sum a profiled step's kernels by kind (:func:`kernel_kind`).

    Args:
        kernels: ``[(name, seconds), ...]``, each kernel once, e.g. ``train(...,
            profile=True).extra["device_kernels"]`` (not ``extra["kernels"]``, which is cut to
            12 rows and, on a GPU, lists operators beside their kernels).

    Raises:
        ValueError: a negative time.
    """
    sums = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for name, seconds in kernels:
        if seconds < 0:
            raise ValueError(f"kernel {name!r} has a negative time {seconds}")
        sums[kernel_kind(name)] += float(seconds)
    return StepBreakdown(sums["matmul"], sums["attention"], sums["other"])


def weight_matmul_flops(params: int, tokens: int) -> float:
    """FLOPs of a training step's weight matrix products: ``6 x params x tokens`` (2 per weight
    and token forward, 4 backward; Kaplan et al., 2020). ``params`` as
    :meth:`perflab.gpt2.model.GPT.num_params` counts them (the tied head included, the position
    embedding left out); attention's ``QK^T`` and ``AV`` are not included.

    Raises:
        ValueError: a non-positive argument.
    """
    if params < 1 or tokens < 1:
        raise ValueError(f"params and tokens must be positive, got {params}, {tokens}")
    return 6.0 * params * tokens


def attention_kernel(kernels: Sequence[tuple[str, float]]) -> str:
    """Which fused attention ran, from a profiled step's kernel names: ``"cuDNN"``,
    ``"flash"``, ``"memory-efficient"``, ``"math"`` (no fused kernel) or ``"unknown"``."""
    names = " ".join(k.lower() for k, _ in kernels)
    if "cudnn" in names and ("attention" in names or "sdpa" in names or "fmha" in names):
        return "cuDNN"
    if "flash" in names:
        return "flash"
    if "efficient" in names or "fmha" in names:
        return "memory-efficient"
    if "softmax" in names:
        return "math"
    return "unknown"


def losses_agree(a: Sequence[float], b: Sequence[float], rtol: float = 0.02,
                 window: int = 5) -> tuple[bool, float]:
    """Do two loss curves over the same tokens agree? Returns ``(agree, worst)``.

    The curves are smoothed by a running mean over ``window`` steps (single steps are noisy),
    and ``worst`` is the largest relative difference ``|a - b| / b`` of the smoothed curves;
    they agree when ``worst <= rtol``.

    Raises:
        ValueError: curves of different lengths, shorter than ``window``, or non-finite values.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"the curves must be 1-D and of the same length, got {a.shape}, {b.shape}")
    if len(a) < window or window < 1:
        raise ValueError(f"need window >= 1 and at least window={window} steps, got {len(a)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the loss curves hold non-finite values")
    k = np.ones(window) / window
    sa, sb = np.convolve(a, k, "valid"), np.convolve(b, k, "valid")
    worst = float(np.max(np.abs(sa - sb) / np.abs(sb)))
    return worst <= rtol, worst


def rung_from_dict(rung: dict) -> Rung:
    """A :class:`Rung` from its ``asdict`` form (as it travels to ``torchrun`` workers: JSON
    turns the ``changes`` pairs into lists)."""
    return Rung(**{k: tuple(tuple(c) for c in v) if k == "changes" else v
                   for k, v in rung.items()})


def token_ids(tokens: str | None, n_tokens: int = 4_000_000, id_range: int = 8192) -> np.ndarray:
    """The token ids a worker trains on: the uint16 file ``tokens`` (memory-mapped), or, when
    None, ``n_tokens`` seeded random ids below ``id_range`` (the same on every rank)."""
    if tokens is not None:
        return np.memmap(tokens, dtype=np.uint16, mode="r")
    return np.random.default_rng(0).integers(0, id_range, n_tokens).astype(np.uint16)


def distributed_task(ctx, rung: dict, steps: int, warmup: int = 2, tokens: str | None = None,
                     n_tokens: int = 4_000_000, id_range: int = 8192,
                     fsdp: bool = False) -> dict:
    """One rank's part of a data-parallel GPT-2 run (task ``perflab.gpt2.multi_gpu:ddp_run``).

    ``rung`` is a :class:`Rung` as a dict; ``tokens`` the path of a uint16 token file (None:
    ``n_tokens`` seeded random ids below ``id_range``, the same on every rank). Each rank trains
    ``rung.batch`` sequences per micro-batch on its own windows; ``fsdp`` shards parameters,
    gradients and optimizer state with FSDP2's ``fully_shard`` on every block and the root
    instead of replicating them with DDP. Returns the rank's :meth:`RunResult.as_dict`
    (tokens/s of this rank; the slowest rank's step time is in ``extra["max_step_s"]``).
    """
    r = rung_from_dict(rung)
    ids = token_ids(tokens, n_tokens, id_range)
    if fsdp:
        wrap = _fsdp_wrapper(ctx)
    else:
        ids_ = [ctx.device.index] if ctx.device.type == "cuda" else None

        def wrap(module):
            return DistributedDataParallel(module, device_ids=ids_)
    res = train(r, ids, steps, ctx.device, warmup=warmup, ddp=wrap)
    res.extra["max_step_s"] = ctx.max_over_ranks(res.step_s)
    res.extra["world_size"] = ctx.world
    # tokens/s of the whole job counts each window once: the union over ranks of the windows
    # their timed steps read (equal to world x this rank's when the stream is sharded)
    every = [None] * ctx.world
    ctx.dist.all_gather_object(every, res.extra["windows"])
    distinct = len(set().union(*map(set, every)))
    res.extra["distinct_windows"] = distinct
    res.extra["job_tokens_per_s"] = distinct * r.seq_len / (steps * res.extra["max_step_s"])
    return res.as_dict()


def _fsdp_wrapper(ctx):
    def wrap(module):
        for block in module.model.blocks:
            fully_shard(block)
        fully_shard(module)
        return module
    return wrap


def static_bytes_per_param(rung: Rung) -> float:
    """Bytes per parameter that live through a whole step: float32 weights (4), gradients (4)
    and AdamW's two moments (8) = 16 (Rajbhandari et al., 2020, ZeRO, section 3.1, for fp32
    training).

    With the optimizer step in the backward *and no gradient accumulation* each gradient is
    freed as soon as its parameter is updated, so only 12 stay (and one parameter's gradient at
    a time). Under accumulation a gradient must survive every micro-batch but the last (the
    step can only run once it is complete), so all of them are alive through the earlier
    micro-batches' backwards: 16, as without the hook."""
    return 12.0 if rung.optimizer == "in_backward" and rung.accum == 1 else 16.0


#: bytes per logit alive at the start of an eager plain head's backward under autocast: the
#: float32 log-softmax saved for the backward (4), the float32 gradient it makes (4) and its
#: bf16 cast (2)
LOGIT_BYTES = 10


def logits_bytes(rung: Rung) -> float:
    """Bytes of the logits' tensors at the head's backward for one micro-batch of ``rung``:
    ``batch x seq_len x vocab x`` :data:`LOGIT_BYTES` (the plain head; a fused head keeps
    less). They depend on the micro-batch and the vocabulary, not on the model's size."""
    return float(rung.batch * rung.seq_len * rung.vocab * LOGIT_BYTES)


def predict_peak(peak_bytes: float, rung: Rung, params: int, target: gpt2.GPTConfig) -> float:
    """Predicted peak bytes of ``rung`` for the model ``target``, from its peak measured on the
    model of ``rung`` (``params`` parameters).

    The measured peak is split into three parts that scale differently: static bytes
    (:func:`static_bytes_per_param` x parameters), the logits (:func:`logits_bytes`: the same
    micro-batch and vocabulary give the same logits whatever the model), and the rest
    (activations, workspace), scaled by ``n_layer x n_embd``: at a fixed number of tokens, a
    block's saved activations grow with the width (Korthikanti et al., 2023: 34·s·b·h bytes per
    layer in 16-bit with a fused attention).

    Raises:
        ValueError: a non-positive peak or parameter count, or a peak below the static bytes.
    """
    if peak_bytes <= 0 or params <= 0:
        raise ValueError(f"peak_bytes and params must be positive, got {peak_bytes}, {params}")
    per = static_bytes_per_param(rung)
    rest = peak_bytes - per * params
    if rest < 0:
        raise ValueError(f"peak_bytes {peak_bytes:.3g} is below the static bytes {per * params:.3g}")
    logits = min(rest, logits_bytes(rung))
    src = rung.config()
    with torch.device("meta"):
        n_target = gpt2.GPT(target).num_params()
    scale = (target.n_layer * target.n_embd) / (src.n_layer * src.n_embd)
    return per * n_target + logits + (rest - logits) * scale


# ---------------------------------------------------------------------------------------------
# Tables for chapter 10 (bookkeeping: the page shows the table, not its assembly)
# ---------------------------------------------------------------------------------------------

def _md(header: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> str:
    """A Markdown table: the first ``right`` columns left-aligned, the others right-aligned."""
    align = ["---" if i < right else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def previous(names: Sequence[str], name: str) -> str:
    """The rung before ``name`` in ``names``.

    Raises:
        ValueError: ``name`` is the first or not in ``names``.
    """
    i = list(names).index(name)
    if i == 0:
        raise ValueError(f"{name!r} is the first rung: it has no previous one")
    return list(names)[i - 1]


def ladder_table(results: dict, peak_sheet: float | None, peak_meas: float,
                 own: dict) -> str:
    """Chapter 10's speed-ladder table (Markdown): tokens/s, MFU against the datasheet and the
    measured bf16 ceiling, MFU against the ceiling of the rung's own matmul format (``own``:
    ``{precision: FLOP/s}``), ratios to the previous rung and the baseline, peak GiB, the first
    step's extra seconds (compilation) and the SM clock over its maximum."""
    names = list(results)
    first = results[names[0]]
    rows, prev = [], None
    for name in names:
        r = results[name]
        mine = own.get(r.rung["precision"]) or peak_meas
        rows.append([
            name, f"{r.tokens_per_s:,.0f}",
            f"{r.mfu(peak_sheet):.1%}" if peak_sheet else "-",
            f"{r.mfu(peak_meas):.1%}", f"{r.mfu(mine):.0%}",
            f"{r.tokens_per_s / (prev or r.tokens_per_s):.2f}x",
            f"{r.tokens_per_s / first.tokens_per_s:.1f}x",
            "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**30:.1f}",
            f"{r.compile_s:.1f}",
            "-" if r.clock_fraction is None else f"{r.clock_fraction:.2f}"])
        prev = r.tokens_per_s
    return _md(["rung", "tokens/s", "MFU (datasheet)", "MFU (bf16 ceiling)",
                "of own ceiling", "vs previous", "vs baseline", "peak GiB",
                "first step +s", "SM clock / max"], rows)


def saving_table(results: dict, predicted: dict) -> tuple[str, dict]:
    """Each predicted rung's saving against its prediction, split into kernels and gaps.

    For every ``name`` in ``predicted`` (seconds saved per step, predicted from the profile of
    the rung before), the measured saving is the previous rung's step time minus this one's;
    its part in the kernels is the change of the profiled step's busy time (its
    :class:`Timeline`), the rest is what the gaps between kernels gave. Returns the Markdown
    table and ``{key: (name, verdict, cause)}``, ``key`` the first word of the name, lower
    case (``"fused"``, ``"fp8"``, ``"bf16"``...; ``"bf16 residual"`` is ``"residual"``,
    ``"one graph per step"`` ``"step"``, ``"CUDA graphs"`` ``"graphs"``), the verdict
    ``"close to its prediction"`` within a factor 1.5 either way.

    Raises:
        ValueError: a predicted rung, or the rung before it, was trained without
            ``profile=True`` (no timeline to split the saving by).
    """
    names = list(results)
    rows, out = [], {}
    keys = {"bf16 residual": "residual", "one graph per step": "step", "CUDA graphs": "graphs"}
    for name, pred in predicted.items():
        before, after = results[previous(names, name)], results[name]
        for r in (before, after):
            if r.extra.get("timeline") is None:
                raise ValueError(f"results: rung {r.rung['name']!r} has no profiled timeline; "
                                 f"train it with profile=True (it is {name!r} or the rung before)")
        saved = before.step_s - after.step_s
        busy = before.extra["timeline"].busy_s - after.extra["timeline"].busy_s
        gaps = saved - busy
        ratio = saved / pred if pred > 0 else float("inf")
        verdict = ("close to its prediction" if 2 / 3 <= ratio <= 1.5 else
                   "more than predicted" if ratio > 1.5 else "less than predicted")
        cause = (f"the kernels' own time {'fell' if busy >= 0 else 'rose'} by "
                 f"{abs(busy) * 1e3:.1f} ms, the gaps between them "
                 f"{'fell' if gaps >= 0 else 'rose'} by {abs(gaps) * 1e3:.1f} ms")
        out[keys.get(name, name.split()[0].lower())] = (name, verdict, cause)
        rows.append([name, f"{pred * 1e3:.1f}", f"{saved * 1e3:.1f}", f"{busy * 1e3:.1f}",
                     f"{gaps * 1e3:.1f}",
                     f"{after.tokens_per_s / before.tokens_per_s:.3f}x"])
    return _md(["rung", "predicted saving (ms/step)", "measured saving", "in kernels",
                "in gaps", "vs previous"], rows), out


def memory_table(results: dict) -> str:
    """Chapter 10's memory-ladder table (Markdown): peak GiB, step ms, last loss, and whether
    the losses equal the first rung's within 2 %."""
    names = list(results)
    first = results[names[0]]
    rows = []
    for name in names:
        r = results[name]
        same = np.allclose(r.losses, first.losses, rtol=2e-2)
        rows.append([name, "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**30:.2f}",
                     f"{r.step_s * 1e3:.1f}", f"{r.losses[-1]:.4f}", "yes" if same else "no"])
    return _md(["rung", "peak memory (GiB)", "step (ms)", "loss after the last step",
                "same losses as baseline"], rows)
