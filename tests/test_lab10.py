"""Lab 10: the GPU sizes (which CI cannot run) make valid rungs that keep each exercise's rules,
and the overlay cell runs with and without a reference. The student edition runs in
tests/test_student_editions.py, every check's wrong solutions in tests/test_lab_checks.py
(tests/lab_wrong_solutions.py), the check functions in tests/test_lab10_checks.py."""

import sys
from pathlib import Path
from types import SimpleNamespace

import jupytext
import pytest

from perflab.gpt2.model import GPT, GPT2_VOCAB, PADDED_VOCAB, config
from perflab.gpt2.rungs import Rung, padded
from perflab.labs import lab10
from perflab.record.numbers import fmt

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "10_gpt2_speedrun.md"
sys.path.insert(0, str(ROOT / "tests"))
from lab_cells import code_cell  # noqa: E402


def _gpu_namespace(gib):
    """The lab's set-up, rung and solution cells executed with the GPU's sizes (nothing runs)."""
    nb = jupytext.read(LAB)
    import perflab

    ns = {"pick": lambda cpu, gpu: gpu, "on_gpu": True, "gib": gib, "Rung": Rung, "padded": padded,
          "GPT": GPT, "GPT2_VOCAB": GPT2_VOCAB, "PADDED_VOCAB": PADDED_VOCAB, "config": config,
          "Path": Path, "perflab": perflab, "lab10": lab10, "fmt": fmt,
          "corpus": SimpleNamespace(vocab_size=8192),
          "ceilings": SimpleNamespace(load=lambda: SimpleNamespace(
              value=lambda name: {"matmul_fp32": 5e13}.get(name, 7e14)))}
    for needle in ("TINY = ", "my_rung = None"):
        exec(compile(code_cell(nb, needle), f"<lab10 {needle}>", "exec"), ns)
    mem_cell = code_cell(nb, "mem_base = Rung(")
    exec(compile(mem_cell.split("estimate = ")[0], "<lab10 mem_base>", "exec"), ns)
    exec(compile(code_cell(nb, "lean_rung = None"), "<lab10 lean>", "exec"), ns)
    return ns


@pytest.mark.parametrize("gib", [24, 80, 141])
def test_gpu_sizes_make_valid_rungs(gib):
    ns = _gpu_namespace(gib)
    base, mine, mem_base, lean = ns["base"], ns["my_rung"], ns["mem_base"], ns["lean_rung"]
    assert (base.model, base.seq_len, base.precision, base.attention) == \
        ("124M", 1024, "fp32", "math")
    assert base.config().n_layer == mine.config().n_layer == 12
    assert mine.seq_len == base.seq_len and mine.vocab % 64 == 0
    assert (mine.precision, mine.compile, mine.attention) == ("bf16", True, "sdpa")
    # batch sizes that fit: fp32 math attention at batch 4 and bf16 SDPA at 16 on a 24 GB card
    assert base.batch == (4 if gib < 70 else 16) and mine.batch == 4 * base.batch
    assert lean.batch * lean.accum == mem_base.batch * mem_base.accum
    assert lean.batch >= 1 and lean.checkpoint and lean.precision == mem_base.precision
    assert mem_base.batch == (8 if gib < 40 else 16)
    assert ns["ceiling_name"] == "matmul_bf16"
    # the bar follows this machine's two ceilings: 40 % of 7e14 / 5e13 = 14x
    assert ns["min_speedup"] == pytest.approx(0.4 * 14)


def test_speedup_bar_holds_for_consumer_and_datacenter_ceilings():
    """A consumer GPU (bf16 about 2x its float32) gets the floor, an H200 (13.5x) 40 % of it."""
    assert lab10.speedup_bar(82e12, 165e12) == 1.5
    assert lab10.speedup_bar(51e12, 692e12) == pytest.approx(5.43, rel=0.01)
    with pytest.raises(ValueError):
        lab10.speedup_bar(0, 1)


