"""The model chapter 7 measures: a stack of pre-LayerNorm transformer blocks, attention written out.

:class:`BlockStackConfig` and :class:`BlockStack`: pre-LayerNorm transformer blocks with written-out
attention, so the ``a s^2 b`` attention-score term of Korthikanti et al. 2022 is there to see in
memory. How much of it autograd keeps (activation checkpointing) is the chapter's technique,
written on its page (:mod:`perflab.memory.checkpointing`), not a switch of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from perflab.core.validate import positive_int

__all__ = ["BlockStackConfig", "Block", "BlockStack"]


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
            positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")


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
    """``n_layers`` :class:`Block` s applied in turn (``self.blocks``), nothing else: the model
    chapter 7 measures. How much of it autograd keeps (activation checkpointing) is the chapter's
    technique, written on its page (``perflab.memory.checkpointing``), not a switch of the model.

    Input and output: float ``(batch, seq_len, d_model)``.
    """

    def __init__(self, cfg: BlockStackConfig):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x
