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
from perflab.core.rounds import spread  # noqa: E402
from perflab.kernels.custom_ops import triton_modules  # noqa: E402
from perflab.labs.exercises import ExerciseFailed, ExerciseNotDone  # noqa: E402


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


def test_fused_check_counts_operators_before_it_times():
    """Review N11: a partial fusion, torch.add(a * x, y, alpha=b), saves one pass (5 tensors'
    bytes against eager's 7, ~1.4x on a GPU, above the old 1.3x bar) but runs two operators:
    refused whatever its speed, as is eager's composition of three."""
    def partial(x, a, y, b):
        return torch.add(a * x, y, alpha=b)

    with pytest.raises(ExerciseFailed, match="one call ran 2 ATen operators"):
        lab09.check_fused_speedup(partial, "cpu", 1024)
    with pytest.raises(ExerciseFailed, match="one call ran 3 ATen operators"):
        lab09.check_fused_speedup(lambda x, a, y, b: a * x + b * y, "cpu", 1024)


def test_fused_check_rejects_a_kernel_that_reads_a_view_as_contiguous():
    """The student review: a C++ loop without .contiguous() passed on one contiguous pair; on
    a view of every other element it reads other elements, and the check must say so."""
    def flat(x, a, y, b):
        return torch.as_strided(x, (x.numel(),), (1,)) * a + y * b

    with pytest.raises(ExerciseFailed, match="non-contiguous x"):
        lab09.check_fused_speedup(flat, "cpu", 1024)


def test_precision_choice_on_measured_cpu_numbers():
    """Measured losses (timings given): pure bf16, the fastest, drifts away and is refused."""
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = 2 * torch.tanh(x @ torch.randn(16, 16) / 4) @ torch.randn(16, 1) / 4
    seconds = {"fp32": spread([1.0, 1.1, 0.9]), "bf16_pure": spread([0.5, 0.6, 0.4])}
    losses = {}                                              # timing is not tested here
    for mode in seconds:
        step = amp.make_train_step(precision.make_mlp(16, 1, "cpu"), x, y, mode, lr=2e-4)
        losses[mode] = [float(step()) for _ in range(60)][-1]
    assert losses["bf16_pure"] > 1.05 * losses["fp32"]
    with pytest.raises(ExerciseFailed):
        lab09.check_precision_choice("bf16_pure", seconds, losses)
    assert lab09.check_precision_choice("fp32", seconds, losses)


def test_precision_choice_compares_round_by_round_and_needs_rounds():
    """A slower mode passes only when it ties round by round: a load burst that slows one
    round of every mode cannot make fp32 tie with a mode 1.5x faster."""
    losses = {"fp32": 1.0, "bf16": 1.01, "bf16_pure": 1.5}
    burst = [1.0, 1.0, 6.0, 1.0, 1.0]              # round 3 ran on a loaded host
    seconds = {"fp32": spread([1.5 * b for b in burst]), "bf16": spread(burst),
               "bf16_pure": spread([0.7 * b for b in burst])}
    assert lab09.check_precision_choice("bf16", seconds, losses)
    with pytest.raises(ExerciseFailed, match="1.50x faster than 'fp32'"):
        lab09.check_precision_choice("fp32", seconds, losses)
    tie = dict(seconds, fp32=spread([1.05 * b for b in burst]))
    assert lab09.check_precision_choice("fp32", tie, losses)       # within the 10 % noise
    with pytest.raises(ExerciseFailed, match="interleaved rounds"):
        lab09.check_precision_choice("bf16", {m: s.median for m, s in seconds.items()}, losses)
    with pytest.raises(ExerciseFailed, match="interleaved rounds"):    # not the same rounds
        lab09.check_precision_choice("bf16", dict(seconds, bf16=spread([1.0, 1.0])), losses)


def _torch_row_loss(logits, targets):
    return torch.logsumexp(logits, 1) - logits.gather(1, targets[:, None])[:, 0]