def _glued_notebook(values):
    cells = [{"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1,
              "outputs": [{"output_type": "display_data",
                           "metadata": {"scrapbook": {"name": k, "mime_prefix":
                                                      "application/papermill.record/"}},
                           "data": {"application/papermill.record/text/plain": repr(v)}}
                          for k, v in values.items()]}]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.parametrize("with_reference", [False, True])
def test_overlay_cell_runs_with_and_without_the_reference(tmp_path, monkeypatch, capsys,
                                                          with_reference):
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import perflab
    from perflab.labs.exercises import overlay_table

    (tmp_path / "labs").mkdir()
    (tmp_path / "book").mkdir()
    if with_reference:
        ladder = [{"name": "baseline", "tokens_per_s": 44_500.0, "mfu": 0.038},
                  {"name": "fused AdamW", "tokens_per_s": 512_000.0, "mfu": 0.44}]
        nb = _glued_notebook({"gpt2_tokens_per_s": 536_000.0, "gpt2_mfu": 0.46,
                              "gpt2_speedup_vs_baseline": 12.0,
                              "gpt2_speed_ladder": json.dumps(ladder)})
        (tmp_path / "book" / "10_gpt2_case_study.ipynb").write_text(json.dumps(nb))
        # the memory ladder is the chapter's section page
        mem = _glued_notebook({"gpt2_memory_reduction": 5.0})
        mem["metadata"]["reference_run"] = {"devices": ["NVIDIA H200"], "git": "abc1234def",
                                            "started": "2026-12-05T04:00:00Z",
                                            "ceilings": {"run": "gpu-2026-12-05-abc1234"}}
        (tmp_path / "book" / "10_gpt2_memory_ladder.ipynb").write_text(json.dumps(mem))
    monkeypatch.chdir(tmp_path / "labs")
    run = SimpleNamespace(tokens_per_s=1000.0, rung={"name": "x"}, mfu=lambda c: 0.3)
    ref_path = Path("../book/10_gpt2_case_study.ipynb")
    ns = {"Path": Path, "perflab": perflab, "plt": plt, "lab10": lab10, "overlay_table": overlay_table,
          "ceiling": 1e12, "ref_path": ref_path,
          "ref": perflab.record.provenance.read_glued(ref_path) if ref_path.exists() else {},
          "ref_fraction": lab10.reference_fraction(536_000.0) if with_reference else None,
          "speed": {"base": run, "mine": run, "fraction": 0.3, "speedup": 2.0},
          "lean": {"ratio": 0.25}}
    lab = jupytext.read(LAB)
    # the reference's bookkeeping (hidden), the table, the memory row's run (hidden)
    for needle in ("ladder = lab10.reference_ladder(", 's = globals().get("speed")',
                   "if mem_run:"):
        exec(compile(code_cell(lab, needle), f"<lab10 {needle}>", "exec"), ns)
    src = code_cell(lab, "theirs = [")               # the figure, a cell of its own
    exec(compile(src, "<lab10 figure>", "exec"), ns)
    yours = {r[0]: r for r in ns["rows"]}
    assert yours["peak reduction (ch.: 64-seq. ladder)"][1] == 4.0
    if with_reference:
        assert len(ns["theirs"]) == 2 and yours["speedup over each one's own baseline"][2] == 12.0
        assert yours["peak reduction (ch.: 64-seq. ladder)"][2] == 5.0
        # the memory row's notebook is named with its own run, by its record's name (run
        # 439fc20's metadata git was a stale checkout's; its ceilings' run was right)
        assert "run gpu-2026-12-05-abc1234 started 2026-12-05" in capsys.readouterr().out
        assert 0.5 < yours["MFU, fastest rung (ch.: at ceiling clock)"][2] < 0.8
    else:
        assert ns["theirs"] == [] and yours["tokens/s, fastest rung (ch.: its headline)"][2] is None
    plt.close("all")
