"""Lab 7: every check rejects a plausible wrong answer and accepts the reference solution (CPU),
and an unfinished exercise says so in one sentence."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest
import torch
import torch.nn.functional as F

from perflab.memory import predict, snapshots
from perflab.memory.model import BlockStack, BlockStackConfig
from perflab.memory.steps import train_step
from perflab.labs import lab07
from perflab.labs.exercises import ExerciseFailed

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "07_memory.md"
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402


from lab_cells import code_cell as _cell, run_reference_cell  # noqa: E402


@pytest.fixture(scope="module")
def ns():
    """The lab's set-up and exercise cells (solutions included), executed on CPU sizes."""
    nb = jupytext.read(LAB)
    space: dict = {}
    for needle in ("dev = device()", "cfg1 = ", "predicted_static = None", "cfg2 = ",
                   "def lean_step", "class Monitor", "cycle_attribute = None"):
        exec(compile(_cell(nb, needle), f"<lab7 {needle}>", "exec"), space)
    return space


def test_student_version_is_valid_python(tmp_path):
    assert make_student.main([str(LAB), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / "07_memory.ipynb")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)


def _model_after_a_step(ns):
    cfg = ns["cfg1"]
    model = BlockStack(cfg)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, cfg.seq_len, cfg.d_model)
    train_step(model, opt, x, torch.randn_like(x))
    return model, opt


def test_static_check(ns):
    model, opt = _model_after_a_step(ns)
    with pytest.raises(ExerciseFailed, match="Exercise 1 is not done yet"):
        lab07.check_static_prediction(None, model, opt, "cpu")
    without_adam = ns["predicted_static"] // 16 * 8          # forgot Adam's two moments
    with pytest.raises(ExerciseFailed):
        lab07.check_static_prediction(without_adam, model, opt, "cpu")
    assert lab07.check_static_prediction(ns["predicted_static"], model, opt, "cpu")


def test_peak_cut_check(ns):
    args = (ns["make_model"], train_step)
    x, y = ns["x2"], ns["y2"]

    def zero_grad_inside(model, opt, x, y):          # saves memory, but trains differently
        total = 0.0
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(xs), ys) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        return total

    def unscaled(model, opt, x, y):                  # right loop, loss not divided
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            loss = F.mse_loss(model(xs), ys)
            loss.backward()
            total += loss.item()
        opt.step()
        return total

    def not_done(model, opt, x, y):
        raise NotImplementedError()

    with pytest.raises(ExerciseFailed, match="Exercise 2 is not done yet"):
        lab07.check_peak_cut(*args, not_done, x, y, "cpu")
    # each mistake is named by what it did to the accumulated gradient
    with pytest.raises(ExerciseFailed, match="clear the gradients once"):
        lab07.check_peak_cut(*args, zero_grad_inside, x, y, "cpu")
    with pytest.raises(ExerciseFailed, match="4 times the batch's: divide"):
        lab07.check_peak_cut(*args, unscaled, x, y, "cpu")
    with pytest.raises(ExerciseFailed, match="peak"):
        lab07.check_peak_cut(*args, train_step, x, y, "cpu")   # no saving
    assert lab07.check_peak_cut(*args, ns["lean_step"], x, y, "cpu") <= 0.6


def test_leak_check(ns):
    Monitor, Fixed, n = ns["Monitor"], ns["FixedMonitor"], 1000
    with pytest.raises(ExerciseFailed, match="Exercise 3 is not done yet"):
        lab07.check_no_leak(None, Monitor, n, "cpu", None)
    with pytest.raises(ExerciseFailed, match="attribute"):
        lab07.check_no_leak(Fixed, Monitor, n, "cpu", "activations")
    with pytest.raises(ExerciseFailed, match="outlives"):
        lab07.check_no_leak(Monitor, Monitor, n, "cpu", "hooks")      # the leaky class itself

    class NoHook(Monitor):                                          # no cycle, but no hook
        def __init__(self, size):
            self.activations = torch.empty(size)
            self.steps = 0
            self.hooks = {"after_step": lambda value: None}

    with pytest.raises(ExerciseFailed, match="hook"):
        lab07.check_no_leak(NoHook, Monitor, n, "cpu", "hooks")
    assert lab07.check_no_leak(Fixed, Monitor, n, "cpu", ns["cycle_attribute"])