def test_row_loss_check_counts_torch_operators_and_rejects_wrong_tails(monkeypatch):
    """Without a GPU (and whether Triton is installed or not): a torch composition is right but
    three kernels; a row pass that pads the tail with zeros is one 'kernel' but wrong."""
    with pytest.raises(ExerciseFailed, match="one call ran 3 kernels"):
        lab09.check_row_loss(_torch_row_loss, "cpu")

    def zero_tail(logits, targets):          # the tail's lanes left at 0: the classic mistake
        block = 512
        pad = -logits.shape[1] % block
        padded = F.pad(logits, (0, pad))
        return torch.logsumexp(padded, 1) - logits.gather(1, targets[:, None])[:, 0]

    with pytest.raises(ExerciseFailed, match="wrong losses"):
        lab09.check_row_loss(zero_tail, "cpu")
    n, names = lab09.kernels_in_call(_torch_row_loss, torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
    assert n == 3 and "aten::logsumexp" in names


def test_row_loss_check_without_triton_says_so(monkeypatch, capsys):
    monkeypatch.setattr(lab09, "triton_modules", lambda: (None, None))
    assert lab09.check_row_loss(None, "cpu") is None
    assert "not installed" in capsys.readouterr().out


@pytest.mark.parametrize("installed", [False, True])
def test_row_loss_check_stops_at_the_stub_with_or_without_triton(monkeypatch, installed):
    """The lab's stub (``...``) is no answer anywhere; None is one only where Triton is not
    installed (the reference's answer there), never where it is."""
    fake = (object(), object()) if installed else (None, None)
    monkeypatch.setattr(lab09, "triton_modules", lambda: fake)
    stub = lab09.row_loss_launcher(...)
    assert stub is Ellipsis
    with pytest.raises(ExerciseNotDone, match=r"^Exercise 5 is not done yet: [^\n]+\.$") as err:
        lab09.check_row_loss(stub, "cpu")
    assert ("pip install triton" in str(err.value)) is not installed
    if installed:
        with pytest.raises(ExerciseNotDone):
            lab09.check_row_loss(None, "cpu")


@pytest.mark.skipif(triton_modules()[0] is None, reason="Triton is not installed here")
def test_row_loss_check_passes_one_interpreted_triton_kernel_and_fails_a_wrong_mask():
    """Triton's interpreter runs the lab's kernel on the CPU (it must be switched on before the
    kernel is defined, so the kernels are defined in a fresh process)."""
    import subprocess
    import textwrap
    code = textwrap.dedent("""
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        import torch, triton, triton.language as tl
        from perflab.labs import lab09
        from perflab.labs.exercises import ExerciseFailed

        def make(other):
            @triton.jit
            def kernel(x_ptr, t_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, OTHER: tl.constexpr):
                row = tl.program_id(0).to(tl.int64)
                start = x_ptr + row * n_cols
                big, total = -float("inf"), 0.0
                for first in range(0, n_cols, BLOCK):
                    cols = first + tl.arange(0, BLOCK)
                    x = tl.load(start + cols, mask=cols < n_cols, other=OTHER)
                    new = tl.maximum(big, tl.max(x, 0))
                    total = total * tl.exp(big - new) + tl.sum(tl.exp(x - new), 0)
                    big = new
                target = tl.load(start + tl.load(t_ptr + row))
                tl.store(out_ptr + row, big + tl.log(total) - target)

            def row_loss(logits, targets):
                out = torch.empty(logits.shape[0])
                kernel[(logits.shape[0],)](logits, targets, out, logits.shape[1], BLOCK=1024,
                                           OTHER=other)
                return out
            return row_loss

        assert lab09.check_row_loss(make(-float("inf")), "cpu") is None
        try:
            lab09.check_row_loss(make(0.0), "cpu")
        except ExerciseFailed as err:
            assert "wrong losses" in str(err)
            print("REJECTED")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REJECTED" in out.stdout


def test_amp_overlay_puts_the_reference_beside_yours_only_at_the_same_size():
    """Review N17: the overlay once set a width-1,024 lab step beside the chapter's width-2,048
    one under one label. The reference stands beside the student's gain only where width,
    depth and batch all match; a depth that differs, or one the chapter's notebook does not
    glue, gives the reference a row of its own with its size."""
    ref = {"amp_width": 2048, "amp_depth": 4, "amp_batch": 2048, "amp_bf16_speedup": 5.2}
    same = lab09.amp_overlay_rows(ref, (2048, 4, 2048), 4.9)
    assert same == [("bf16 vs fp32 step, width 2048, 4 blocks, batch 2048", 4.9, 5.2, "x")]
    deeper = lab09.amp_overlay_rows(ref, (2048, 8, 2048), 4.9)
    assert deeper[0][1:3] == (4.9, None) and deeper[1][1:3] == (None, 5.2)
    assert "4 blocks" in deeper[1][0] and "8 blocks" in deeper[0][0]
    old = lab09.amp_overlay_rows({"amp_width": 2048, "amp_batch": 2048, "amp_bf16_speedup": 5.2},
                                 (2048, 4, 2048), 4.9)
    assert old[0][2] is None and "not glued" in old[1][0]
    assert lab09.amp_overlay_rows({}, (128, 2, 128), None) == [
        ("bf16 vs fp32 step, width 128, 2 blocks, batch 128", None, None, "x")]
    with pytest.raises(ValueError, match="size"):
        lab09.amp_overlay_rows(ref, (2048, 2048), 4.9)
