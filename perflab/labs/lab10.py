"""Checks of lab 10 (the student's own GPT-2 speedrun), and a CPU estimate of peak memory.

Lab 10 asks for four things, each checked here against a measurement or against
:mod:`perflab.gpt2.model` itself:

1. :func:`check_flops_per_token`: the student's formula for training FLOPs per token
   (``6 N + 12 L d T``; Chowdhery et al., 2022, appendix B) against
   :meth:`perflab.gpt2.model.GPT.flops_per_token` for several configurations;
2. :func:`check_static_memory`: the bytes per parameter of float32 AdamW training (4 for the
   weight, 4 for its gradient, 4 + 4 for Adam's two moments: 16) and the static bytes of a model;
3. :func:`check_speedrun`: the student's rung against the baseline rung, trained in the same run
   and alternated (so that a machine's load slows both alike): its MFU against the machine's own
   measured matmul ceiling (:mod:`perflab.machine.ceilings`), and its speedup over the baseline;
4. :func:`check_memory_cut`: at the same global batch and the same tokens, the student's rung
   has a peak at most a stated fraction of the baseline's, with the same losses.

A CPU has no caching allocator whose peak we could read (``RunResult.peak_bytes`` is None there),
so on a CPU :func:`peak_estimate` stands in: the static bytes (weights, gradients, AdamW's two
moments) plus the bytes that autograd saves for the backward of one micro-batch, counted with
``torch.autograd.graph.saved_tensors_hooks``. It is an *estimate* of the peak (a lower bound:
the backward's transient tensors, such as the gradient of the logits, are not counted), and the
lab says so wherever it shows it.
"""

from __future__ import annotations

import ast
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from perflab.core.validate import number, positive_int
from perflab.gpt2.model import GPT, PADDED_VOCAB, GPTConfig, config
from perflab.gpt2.rungs import RunResult, Rung
from perflab.gpt2.steps import Forward, make_net, make_step
from perflab.gpt2.train import batches, train
from perflab.record.numbers import fmt, fmt_small
from perflab.labs.exercises import ExerciseFailed, NotPlain, as_float, plain, record, require

__all__ = ["ADAMW_FP32_BYTES", "PeakEstimate", "check_flops_per_token", "check_memory_cut",
           "reference_fraction", "reference_ladder",
           "check_speedrun", "check_static_memory", "model_params", "peak_estimate",
           "speed_trials", "speedup_bar"]

#: the reference run's ceilings file (the same file as ``perflab.machine.ceilings.REFERENCE_PATH``;
#: named here so that this chapter module does not import a module layered above it)
_REFERENCE_CEILINGS = Path(__file__).resolve().parent.parent / "data" / "reference_ceilings.json"

#: bytes per parameter of float32 AdamW training, by part (weight, gradient, two moments)
ADAMW_FP32_BYTES = {"weight": 4, "gradient": 4, "adam_m": 4, "adam_v": 4}


def model_params(cfg: GPTConfig, non_embedding: bool = True) -> int:
    """Parameters of ``GPT(cfg)``, counted on the ``meta`` device (no memory, no time).

    ``non_embedding`` as in :meth:`perflab.gpt2.model.GPT.num_params` (the position embedding left
    out: the ``N`` of the FLOPs formula); False counts every parameter (the tied embedding once).

    Raises:
        TypeError: ``cfg`` is not a :class:`perflab.gpt2.model.GPTConfig`.
    """
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
    with torch.device("meta"):
        model = GPT(cfg)
    return model.num_params(non_embedding=non_embedding)


# ---------------------------------------------------------------------------------------------
# Exercise 1: FLOPs per token
# ---------------------------------------------------------------------------------------------

#: (label, config, seq_len) the FLOPs check tries: GPT-2 small and large, and a tiny model
_FLOP_CASES = (("GPT-2 124M, T=1024", "124M", (), 1024),
               ("GPT-2 774M, T=256", "774M", (), 256),
               ("a tiny model, T=64", "124M",
                (("n_layer", 2), ("n_embd", 64), ("n_head", 4), ("vocab_size", 8192)), 64))


