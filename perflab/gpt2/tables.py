"""Chapter 10's tables (bookkeeping: the page shows the table, not its assembly).

:func:`ladder_table` (the speed ladder: tokens/s, MFU, ratios, peak memory, compilation, clock),
:func:`saving_table` (each predicted rung's saving, split into kernels and gaps) and
:func:`memory_table` (the memory ladder), as Markdown; :func:`previous` names the rung before.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["previous", "ladder_table", "saving_table", "memory_table"]


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
