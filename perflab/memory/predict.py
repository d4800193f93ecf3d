"""Training memory predicted from first principles: static bytes, activation bytes, tensor sizes.

* :func:`static_bytes`: parameters, gradients and Adam's two moments (``4 + 4 + 8`` bytes per
  float32 parameter, the accounting of Rajbhandari et al. 2020, "ZeRO");
* :func:`activation_bytes`: what autograd saves in a :class:`perflab.memory.model.BlockStack`
  (the per-layer count follows Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", section 4.1, redone for float32 blocks without dropout);
* :func:`backward_peak_bytes`: how far the backward pass rises above its start (three
  score-sized tensors at the last block's softmax, read from a memory snapshot);
* :func:`param_count` and :func:`block_tensor_bytes`: the model's parameters and the sizes of the
  tensors one block makes (to name an allocation seen in a snapshot).

Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

from perflab.core.validate import number, positive_int
from perflab.memory.model import BlockStackConfig

__all__ = ["ADAM_BYTES_PER_PARAM", "param_count", "static_bytes", "activation_bytes",
           "backward_peak_bytes", "block_tensor_bytes"]


# float32 training with Adam: the weight, its gradient, and Adam's exp_avg and exp_avg_sq
# (Rajbhandari et al. 2020, "ZeRO", section 3.1, count 16 bytes per parameter for mixed precision
# as 2 + 2 + 12; in plain float32 it is 4 + 4 + 8)
ADAM_BYTES_PER_PARAM = {"params": 4, "grads": 4, "optimizer": 8}


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
    positive_int("n_params", n_params)
    per = dict(ADAM_BYTES_PER_PARAM if bytes_per_param is None else bytes_per_param)
    for part, v in per.items():
        number(f"bytes_per_param[{part!r}]", v, minimum=0)
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
    positive_int("batch", batch)
    positive_int("dtype_bytes", dtype_bytes)
    b, s, h, a, L = batch, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers
    sbh = s * b * h
    scores = a * s * s * b
    per_layer = 16 * sbh + scores + 4 * s * b
    total = L * per_layer - sbh + sbh          # minus the caller's input, plus the loss's saved output
    return {"per_layer": per_layer * dtype_bytes, "attention_scores_per_layer": scores * dtype_bytes,
            "total": total * dtype_bytes}


def backward_peak_bytes(cfg: BlockStackConfig, batch: int, dtype_bytes: int = 4) -> dict[str, int]:
    """How far a :class:`BlockStack`'s backward pass rises above the memory it starts from.

    The peak comes in the last block's attention, the first attention differentiated, at its
    softmax. Three tensors of the scores' size ``(b, a, s, s)`` are live there (chapter 7's
    memory snapshot lists them): the gradient of the softmax's output (from the product with
    ``v``), the gradient of its input, and a temporary of the softmax's backward, freed within
    microseconds. By then the backward pass has written the gradients of the last block's MLP
    and output projection (``9 h^2`` weights; the biases are negligible) and freed what the
    last block's MLP saved (``10 sbh``, :func:`activation_bytes`). Smaller terms are left out:
    the ``(b, s, h)`` gradients in flight and the saved tensors freed by then outside the MLP
    (a few ``sbh`` each way, which nearly cancel).

    Returns:
        ``{"scores": 3 a s^2 b, "weight_grads": 9 h^2, "freed_mlp": 10 sbh, "total":
        scores + weight_grads - freed_mlp}``, in bytes.

    Raises:
        ValueError: ``batch`` or ``dtype_bytes`` not a positive int.
    """
    positive_int("batch", batch)
    positive_int("dtype_bytes", dtype_bytes)
    b, s, h, a = batch, cfg.seq_len, cfg.d_model, cfg.n_heads
    parts = {"scores": 3 * a * s * s * b * dtype_bytes, "weight_grads": 9 * h * h * dtype_bytes,
             "freed_mlp": 10 * s * b * h * dtype_bytes}
    parts["total"] = parts["scores"] + parts["weight_grads"] - parts["freed_mlp"]
    return parts


def block_tensor_bytes(cfg: BlockStackConfig, batch: int, dtype_bytes: int = 4) -> dict[str, int]:
    """Sizes of the distinct tensors one block makes, by name, in bytes.

    ``"attention scores"`` ``(b, a, s, s)``, ``"MLP hidden"`` ``(b, s, 4h)``, ``"qkv"``
    ``(b, s, 3h)``, ``"activation"`` ``(b, s, h)``, ``"up-projection weight"`` ``(4h, h)`` (its
    gradient is as large). Used to name an allocation seen in a memory snapshot.

    Raises:
        ValueError: ``batch`` or ``dtype_bytes`` not a positive int.
    """
    positive_int("batch", batch)
    positive_int("dtype_bytes", dtype_bytes)
    b, s, h, a = batch, cfg.seq_len, cfg.d_model, cfg.n_heads
    sizes = {"attention scores": b * a * s * s, "MLP hidden": b * s * 4 * h, "qkv": b * s * 3 * h,
             "activation": b * s * h, "up-projection weight": 4 * h * h}
    return {k: v * dtype_bytes for k, v in sizes.items()}