def check_flops_per_token(fn: Callable[[int, int, int, int], float] | None) -> dict[str, float]:
    """Check ``fn(n_params, n_layer, n_embd, seq_len)`` -> training FLOPs per token.

    ``n_params`` is the non-embedding parameter count ``N`` (:func:`model_params`); the answer
    must match :meth:`perflab.gpt2.model.GPT.flops_per_token` (``6 N + 12 L d T``) within 0.1 % for
    GPT-2 124M at T = 1024, 774M at T = 256 and a tiny model. Returns ``{label: FLOPs}``.

    Raises:
        ExerciseFailed: ``fn`` is None (exercise 1 not done), or a wrong value, with a hint when
            the answer is ``6N`` (attention left out) or ``2N`` (forward only).
    """
    require(1, flops_per_token=fn)
    out = {}
    for label, name, changes, T in _FLOP_CASES:
        cfg = config(name, **dict(changes))
        with torch.device("meta"):
            model = GPT(cfg)
        n = model.num_params()
        got = fn(n, cfg.n_layer, cfg.n_embd, T)           # the answer first, as a plain number
        if got is None or isinstance(got, bool):
            raise ExerciseFailed(f"✗ FLOPs per token of {label}: your function returned {got!r}.")
        got = as_float(f"FLOPs per token of {label}", got)
        want = model.flops_per_token(T)
        record(f"flops per token, {label}", got)
        if abs(got - want) > 1e-3 * want:
            hint = ""
            if abs(got - 6 * n) <= 1e-3 * want:
                hint = " That is 6N: the attention's QK^T and AV products (12 L d T) are missing."
            elif abs(got - 2 * n) <= 1e-3 * want or abs(got - (2 * n + 4 * cfg.n_layer *
                                                                 cfg.n_embd * T)) <= 1e-3 * want:
                hint = " That counts the forward only: the backward costs twice the forward."
            raise ExerciseFailed(f"✗ FLOPs per token of {label}: got {got:.4g}, expected "
                                 f"{want:.4g} ({got / want:.3g}x).{hint}")
        out[label] = got
    print(f"✓ FLOPs per token: right for {len(out)} models "
          f"({out[_FLOP_CASES[0][0]] / 1e6:.0f} MFLOP per token for GPT-2 124M at T=1024).")
    return out


# ---------------------------------------------------------------------------------------------
# Exercise 2: static memory
# ---------------------------------------------------------------------------------------------

def check_static_memory(bytes_per_param: dict | None, predicted_static: float | None,
                        cfg: GPTConfig, rtol: float = 0.01) -> float:
    """Check the bytes per parameter of float32 AdamW training and the static bytes of ``cfg``.

    ``bytes_per_param`` maps each of ``"weight"``, ``"gradient"``, ``"adam_m"``, ``"adam_v"`` to
    bytes (4 each in float32); ``predicted_static`` is the bytes of all four for every parameter
    of ``GPT(cfg)`` (the tied embedding once, the position embedding included): 16 bytes per
    parameter, within ``rtol``. Returns the static bytes.

    Raises:
        ExerciseFailed: an answer missing (exercise 2 not done), a wrong part, or a prediction
            off by more than ``rtol`` (8 bytes per parameter is the usual slip: the two moments
            of Adam forgotten, or the weights counted in bfloat16).
    """
    require(2, bytes_per_param=bytes_per_param, predicted_static=predicted_static)
    try:
        bytes_per_param = plain(bytes_per_param)
    except NotPlain as err:
        raise ExerciseFailed(f"✗ bytes per parameter: give a plain dict of numbers, got {err}.") from None
    got = as_float("static bytes", predicted_static)
    if not isinstance(bytes_per_param, dict) or set(bytes_per_param) != set(ADAMW_FP32_BYTES):
        raise ExerciseFailed(f"✗ bytes per parameter: give a dict with the keys "
                             f"{sorted(ADAMW_FP32_BYTES)}, got {bytes_per_param!r}.")
    for part, want in ADAMW_FP32_BYTES.items():
        if bytes_per_param[part] != want:
            raise ExerciseFailed(f"✗ bytes per parameter of the {part}: got "
                                 f"{bytes_per_param[part]!r}, expected {want} (float32).")
    total = model_params(cfg, non_embedding=False)
    want = total * sum(ADAMW_FP32_BYTES.values())
    record("static bytes", got)
    if abs(got - want) > rtol * want:
        raise ExerciseFailed(f"✗ static bytes: got {got:.4g}, expected {want:.4g} "
                             f"({got / want:.3g}x): {got / total:.3g} bytes per parameter for "
                             f"{total:,} parameters.")
    print(f"✓ static memory: {got / 2**30:.2f} GiB for {total:,} parameters "
          f"(16 bytes each) is right.")
    return got


