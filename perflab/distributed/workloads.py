"""The small models and batches chapter 8's experiments train on every rank, and how they are compared.

Every rank builds the same model from the same seed; the *global* batch of a step is drawn from
a generator seeded by the step, and each rank takes its own slice of it (:func:`global_batch`), so
that a single process can train on the whole batch and be compared with the ranks
parameter by parameter (float64: the comparison is exact up to rounding).

* :func:`make_mlp`: a stack of ``depth`` blocks ``Linear(width, width) + GELU``: its
  ``6 x params x rows`` FLOPs per step and ``4 x params`` bytes of float32 gradients make the
  compute/communication ratio a matter of arithmetic;
* :func:`make_blocks`: a stack of transformer blocks of GPT-2's shapes (PyTorch's
  ``TransformerEncoderLayer``, pre-norm, GELU, ``4 x width`` MLP): tensors from a bias to a
  ``3 width x width`` projection, for DDP's buckets.
"""

from __future__ import annotations

import torch

from perflab.core.validate import positive_int

__all__ = ["global_batch", "local", "make_blocks", "make_mlp", "max_param_diff", "mse", "nbytes",
           "state_bytes", "timing_batch"]


def make_mlp(width: int, depth: int, device: torch.device | str = "cpu", seed: int = 0,
             dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    """``depth`` blocks of ``Linear(width, width)`` then GELU, initialised from ``seed``:
    ``depth x (width^2 + width)`` parameters of ``dtype`` on ``device``.

    Raises:
        ValueError: ``width`` or ``depth`` not a positive integer.
    """
    positive_int("width", width)
    positive_int("depth", depth)
    torch.manual_seed(seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)]
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def make_blocks(n_layer: int, width: int, device: torch.device | str = "cpu", seed: int = 0) -> torch.nn.Sequential:
    """``n_layer`` pre-norm transformer blocks of GPT-2's shapes (``width / 64`` heads, a
    ``4 x width`` GELU MLP, no dropout), batch first: inputs ``(batch, seq, width)``, float32.
    Each block holds 12 tensors: the attention's ``3 width x width`` input projection and its
    bias, the output projection (weight, bias), the MLP's two linears (weight, bias each) and
    two LayerNorms (weight, bias each).

    Raises:
        ValueError: ``n_layer`` or ``width`` not a positive integer.
    """
    positive_int("n_layer", n_layer)
    positive_int("width", width)
    torch.manual_seed(seed)
    heads = max(1, width // 64)
    blocks = [torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
              for _ in range(n_layer)]
    return torch.nn.Sequential(*blocks).to(device)


def global_batch(world: int, step: int, rows: int, width: int, dtype: torch.dtype = torch.float64,
                 rank: int | None = None, device: torch.device | str = "cpu", seed: int = 1):
    """Inputs and targets of step ``step``: ``world x rows`` rows of ``width`` (a generator seeded
    by ``seed`` and ``step``, the same on every rank), or with ``rank`` that rank's ``rows``
    (rows ``rank x rows`` to ``(rank + 1) x rows``): the slices of all ranks are the global batch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(world * rows, width, generator=g, dtype=torch.float64)
    y = torch.randn(world * rows, width, generator=g, dtype=torch.float64)
    if rank is not None:
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    return x.to(device, dtype), y.to(device, dtype)


def timing_batch(rank: int, rows: int, shape: tuple[int, ...], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
    """Random inputs and targets of shape ``(rows, *shape)``, made on ``device`` (no host copy of
    a large batch), different on every rank: what a timed step reads."""
    torch.manual_seed(1000 + rank)
    return (torch.randn(rows, *shape, device=device, dtype=dtype),
            torch.randn(rows, *shape, device=device, dtype=dtype))


def mse(model, x, y):
    """The loss every experiment trains: the mean squared error of ``model(x)`` against ``y``."""
    return ((model(x) - y) ** 2).mean()


def local(t):
    """This rank's part of ``t``: the local shard of a DTensor (FSDP2), else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(t) -> int:
    """Bytes of this rank's part of ``t``."""
    t = local(t)
    return t.numel() * t.element_size()


def state_bytes(optimizer) -> int:
    """Bytes of the optimizer state this rank holds (tensors of more than one element: Adam's
    moments, not its step counters); a ``ZeroRedundancyOptimizer`` is read through its local
    optimizer."""
    inner = getattr(optimizer, "optim", optimizer)
    return sum(nbytes(v) for state in inner.state.values() for v in state.values()
               if hasattr(v, "numel") and v.numel() > 1)


def max_param_diff(a, b) -> float:
    """The largest absolute difference between the parameters of two models of one shape."""
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))
