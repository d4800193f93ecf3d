"""GPT-2 training configurations (rungs) and what they predict: MFU, bytes per parameter, peak memory.

A *rung* (:class:`Rung`) is one complete training configuration of :class:`perflab.gpt2.model.GPT`:
batch, precision, compilation, attention kernel, optimizer, vocabulary, input pipeline,
gradient accumulation, activation checkpointing, head, residual dtype, CUDA graphs. The training
step itself, and the two ladders (lists of rungs, each one change away from the one before), are
written on chapter 10's page and exported from it to :mod:`perflab.gpt2.steps`;
:func:`perflab.gpt2.train.train` runs a rung and returns a :class:`RunResult`.

Conventions:

* tokens per second count the tokens the model is trained on (``batch x seq_len x accum`` per
  optimizer step);
* MFU = tokens/s x :meth:`perflab.gpt2.model.GPT.flops_per_token` / peak FLOP/s (Chowdhery et al.,
  2022, appendix B), where the FLOPs count attention over the full ``T x T`` matrix although a
  causal kernel skips half of it: the convention nanoGPT and the PaLM paper use;
* the memory predictions (:func:`static_bytes_per_param`, :func:`logits_bytes`,
  :func:`predict_peak`) split a measured peak into parts that scale differently with the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import torch

from perflab.core.validate import number, one_of, positive, positive_int
from perflab.gpt2.model import CONFIGS, GPT, GPT2_VOCAB, GPTConfig, config

__all__ = ["PRECISIONS", "ATTENTIONS", "RESIDUALS", "OPTIMIZERS", "LOADERS", "Rung", "padded",
           "last_parallel_rung", "PLAIN_RUNG", "RunResult", "mfu", "rung_from_dict",
           "static_bytes_per_param", "LOGIT_BYTES", "logits_bytes", "predict_peak",
           "checkpointed_inputs_bytes", "fp8_supported", "batch_scale", "causal_flops_per_token",
           "fp8_block_operands", "fp8_step_ratio"]


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
        l2_rows: launch the fused head's row pass (:func:`perflab.gpt2.heads.loss_and_grad`)
            with 32 warps per row instead of 8, so that no more than two rows run per SM and
            the rows in flight (about 264 x 100 KB at GPT-2's vocabulary on an H200) fit in L2:
            the pass's second read of each row should then come from L2, not from memory.
            Needs ``fused_ce`` or ``fp8_head``; a hypothesis the next rung tests, off in the
            ladder by default (chapter 10, "The next rung").
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
    vocab: int = GPT2_VOCAB
    loader: str = "simple"
    checkpoint: bool = False
    fp8: bool = False
    fused_ce: bool = False
    fp8_head: bool = False
    residual: str = "fp32"
    graphs: bool = False
    step_graph: bool = False
    l2_rows: bool = False

    def __post_init__(self):
        for name in ("batch", "seq_len", "accum", "vocab"):
            v = getattr(self, name)
            positive_int(name, v)
        for name, allowed in (("precision", PRECISIONS), ("attention", ATTENTIONS),
                              ("optimizer", OPTIMIZERS), ("loader", LOADERS),
                              ("residual", RESIDUALS)):
            one_of(name, getattr(self, name), allowed)
        one_of("model", self.model, CONFIGS)
        if self.seq_len > self.config().block_size:
            raise ValueError(f"seq_len {self.seq_len} exceeds the model's block_size")
        if self.l2_rows and not (self.fused_ce or self.fp8_head):
            raise ValueError("l2_rows changes the fused head's row pass: it needs fused_ce or "
                             "fp8_head")
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

    def config(self) -> GPTConfig:
        """The model's :class:`perflab.gpt2.model.GPTConfig` (vocabulary, attention and changes applied)."""
        att = "math" if self.attention == "math" else "sdpa"
        return config(self.model, vocab_size=self.vocab, attention=att, **dict(self.changes))

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
    number("vocab", vocab, minimum=1)
    number("multiple", multiple, minimum=1)
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
        telemetry_brief: the same in a few words for a printed line
            (:meth:`TelemetrySummary.brief`; empty where none was recorded).
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
    telemetry_brief: str = ""

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