# ---------------------------------------------------------------------------------------------
# Exercise 3: speed
# ---------------------------------------------------------------------------------------------

def speedup_bar(fp32_flops: float, low_flops: float, share: float = 0.4,
                floor: float = 1.5) -> float:
    """The speedup lab 10's exercise 3 asks over its float32 baseline, from this machine's
    measured matmul ceilings.

    If a step were only its matrix products, moving them from float32 to bf16 would make it
    ``low_flops / fp32_flops`` times faster (the ratio of the two measured ceilings: about 13x
    on an H100/H200, about 2x on consumer GPUs whose bf16 rate is twice their float32 rate).
    The bar is ``share`` of that ratio (chapter 10's plain compiled rung reached over 80 % of it
    on an H200, so 40 % leaves room for a smaller GPU's memory-bound work), and never below
    ``floor``: a rung must at least beat the baseline clearly.

    Raises:
        ValueError: a non-positive ceiling, share or floor.
    """
    if not fp32_flops > 0 or not low_flops > 0 or not share > 0 or not floor > 0:
        raise ValueError(f"ceilings, share and floor must be positive, got {fp32_flops}, "
                         f"{low_flops}, {share}, {floor}")
    return max(floor, share * low_flops / fp32_flops)


def speed_trials(base: Rung, mine: Rung, tokens: np.ndarray, device, steps: int = 3,
                 warmup: int = 1, trials: int = 3) -> dict[str, Any]:
    """Train ``base`` and ``mine`` alternately ``trials`` times each; return what was measured.

    Alternating (base, mine, base, mine, ...) exposes both runs of a trial to the same spell of
    load, so the speedup is the median of the trials' own ratios (``mine / base`` in one trial),
    as :func:`perflab.core.paired.paired_ratio` does: the fastest run of each can land in
    different spells (a loaded 2-core machine read a rung at about half its speedup that way, a
    CPU run of the lab's reference solution with no record in ``runs/``: commit 145cbcb's
    message gives its trials). Returns a dict: ``speedup``, ``ratios`` (each trial's ratio, the
    spread), ``base`` and ``mine`` (the fastest :class:`perflab.gpt2.rungs.RunResult` of each,
    by tokens/s: the least disturbed run, which the MFU is read from).

    Raises:
        ValueError: ``trials`` < 1 (and whatever :func:`perflab.gpt2.train.train` raises).
    """
    positive_int("trials", trials)
    runs_b, runs_m, ratios = [], [], []
    for _ in range(trials):
        b = train(base, tokens, steps, device, warmup=warmup)
        m = train(mine, tokens, steps, device, warmup=warmup)
        runs_b.append(b)
        runs_m.append(m)
        ratios.append(m.tokens_per_s / b.tokens_per_s)
    best_b = max(runs_b, key=lambda r: r.tokens_per_s)
    best_m = max(runs_m, key=lambda r: r.tokens_per_s)
    return {"speedup": statistics.median(ratios), "ratios": ratios,
            "base": best_b, "mine": best_m}


