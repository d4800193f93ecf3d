"""Lab 9: the student edition is valid Python, and each check rejects a wrong answer (CPU)."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "09_advanced.md"
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

from perflab.kernels import amp, compiler, precision  # noqa: E402
from perflab.labs import lab09  # noqa: E402
from perflab.labs.exercises import ExerciseFailed  # noqa: E402


from lab_cells import code_cells as _cells  # noqa: E402


def test_student_version_is_valid_python(tmp_path):
    assert make_student.main([str(LAB), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / "09_advanced.ipynb")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)


def test_every_name_a_check_reads_has_a_stub_outside_the_solution():
    nb = jupytext.read(LAB)
    for cell in nb.cells:
        src = cell.source
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in src:
            before = src.split("### BEGIN SOLUTION")[0]
            for name in ("fused_axpby", "registered_axpby", "fixed", "choice", "seconds", "losses"):
                if f"{name} =" in src.split("### BEGIN SOLUTION")[1] or f"def {name}(" in src:
                    assert f"{name} = None" in before, f"{name} needs a stub line"


def test_the_cpu_solution_reuses_the_chapter_extension_source():
    # one build shared by chapter 9 and lab 9: CI compiles it once
    (cell,) = _cells(jupytext.read(LAB), "cpp_source = ")
    assert "axpby.CPP_SOURCE" in cell


@pytest.fixture(scope="module")
def lab():
    nb = jupytext.read(LAB)
    ns = {}
    exec(compile(_cells(nb, "dev = device()")[0], "<lab9 setup>", "exec"), ns)
    for needle in ("def normalize", "def fixed"):
        exec(compile(_cells(nb, needle)[0], f"<lab9 {needle}>", "exec"), ns)
    return ns


def test_graph_break_check_on_the_lab_function(lab):
    x = torch.randn(16, 32) * 0.5     # no row over the limit; the check also tries -3x
    assert lab09.check_graph_break_fixed(lab["normalize"], lab["fixed"], x)
    with pytest.raises(ExerciseFailed, match="still has"):
        lab09.check_graph_break_fixed(lab["normalize"], lab["normalize"], x)

    def wrong(x, limit=4.0):      # one graph, but rescales every row
        return F.gelu(x * (limit / x.norm(dim=-1, keepdim=True)))

    with pytest.raises(ExerciseFailed, match="different result"):
        lab09.check_graph_break_fixed(lab["normalize"], wrong, x)


def test_precision_choice_on_measured_cpu_numbers():
    """Measured losses (timings given): pure bf16, the fastest, drifts away and is refused."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = 2 * torch.tanh(x @ torch.randn(16, 16) / 4) @ torch.randn(16, 1) / 4
    seconds, losses = {"fp32": 1.0, "bf16_pure": 0.5}, {}   # timing is not tested here
    for mode in seconds:
        step = amp.make_train_step(precision.make_mlp(16, 1, "cpu"), x, y, mode, lr=2e-4)
        losses[mode] = [float(step()) for _ in range(60)][-1]
    assert losses["bf16_pure"] > 1.05 * losses["fp32"]
    with pytest.raises(ExerciseFailed):
        lab09.check_precision_choice("bf16_pure", seconds, losses)
    assert lab09.check_precision_choice("fp32", seconds, losses)