def causal_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token counting the attention's causal half only: ``6N + 6 L d T``
    (:meth:`perflab.gpt2.model.GPT.flops_per_token` counts the full ``T x T``: ``6N + 12 L d
    T``). A causal kernel computes about half of the score matrix, so this is the FLOPs it
    performs; MFU quoted either way must say which.

    Raises:
        ValueError: ``seq_len`` < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    with torch.device("meta"):
        model = GPT(cfg)
    return model.flops_per_token(seq_len) - 6 * cfg.n_layer * cfg.n_embd * seq_len


def fp8_block_operands(d: int, m: int) -> dict[str, int]:
    """Elements that FP8 scaling touches per training step in one transformer block's four
    linears (``perflab.kernels.fp8``), for width ``d`` and ``m`` tokens.

    The linears (inputs, outputs) are qkv (d, 3d), proj (d, d), fc (d, 4d) and proj2 (4d, d).
    Each quantizes its input in the forward inside the custom operator (eager: ``"x"``, 7md in
    all) and its weight there too (``"w"``, 12d²), its output's gradient in the traced backward
    (compiled: ``"g"``, 9md), and takes transposed FP8 copies of all three in the backward
    (``"t"``). An MLP-up layer alone has m·d inputs and 4m·d gradients: a block holds more of
    the costly eager-path elements per FLOP than that layer.

    Raises:
        ValueError: ``d`` or ``m`` below 1.
    """
    positive_int("d", d)
    positive_int("m", m)
    shapes = ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))
    x = sum(m * k for k, _ in shapes)
    g = sum(m * n for _, n in shapes)
    w = sum(k * n for k, n in shapes)
    return {"x": x, "w": w, "g": g, "t": x + g + w}