def check_speedrun(base: Rung, mine: Rung | None, tokens: np.ndarray, device,
                   ceiling_flops: float, min_fraction: float, min_speedup: float,
                   steps: int = 3, warmup: int = 1, trials: int = 3) -> dict[str, Any]:
    """Check a faster rung: MFU against the machine's own matmul ceiling, and speedup.

    Trains ``base`` and ``mine`` alternately (:func:`speed_trials`). Passes when ``mine`` trains
    the same model on the same sequence length, its MFU against ``ceiling_flops`` (the measured
    ``matmul_bf16`` of a GPU or ``matmul_fp32`` of a CPU) is at least ``min_fraction``, and its
    speedup over the baseline (the median of the trials' ratios) is at least
    ``min_speedup``. Returns :func:`speed_trials`'s
    dict with ``fraction`` (MFU of ``mine``'s fastest trial against the ceiling) added.

    Raises:
        ExerciseFailed: ``mine`` missing (exercise 3 not done), not a Rung, another model or
            sequence length, too low a fraction of the ceiling, or too small a speedup.
        ValueError: a non-positive ceiling, fraction or speedup target.
    """
    require(3, my_rung=mine)
    if not ceiling_flops or ceiling_flops <= 0 or min_fraction <= 0 or min_speedup <= 0:
        raise ValueError(f"ceiling_flops, min_fraction and min_speedup must be positive, got "
                         f"{ceiling_flops}, {min_fraction}, {min_speedup}")
    if type(mine) is not Rung:
        raise ExerciseFailed(f"✗ your rung: expected a perflab.gpt2.rungs.Rung (base.then(...)), "
                             f"got {type(mine).__name__}.")
    if mine.config().n_layer != base.config().n_layer or \
            mine.config().n_embd != base.config().n_embd or mine.seq_len != base.seq_len:
        raise ExerciseFailed("✗ your rung trains another model or sequence length than the "
                             "baseline: a speedrun keeps the model and T, and changes how it "
                             "is trained.")
    got = speed_trials(base, mine, tokens, device, steps=steps, warmup=warmup, trials=trials)
    fraction = got["mine"].mfu(ceiling_flops)
    got["fraction"] = fraction
    record("MFU against the matmul ceiling", fraction)
    record("speedup over the baseline", got["speedup"])
    trials_txt = ", ".join(f"{r:.2f}" for r in got["ratios"])
    # both numbers and both targets in every message: how far off, and in which
    both = (f"MFU {fraction:.3f} of your matmul ceiling (target {min_fraction:.3f}); "
            f"{got['speedup']:.2f}x the baseline (median of trials {trials_txt}; target "
            f"{min_speedup:.2f}x); baseline {fmt(got['base'].tokens_per_s, 'tokens/s')}, "
            f"yours {fmt(got['mine'].tokens_per_s, 'tokens/s')}")
    if fraction < min_fraction:
        raise ExerciseFailed(f"✗ your rung's MFU is below its target: {both}.")
    if got["speedup"] < min_speedup:
        raise ExerciseFailed(f"✗ your rung's speedup is below its target: {both}.")
    each = f" (trials {trials_txt})" if len(got["ratios"]) > 1 else ""
    print(f"✓ your rung: {fmt(got['mine'].tokens_per_s, 'tokens/s')}, {fmt(fraction)} "
          f"of your matmul ceiling, {fmt(got['speedup'], 'x')} the baseline{each}.")
    if fraction > 1:
        print("  (Above 1: the ceilings file was measured while this machine was busier than "
              "now; `python -m perflab.machine.ceilings --fresh` measures it again.)")
    return got


# ---------------------------------------------------------------------------------------------
# Exercise 4: memory (and the CPU's estimate of peak memory)
# ---------------------------------------------------------------------------------------------

