"""The memory ladder's "same gradient" claim (book/10_gpt2_memory_ladder.md, review N14) can
fail: the page's own gradient check, run on a tiny model, sees the right accumulation within its
band and two plausible accumulation bugs outside it (a missing division by the number of
micro-batches; only the last micro-batch's gradient kept). One step of AdamW would not: its
first update is lr * sign(g) whatever the gradient's scale."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import numpy as np
import pytest
import torch

from perflab.gpt2.model import GPT
from perflab.gpt2.rungs import Rung
from perflab.gpt2.steps import make_net, make_step, memory_ladder
from perflab.gpt2.train import batches

from lab_cells import code_cell

PAGE = Path(__file__).resolve().parents[1] / "book" / "10_gpt2_memory_ladder.md"
TINY = (("n_layer", 2), ("n_embd", 32), ("n_head", 2), ("block_size", 32))


def _page():
    return jupytext.read(PAGE)


def _band() -> float:
    """The claim's band, read from the page's claim cell."""
    src = code_cell(_page(), 'claim("gpt2_memory_same_gradient"')
    return float(re.search(r"max\(grad_gap\.values\(\)\) <= ([0-9.]+)", src).group(1))


def _gaps(step_maker) -> dict[str, float]:
    """The page's gradient cell on a tiny ladder, its make_step replaced by ``step_maker``."""
    src = code_cell(_page(), "def first_gradient(rung)")
    ids = np.random.default_rng(0).integers(0, 200, 20_000).astype(np.uint16)
    base = Rung("baseline", changes=TINY, seq_len=32, batch=8, vocab=257)
    ns = dict(torch=torch, GPT=GPT, make_net=make_net, make_step=step_maker,
              batches=batches, tokens=ids, dev=torch.device("cpu"),
              mem_ladder=memory_ladder(base, micro_batches=4),
              fmt=lambda v, unit: f"{v:.3g}")
    exec(compile(src, str(PAGE), "exec"), ns)
    return ns["grad_gap"]


class _Scaled(torch.nn.Module):
    """``net``'s loss times ``factor(call)``: a wrong accumulation made from the right step."""

    def __init__(self, net, factor):
        super().__init__()
        self.net, self.factor, self.calls = net, factor, 0

    def forward(self, x, y):
        self.calls += 1
        return self.net(x, y) * self.factor(self.calls)


def _wrong(factor_of_rung):
    def maker(net, opt, rung, stream, device):
        return make_step(_Scaled(net, factor_of_rung(rung)), opt, rung, stream, device)
    return maker


def test_the_right_accumulation_is_within_the_band():
    band = _band()
    gaps = _gaps(make_step)
    assert set(gaps) == {"gradient accumulation", "activation checkpointing"}
    assert max(gaps.values()) <= band


@pytest.mark.parametrize("bug, factor_of_rung", [
    # the micro-batches' losses summed, not averaged: the gradient accum times too large
    ("no division", lambda r: (lambda call: float(r.accum))),
    # the gradient zeroed before each micro-batch: only the last one's is left
    ("last micro-batch only", lambda r: (lambda call: 1.0 if call % r.accum == 0 else 0.0)),
])
def test_a_wrong_accumulation_fails_the_claim(bug, factor_of_rung):
    gaps = _gaps(_wrong(factor_of_rung))
    assert gaps["gradient accumulation"] > _band(), bug
