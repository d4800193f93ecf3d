"""A small, readable GPT-2: the model later chapters profile, train and speed up.

The architecture is the one of Radford et al. (2019), "Language Models are Unsupervised
Multitask Learners" (OpenAI), as a reader can hold it in their head:

* token and position embeddings, summed;
* ``n_layer`` identical blocks, each ``x = x + attn(ln_1(x))`` then ``x = x + mlp(ln_2(x))``
  (pre-normalization: the layer norm sits before each sub-layer, as in GPT-2);
* attention: one linear layer produces queries, keys and values for all heads
  (``d -> 3d``), causal ``F.scaled_dot_product_attention`` per head, one output projection
  (``d -> d``);
* MLP: ``d -> 4d``, GELU (tanh approximation, as GPT-2 used), ``4d -> d``;
* a final layer norm and a language-model head that **shares its weight with the token
  embedding** (tied embeddings), so the head adds no parameters.

The vocabulary is GPT-2's 50,257 tokens padded to 50,304 (a multiple of 64 and of 128), so the
head's matrix product has tile-friendly sizes; the 47 extra rows are never the target of a loss.

Nothing here is tuned for speed (no fused kernels, no compile, no custom initialization
tricks beyond GPT-2's): later chapters measure what each speed-up buys starting from this file.

Shapes: ``idx`` is ``(B, T)`` int64 token ids with ``T <= block_size``; activations are
``(B, T, d)``; logits ``(B, T, vocab_size)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from perflab.core.validate import one_of, positive_int

__all__ = ["CONFIGS", "GPT", "GPTConfig", "Block", "config"]

GPT2_VOCAB = 50257
PADDED_VOCAB = 50304


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT-2 model.

    Attributes:
        n_layer: number of blocks L.
        n_head: attention heads H per block.
        n_embd: model width d (= H x head size Q).
        block_size: longest sequence T the position embedding covers.
        vocab_size: rows of the embedding (50,304: GPT-2's 50,257 padded to a multiple of 64).
        bias: whether linear layers and layer norms carry a bias (GPT-2: yes).
        attention: ``"sdpa"`` (``F.scaled_dot_product_attention``, which picks a fused
            kernel: flash, memory-efficient or cuDNN) or ``"math"`` (the same attention
            written out, ``softmax(QK^T / sqrt(Q) + causal mask) V``, which stores the
            ``(B, H, T, T)`` score and probability matrices for the backward).
    """

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = PADDED_VOCAB
    bias: bool = True
    attention: str = "sdpa"

    def __post_init__(self):
        one_of("attention", self.attention, ("sdpa", "math"))
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            v = getattr(self, name)
            positive_int(name, v)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")


#: The four published GPT-2 sizes (Radford et al., 2019, table 2; names by parameter count).
CONFIGS: dict[str, GPTConfig] = {
    "124M": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "350M": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "774M": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "1.5B": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}


def config(name: str, **changes) -> GPTConfig:
    """One of :data:`CONFIGS` (``"124M"``, ``"350M"``, ``"774M"``, ``"1.5B"``), with fields changed.

    Example: ``config("124M", n_layer=2)`` is two blocks of GPT-2 small's width.

    Raises:
        KeyError: an unknown name (the message lists the known ones).
    """
    if name not in CONFIGS:
        raise KeyError(f"unknown GPT-2 config {name!r}; known: {', '.join(CONFIGS)}")
    return replace(CONFIGS[name], **changes)


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out: ``(B, H, T, Q)`` x3 -> ``(B, H, T, Q)``.

    What the fused kernels compute without storing the ``(T, T)`` matrices (Vaswani et al.,
    2017, eq. 1, with GPT-2's causal mask).
    """
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.math = cfg.attention == "math"
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (B, T, d) -> (B, H, T, Q): each head attends over its own slice of the width
        q, k, v = (t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.math:
            y = _math_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    """Position-wise feed-forward layer: ``d -> 4d -> d`` with a tanh-GELU between."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """One transformer block (pre-norm): ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: token ids ``(B, T)`` -> logits ``(B, T, vocab_size)`` (and a loss if targets given)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight          # tied: one matrix, two uses
        self.apply(self._init)
        # GPT-2 scales the init of each residual branch's last projection by 1/sqrt(2L), so the
        # residual stream's variance does not grow with depth
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits ``(B, T, vocab_size)``; with ``targets`` ``(B, T)``, also the mean cross-entropy.

        Returns:
            ``logits`` if ``targets`` is None, else ``(logits, loss)`` (loss a 0-d float tensor).

        Raises:
            ValueError: ``idx`` is not 2-D or longer than ``block_size``.
        """
        logits = self.head(self.features(idx))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        """The final hidden states ``(B, T, d)`` (after ``ln_f``), before the head.

        Raises:
            ValueError: ``idx`` is not 2-D or longer than ``block_size``.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T), got shape {tuple(idx.shape)}")
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters, the tied embedding/head matrix counted once.

        With ``non_embedding`` (the default) the position embedding is left out: it does no
        matrix product, while the token embedding stays in because, tied, it is also the head's
        weight, which does (the convention of Kaplan et al., 2020, adapted to tied weights).
        """
        n = sum(p.numel() for p in self.parameters())    # parameters() yields a tied tensor once
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): ``6 N + 12 L H Q T``.

        ``N`` is :meth:`num_params` (non-embedding), ``L`` layers, ``H`` heads of size ``Q``,
        ``T`` the sequence length (``block_size`` by default). ``6N`` counts two FLOPs per
        weight per token forward and four backward; ``12 L H Q T`` the attention's two matrix
        products (``QK^T`` and ``AV``: ``4 T H Q`` per layer and token forward, times 3 with the
        backward), counted over the full ``T x T`` score matrix even though causal attention
        needs only half. Source: Chowdhery et al. (2022), PaLM, appendix B.

        Raises:
            ValueError: ``seq_len`` not a positive int.
        """
        T = self.cfg.block_size if seq_len is None else seq_len
        positive_int("seq_len", T)
        c = self.cfg
        return 6.0 * self.num_params() + 12.0 * c.n_layer * c.n_embd * T