@dataclass
class PeakEstimate:
    """An estimate of a training step's peak memory, in bytes (what a CPU can measure).

    Attributes:
        static_bytes: weights (4 B/parameter), AdamW's two moments (8 B), and gradients (4 B;
            with the optimizer in the backward and no accumulation, only the largest
            parameter's gradient lives).
        saved_bytes: bytes autograd saved for the backward of one micro-batch (unique storages,
            parameters excluded), counted by ``saved_tensors_hooks``; with activation
            checkpointing, each block's input (which the checkpoint keeps) is added.
        recompute_bytes: with checkpointing, the saved bytes of the largest block, which the
            backward recomputes and holds while it runs that block; else 0.
    """

    static_bytes: int
    saved_bytes: int
    recompute_bytes: int

    @property
    def total(self) -> int:
        """The estimate: static + saved + recompute bytes."""
        return self.static_bytes + self.saved_bytes + self.recompute_bytes


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def peak_estimate(rung: Rung, tokens: np.ndarray, device="cpu", seed: int = 0) -> PeakEstimate:
    """Estimate the peak memory of training ``rung``: static bytes + bytes saved for backward.

    Runs one micro-batch (``rung.batch`` sequences of ``rung.seq_len`` tokens from the start of
    ``tokens``) forward through the model as :func:`perflab.gpt2.train.train` builds it (eager:
    ``rung.compile`` is ignored, since a compiled graph saves other tensors), with
    ``torch.autograd.graph.saved_tensors_hooks`` recording every tensor saved for the backward;
    tensors are counted once per storage, parameters left out (they are static). No backward runs.
    Gradient accumulation lowers the estimate through ``rung.batch`` (the micro-batch).

    Raises:
        TypeError: ``rung`` is not a :class:`perflab.gpt2.rungs.Rung`.
    """
    if not isinstance(rung, Rung):
        raise TypeError(f"rung must be a Rung, got {type(rung).__name__}")
    device = torch.device(device)
    torch.manual_seed(seed)
    model = GPT(rung.config()).to(device)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    # the step in the backward frees each gradient at once only without accumulation: the
    # earlier micro-batches must keep every gradient until the last one completes it
    freed = rung.optimizer == "in_backward" and rung.accum == 1
    grads = max(p.numel() for p in params) if freed else n
    static = 4 * n + 8 * n + 4 * grads
    skip = {_storage_key(p) for p in params}
    seen: dict = {}
    per_block: list[int] = []

    def pack(t):
        key = _storage_key(t)
        if key not in skip and key not in seen and t.device.type != "meta":
            seen[key] = t.untyped_storage().nbytes()
        return t

    fwd = Forward(model, rung.then(rung.name, compile=False, checkpoint=False,
                                   graphs=False, step_graph=False))
    x, y = next(batches(tokens, rung.batch, rung.seq_len))
    x, y = x.to(device), y.to(device)
    before = {}

    def pre(block, args):
        before[block] = sum(seen.values())

    def post(block, args, out):
        per_block.append(sum(seen.values()) - before[block])

    handles = [b.register_forward_pre_hook(pre) for b in model.blocks]
    handles += [b.register_forward_hook(post) for b in model.blocks]
    try:
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rung.precision)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast(device.type, dtype=low or torch.bfloat16, enabled=low is not None):
            fwd(x, y)
    finally:
        for h in handles:
            h.remove()
    saved = sum(seen.values())
    recompute = 0
    if rung.checkpoint:
        d = rung.config().n_embd
        elem = 4                      # the residual stream stays float32 under autocast
        blocks = sum(per_block)
        inputs = len(model.blocks) * rung.batch * rung.seq_len * d * elem
        saved = saved - blocks + inputs
        recompute = max(per_block)
    del fwd, model
    return PeakEstimate(static_bytes=int(static), saved_bytes=int(saved),
                        recompute_bytes=int(recompute))


def _peak(result: RunResult, rung: Rung, tokens, device) -> tuple[int, str]:
    if result.peak_bytes is not None:
        return result.peak_bytes, "peak allocated (torch.cuda.max_memory_allocated)"
    return peak_estimate(rung, tokens, device).total, \
        "estimated peak (static + saved for backward; a CPU has no allocator peak)"