def test_snapshot_check():
    cfg = BlockStackConfig(d_model=32, n_heads=8, n_layers=1, seq_len=64)
    model = BlockStack(cfg)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, cfg.seq_len, cfg.d_model)
    step = lambda: train_step(model, opt, x, torch.randn_like(x))  # noqa: E731
    step()
    snap = snapshots.cpu_memory_trace(step)
    sizes = predict.block_tensor_bytes(cfg, 2)
    allocs = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    with pytest.raises(ExerciseFailed, match="Exercise 4 is not done yet"):
        lab07.check_largest_allocation(snap, cfg, 2, None, None, None)
    half = {k: v // 2 for k, v in sizes.items()}                    # bfloat16 sizes
    with pytest.raises(ExerciseFailed, match="predicted size of"):
        lab07.check_largest_allocation(snap, cfg, 2, half, max(allocs), "attention scores")
    with pytest.raises(ExerciseFailed, match="map each of"):
        lab07.check_largest_allocation(snap, cfg, 2, {"qkv": 1}, max(allocs), "qkv")
    with pytest.raises(ExerciseFailed, match="size"):
        lab07.check_largest_allocation(snap, cfg, 2, sizes, allocs[-1], "attention scores")
    with pytest.raises(ExerciseFailed, match="tensor"):
        lab07.check_largest_allocation(snap, cfg, 2, sizes, max(allocs), "MLP hidden")
    assert snapshots.name_allocation(max(allocs), sizes) == "attention scores"
    assert lab07.check_largest_allocation(snap, cfg, 2, dict(sizes), max(allocs),
                                        "attention scores")


def test_the_snapshot_check_writes_every_size_in_one_format(capsys):
    """Reader review M2: lab 7 printed "1.049M", "262.1k" and "2097152" in one block."""
    cfg = BlockStackConfig(d_model=32, n_heads=8, n_layers=1, seq_len=64)
    model = BlockStack(cfg)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, cfg.seq_len, cfg.d_model)
    snap = snapshots.cpu_memory_trace(lambda: train_step(model, opt, x, torch.randn_like(x)))
    sizes = predict.block_tensor_bytes(cfg, 2)
    allocs = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    capsys.readouterr()
    lab07.check_largest_allocation(snap, cfg, 2, dict(sizes), max(allocs), "attention scores")
    lines = [line for line in capsys.readouterr().out.splitlines() if "size" in line]
    assert len(lines) == len(sizes) + 1, lines
    assert all(line.startswith("✓") and "iB is right" in line and "(bytes)" not in line
               for line in lines), lines


@pytest.mark.parametrize("reference_run", [True, False])
def test_the_reference_run_compares_with_itself_not_with_an_earlier_run(reference_run, monkeypatch):
    """Review F20: executed as the reference run (execute.py sets PERFLAB_REFERENCE_RUN), the
    closing table's reference column is this run's own numbers (the exercises not done left
    out); anywhere else it reads the committed reference notebook."""
    ns = run_reference_cell(jupytext.read(LAB), monkeypatch, reference_run,
                            {"lab07_peak_ratio": 0.5},
                            {"static_error": 0.01, "peak_ratio": 0.3, "largest_bytes": None})
    if reference_run:
        assert ns["ref"] == {"lab07_static_error": 0.01, "lab07_peak_ratio": 0.3}
        assert ns["run"] is None
    else:
        assert ns["ref"] == {"lab07_peak_ratio": 0.5} and ns["run"]["git"] == "0" * 40
