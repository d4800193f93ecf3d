"""Chapter 2 and lab 2: the issue's headline numbers are glued, and the lab ends on the overlay."""

import re
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "book" / "02_hardware.md"
LAB = ROOT / "labs" / "02_hardware.md"

REQUIRED = ["cpu_memory_bandwidth_GBps", "gpu_copy_bandwidth_TBps", "matmul_tflops_bf16", "matmul_tflops_fp32",
            "h2d_pinned_GBps", "h2d_pageable_GBps", "p2p_bandwidth_GBps", "allreduce_busbw_GBps",
            "l2_bandwidth_ratio"]


def glued_names(path):
    code = "\n".join(c.source for c in jupytext.read(path).cells if c.cell_type == "code")
    return set(re.findall(r'glue\(\s*"([A-Za-z0-9_]+)"', code))


def test_chapter_glues_every_headline_number_of_the_issue():
    missing = set(REQUIRED) - glued_names(CHAPTER)
    assert not missing, f"not glued: {sorted(missing)}"


def test_prose_quotes_only_names_glued_on_every_machine():
    """A name glued only inside a GPU cell would make a CPU build warn: the prose must not quote it."""
    nb = jupytext.read(CHAPTER)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    quoted = set(re.findall(r"\{glue:text\}`([A-Za-z0-9_]+)", prose))
    gpu_only = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith("if requires_gpu("):
            gpu_only |= set(re.findall(r'glue\(\s*"([A-Za-z0-9_]+)"', cell.source))
    assert quoted, "the prose quotes no glued number"
    assert not quoted & gpu_only, f"prose quotes GPU-only names: {sorted(quoted & gpu_only)}"
    assert quoted <= glued_names(CHAPTER), f"quoted but never glued: {sorted(quoted - glued_names(CHAPTER))}"


def test_lab_uses_the_report_card_and_ends_on_the_overlay():
    cells = [c for c in jupytext.read(LAB).cells if c.cell_type == "code"]
    assert any("report.measure(" in c.source for c in cells)
    assert "overlay_table" in cells[-1].source and "read_glued" in cells[-1].source