class _KeepGradient:
    """Stands in for the optimizer in ``make_step``: ``step()`` keeps the gradient."""

    def __init__(self, model):
        self.model, self.grad = model, None

    def step(self):
        self.grad = torch.cat([p.grad.float().flatten().cpu()
                               for p in self.model.parameters() if p.grad is not None])

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def _first_gradient(rung: Rung, tokens: np.ndarray, device: torch.device) -> torch.Tensor:
    """The gradient of ``rung``'s first step, from the weights :func:`train` starts from (seed 0)
    and its first batch, flattened on the CPU: the optimizer only keeps it."""
    torch.manual_seed(0)
    with device:
        model = GPT(rung.config())
    keep = _KeepGradient(model)
    make_step(make_net(model, rung), keep, rung, batches(tokens, rung.batch, rung.seq_len),
              device)()
    del model
    return keep.grad


def check_memory_cut(base: Rung, lean: Rung | None, tokens: np.ndarray, device,
                     max_ratio: float, steps: int = 3, warmup: int = 1,
                     rtol: float = 0.01, grad_rtol: float = 0.01) -> dict[str, Any]:
    """Check a leaner rung: same training (global batch, model, tokens, losses), lower peak.

    Trains ``base`` and ``lean`` for ``warmup + steps`` steps each on the same tokens; passes when
    ``lean`` trains the same model at the same sequence length and global batch (``batch x
    accum``), in the same precision, every step's loss agrees within ``rtol`` (relative), the
    first step's gradient agrees within ``grad_rtol`` (the norm of the difference over the
    baseline's: AdamW's first updates are about ``lr`` whatever the gradient, so a few steps'
    losses miss a change of the arithmetic, such as FP8 products, that the gradient shows), and
    its peak is at most ``max_ratio`` times the baseline's. The peak is
    ``RunResult.peak_bytes`` on a GPU and :func:`peak_estimate` on a CPU. Returns a dict:
    ``ratio``, ``base_peak``, ``lean_peak``, ``what`` (which peak), ``worst`` (the largest
    relative loss difference), ``grad_gap`` (the gradients' relative difference),
    ``base``/``lean`` (the RunResults).

    Raises:
        ExerciseFailed: ``lean`` missing (exercise 4 not done), not a Rung, another model,
            sequence length, global batch or precision, losses that differ, or too high a peak.
        ValueError: ``max_ratio`` not in (0, 1], ``rtol`` or ``grad_rtol`` not positive.
    """
    require(4, lean_rung=lean)
    number("max_ratio", max_ratio, above=0, maximum=1)
    number("rtol", rtol, above=0)
    number("grad_rtol", grad_rtol, above=0)
    if type(lean) is not Rung:
        raise ExerciseFailed(f"✗ your lean rung: expected a perflab.gpt2.rungs.Rung "
                             f"(base.then(...)), got {type(lean).__name__}.")
    if lean.config() != base.config() or lean.seq_len != base.seq_len:
        raise ExerciseFailed("✗ your lean rung trains another model or sequence length: the "
                             "training must stay the same.")
    if lean.batch * lean.accum != base.batch * base.accum:
        raise ExerciseFailed(f"✗ your lean rung's global batch is {lean.batch} x {lean.accum} = "
                             f"{lean.batch * lean.accum} sequences, not the baseline's "
                             f"{base.batch * base.accum}: a smaller batch saves memory but "
                             f"trains differently (split it into micro-batches instead).")
    if lean.precision != base.precision:
        raise ExerciseFailed("✗ your lean rung changes the precision: that changes the losses; "
                             "keep the baseline's precision.")
    b = train(base, tokens, steps, device, warmup=warmup)
    m = train(lean, tokens, steps, device, warmup=warmup)
    worst = float(np.max(np.abs(np.subtract(m.losses, b.losses)) / np.abs(b.losses)))
    bp, what = _peak(b, base, tokens, device)
    mp, _ = _peak(m, lean, tokens, device)
    ratio = mp / bp
    device = torch.device(device)
    g0 = _first_gradient(base, tokens, device)
    grad_gap = float((_first_gradient(lean, tokens, device) - g0).norm() / g0.norm())
    del g0
    record("peak ratio", ratio)
    record("loss difference", worst)
    record("gradient difference", grad_gap)
    out = {"ratio": ratio, "base_peak": bp, "lean_peak": mp, "what": what, "worst": worst,
           "grad_gap": grad_gap, "base": b, "lean": m}
    if worst > rtol:
        raise ExerciseFailed(f"✗ your lean rung's losses differ from the baseline's by up to "
                             f"{worst:.2%} (tolerance {rtol:.0%}): it trains differently.")
    if not grad_gap <= grad_rtol:
        raise ExerciseFailed(f"✗ your lean rung's first gradient differs from the baseline's by "
                             f"{grad_gap:.2%} of its norm (tolerance {grad_rtol:.0%}): it "
                             f"computes another gradient, so it trains differently, although "
                             f"the first steps' losses agree.")
    if ratio > max_ratio:
        raise ExerciseFailed(f"✗ your lean rung's {what.split(' (')[0]} is {ratio:.2f}x the "
                             f"baseline's ({mp / 2**20:,.1f} MiB against {bp / 2**20:,.1f} "
                             f"MiB); the target is at most {max_ratio:.2f}x.")
    print(f"✓ your lean rung: {what.split(' (')[0]} {fmt(mp, 'iB')}, {fmt(ratio, 'x')} the "
          f"baseline's {fmt(bp, 'iB')}; losses agree within {fmt_small(worst)}.")
    return out


