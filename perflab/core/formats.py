"""Number formats: the one table of the precisions the course measures and draws.

Each entry of :data:`FORMATS` says how a format is stored (torch dtype name, bytes per element),
whether float32 storage uses TF32 tensor-core math, and its label. The datasheet peak of format
``key`` is ``DATASHEETS[device][datasheet_key(key)]`` (:mod:`perflab.core.device`). Matrix-product
rates per format are measured by :func:`perflab.machine.roofline.matmul_rate`; the explorer's precisions
(:data:`perflab.machine.explorer.PRECISIONS`) are this table.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

__all__ = ["FORMATS", "NumberFormat", "check", "datasheet_key", "dtype"]


class NumberFormat(NamedTuple):
    """One number format.

    Attributes:
        label: how figures and tables name it, e.g. ``"bf16 (tensor cores)"``.
        dtype_name: the torch dtype that stores it (``"float32"`` for TF32, whose inputs are
            float32), or None when a plain ``torch.matmul`` cannot use it (fp8 needs
            ``torch._scaled_mm``).
        itemsize: bytes per element as stored.
        tf32: True when float32 storage is multiplied with TF32 tensor-core math.
    """

    label: str
    dtype_name: str | None
    itemsize: int
    tf32: bool


#: key -> :class:`NumberFormat`, in the order tables list them. Keys match the ``<key>_flops``
#: entries of :data:`perflab.machine.datasheets.DATASHEETS`.
FORMATS: dict[str, NumberFormat] = {
    "fp64": NumberFormat("FP64", "float64", 8, False),
    "fp32": NumberFormat("FP32", "float32", 4, False),
    "tf32": NumberFormat("TF32 (tensor cores)", "float32", 4, True),
    "bf16": NumberFormat("bf16 (tensor cores)", "bfloat16", 2, False),
    "fp16": NumberFormat("fp16 (tensor cores)", "float16", 2, False),
    "fp8": NumberFormat("fp8 (tensor cores)", None, 1, False),
}


def check(key: str, allowed: Sequence[str] | None = None) -> str:
    """Return ``key`` if it names a format (among ``allowed`` when given).

    Raises:
        ValueError: an unknown key, naming the keys allowed.
    """
    allowed = list(allowed) if allowed is not None else list(FORMATS)
    if key not in allowed:
        raise ValueError(f"precision must be one of {allowed}, got {key!r}")
    return key


def datasheet_key(key: str) -> str:
    """The :data:`perflab.machine.datasheets.DATASHEETS` key of format ``key``'s dense peak, e.g.
    ``"bf16_flops"``.

    Raises:
        ValueError: an unknown key.
    """
    return f"{check(key)}_flops"


def dtype(key: str) -> torch.dtype | None:
    """The torch dtype that stores format ``key`` (None for fp8, which needs scaled products).

    Raises:
        ValueError: an unknown key.
    """
    name = FORMATS[check(key)].dtype_name
    return None if name is None else getattr(torch, name)