def fp8_step_ratio(step16: float, products16: float, products8: float,
                   seconds_per_element: dict[str, float], d: int, m: int,
                   blocks: int) -> float:
    """Predicted speedup (bf16 step / FP8 step) of a GPT whose ``blocks`` blocks' linears run
    in FP8: the FP8 step is the bf16 step ``step16`` (s) with the blocks' bf16 products
    ``products16`` replaced by their FP8 time ``products8``, plus the scaling of every operand
    (:func:`fp8_block_operands`) at its measured cost, ``seconds_per_element`` with keys
    ``"x"`` (the eager path, also the weights'), ``"g"`` (the compiled path) and ``"t"`` (a
    transposed copy).

    Raises:
        ValueError: a time that is not positive, ``products16`` not below ``step16``, a cost
            missing or negative, or ``d``, ``m``, ``blocks`` below 1.
    """
    for name, v in (("step16", step16), ("products16", products16), ("products8", products8)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {v}")
    if not products16 < step16:
        raise ValueError(f"products16 ({products16}) must be below step16 ({step16})")
    for key in ("x", "g", "t"):
        if key not in seconds_per_element or not seconds_per_element[key] >= 0:
            raise ValueError(f"seconds_per_element must give a cost >= 0 for {key!r}, "
                             f"got {seconds_per_element.get(key)!r}")
    positive_int("blocks", blocks)
    n, s = fp8_block_operands(d, m), seconds_per_element
    scaling = blocks * (s["x"] * (n["x"] + n["w"]) + s["g"] * n["g"] + s["t"] * n["t"])
    return step16 / (step16 - products16 + products8 + scaling)


def rung_from_dict(rung: dict) -> Rung:
    """A :class:`Rung` from its ``asdict`` form (as it travels to ``torchrun`` workers: JSON
    turns the ``changes`` pairs into lists)."""
    return Rung(**{k: tuple(tuple(c) for c in v) if k == "changes" else v
                   for k, v in rung.items()})


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


def checkpointed_inputs_bytes(rung: Rung, cfg: GPTConfig | None = None) -> float:
    """Bytes of the block inputs a checkpointed rung keeps for one micro-batch: one residual
    stream ``(batch, seq_len, n_embd)`` per block, float32 (4 bytes) or bf16 (2) as
    ``rung.residual`` keeps it; 0 for a rung without checkpointing. ``cfg`` defaults to the
    rung's model."""
    if not rung.checkpoint:
        return 0.0
    cfg = cfg or rung.config()
    per = 2 if rung.residual == "bf16" else 4
    return float(per * rung.batch * rung.seq_len * cfg.n_layer * cfg.n_embd)


def predict_peak(peak_bytes: float, rung: Rung, params: int, target: GPTConfig) -> float:
    """Predicted peak bytes of ``rung`` for the model ``target``, from its peak measured on the
    model of ``rung`` (``params`` parameters).

    The measured peak is split into parts that scale differently: static bytes
    (:func:`static_bytes_per_param` x parameters), the logits (:func:`logits_bytes`: the same
    micro-batch and vocabulary give the same logits whatever the model), and the rest. Without
    checkpointing the rest (every block's saved activations, workspace) scales with
    ``n_layer x n_embd``: at a fixed number of tokens, a block's saved activations grow with the
    width (Korthikanti et al., 2023: 34·s·b·h bytes per layer in 16-bit with a fused
    attention). With checkpointing only the block inputs the rung keeps
    (:func:`checkpointed_inputs_bytes`) grow with depth x width; the rest is the one block being
    recomputed and its backward, which grows with the width alone.

    Raises:
        ValueError: a non-positive peak or parameter count, or a peak below the static bytes.
    """
    positive("peak_bytes", peak_bytes)
    positive("params", params)
    per = static_bytes_per_param(rung)
    rest = peak_bytes - per * params
    if rest < 0:
        raise ValueError(f"peak_bytes {peak_bytes:.3g} is below the static bytes {per * params:.3g}")
    logits = min(rest, logits_bytes(rung))
    src = rung.config()
    with torch.device("meta"):
        n_target = GPT(target).num_params()
    if rung.checkpoint:
        inputs = min(rest - logits, checkpointed_inputs_bytes(rung, src))
        one_block = rest - logits - inputs
        return (per * n_target + logits + checkpointed_inputs_bytes(rung, target)
                + one_block * target.n_embd / src.n_embd)
    scale = (target.n_layer * target.n_embd) / (src.n_layer * src.n_embd)
    return per * n_target + logits + (rest - logits) * scale


def fp8_supported(device: torch.device | str) -> bool:
    """Whether ``device`` can run the FP8 rungs: a CPU (``torch._scaled_mm`` has a CPU kernel, for
    the course's CPU runs) or a GPU with FP8 tensor cores (compute capability 8.9 or newer: Ada,
    Hopper and later; an A100 is 8.0)."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    return tuple(torch.cuda.get_device_capability(device)) >= (8, 9)


def batch_scale(memory_bytes: float, needed_bytes: float, fraction: float = 0.9,
                most: int = 16) -> int:
    """The power of two to divide a page's batches by so that ``needed_bytes`` (the largest
    peak at full size) fits in ``fraction`` of ``memory_bytes``: 1 where it fits, 2, 4 ... up to
    ``most``.

    Raises:
        ValueError: a non-positive size or fraction outside (0, 1].
    """
    if memory_bytes <= 0 or needed_bytes <= 0 or not 0 < fraction <= 1:
        raise ValueError(f"need memory_bytes, needed_bytes > 0 and 0 < fraction <= 1, got "
                         f"{memory_bytes}, {needed_bytes}, {fraction}")
    scale = 1
    while needed_bytes / scale > fraction * memory_bytes and scale < most:
        scale *= 2
    return scale