# ---------------------------------------------------------------------------------------------
# The closing overlay
# ---------------------------------------------------------------------------------------------

def reference_ladder(value: Any) -> list[dict]:
    """Chapter 10's glued speed ladder (``gpt2_speed_ladder``) as a list of dicts.

    ``value`` is what :func:`perflab.record.provenance.read_glued` returned for it: a list already, or
    its text (JSON, or a Python ``repr``), or None when the chapter's notebook is missing.
    Returns ``[{"name": str, "tokens_per_s": float, "mfu": float}, ...]``, or ``[]`` when there
    is no ladder or its text cannot be read as one; ``"mfu"`` is against the reference run's
    measured bf16 ceiling for every rung (glued as ``"mfu_bf16_ceiling"``; older notebooks
    glued it as ``"mfu"``).
    """
    for _ in range(2):                # text, or a string holding the text
        if not isinstance(value, str):
            break
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(value)
                break
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
        else:
            return []
    if not isinstance(value, list):
        return []
    rows = []
    for row in value:
        key = "mfu_bf16_ceiling" if isinstance(row, dict) and "mfu_bf16_ceiling" in row else "mfu"
        if isinstance(row, dict) and {"name", "tokens_per_s", key} <= set(row):
            rows.append({"name": str(row["name"]), "tokens_per_s": float(row["tokens_per_s"]),
                         "mfu": float(row[key])})
    return rows


def reference_fraction(tokens_per_s: float | None, model: str = "124M", seq_len: int = 1024,
                       ceiling: str = "matmul_bf16", path=None) -> float | None:
    """MFU of a reference-run rung against the reference run's own measured matmul ceiling.

    ``tokens_per_s`` is a rung of chapter 10's reference run (GPT-2 ``model`` at ``seq_len``,
    vocabulary 50,304); the FLOPs per token are :meth:`perflab.gpt2.model.GPT.flops_per_token`, the
    ceiling ``ceiling`` from the reference run's ceilings file (default
    ``perflab/data/reference_ceilings.json``, :data:`perflab.machine.ceilings.REFERENCE_PATH`). This
    puts the reference on the same footing as a student's MFU against their own ceiling.
    Returns None when ``tokens_per_s`` is None or the file or the ceiling is missing.
    """
    p = Path(path) if path is not None else _REFERENCE_CEILINGS
    if tokens_per_s is None or not p.exists():
        return None
    value = (json.loads(p.read_text()).get("ceilings", {}).get(ceiling) or {}).get("value")
    if not value:
        return None
    cfg = config(model, vocab_size=PADDED_VOCAB)
    with torch.device("meta"):
        flops = GPT(cfg).flops_per_token(seq_len)
    return float(tokens_per_s) * flops / value
