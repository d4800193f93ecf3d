"""Lab 3: its student version is valid Python, and its checks can fail (they reject the baseline)."""

import ast
import multiprocessing
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "03_internals.md"
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

from perflab.internals import autograd, hostsync  # noqa: E402


from lab_cells import code_cell as _cell  # noqa: E402


@pytest.fixture(scope="module")
def lab_namespace():
    """The lab's set-up, the training-loop cell and the solution cells, executed on CPU sizes."""
    nb = jupytext.read(LAB)
    ns: dict = {}
    for needle in ("dev = device()", "def make_problem", "def train_fast", "def silu_naive",
                   "class SiLU"):
        exec(compile(_cell(nb, needle), f"<lab3 cell {needle}>", "exec"), ns)
    return ns


def test_student_version_is_valid_python(tmp_path):
    assert make_student.main([str(LAB), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / "03_internals.ipynb")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)  # a SyntaxError here would greet every student


def test_sync_check_rejects_the_baseline_and_accepts_the_solution(lab_namespace):
    ns = lab_namespace
    model, xs, ys = ns["make_problem"]()
    _, slow = hostsync.count_host_syncs(ns["train_slow"], model, ns["make_optimizer"](model), xs, ys)
    _, fast = hostsync.count_host_syncs(ns["train_fast"], model, ns["make_optimizer"](model), xs, ys)
    steps = len(xs)
    # per step: two boolean masks, the NaN guard, .item() and the f-string
    assert slow == {"__getitem__": 2 * steps, "__bool__": steps, "item": steps, "__format__": steps}
    assert sum(fast.values()) == 0


def test_saved_bytes_check_rejects_a_function_that_saves_everything(lab_namespace):
    ns = lab_namespace

    class SaveAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            s = torch.sigmoid(x)
            ctx.save_for_backward(x, s, s * (1 - s))
            return x * s

        @staticmethod
        def backward(ctx, grad_out):
            x, s, ds = ctx.saved_tensors
            return grad_out * (s + x * ds)

    class SaveTwo(torch.autograd.Function):      # x and sigmoid(x): nothing recomputed
        @staticmethod
        def forward(ctx, x):
            s = torch.sigmoid(x)
            ctx.save_for_backward(x, s)
            return x * s

        @staticmethod
        def backward(ctx, grad_out):
            x, s = ctx.saved_tensors
            return grad_out * s * (1 + x * (1 - s))

    x = torch.randn(1000, requires_grad=True)
    one_tensor = x.numel() * x.element_size()
    naive = autograd.saved_tensors(ns["silu_naive"], x).bytes
    assert naive == 4 * one_tensor                          # x, exp, reciprocal, sigmoid(x)
    assert autograd.saved_tensors(SaveAll.apply, x).bytes > one_tensor    # the check fails it
    assert autograd.saved_tensors(SaveTwo.apply, x).bytes > one_tensor    # and this one
    assert autograd.saved_tensors(ns["SiLU"].apply, x).bytes <= one_tensor  # the solution passes


def test_graph_keeps_sees_every_way_of_keeping_a_tensor(lab_namespace):
    """The reference keeps x through save_for_backward only; each other way of keeping a tensor
    for backward (a ctx attribute, a global, a clone in a module, a copy of the data as Python
    floats) is named by hidden_keeps, and a class that is no autograd.Function is refused."""
    from perflab.labs import lab03
    from perflab.labs.exercises import ExerciseFailed

    xs = torch.randn(2**12, requires_grad=True)
    ref = lab03.graph_keeps(lab_namespace["SiLU"], xs, seed=0)
    assert lab03.hidden_keeps(ref) == [] and ref["saved_bytes"] == 4 * 2**12 and ref["node"]
    store = {}

    def silu(forward, backward):
        return type("Hiding", (torch.autograd.Function,), {
            "forward": staticmethod(lambda ctx, x: (forward(ctx, x), x * torch.sigmoid(x))[1]),
            "backward": staticmethod(lambda ctx, g: (lambda x: g * torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))))(
                backward(ctx)))})

    ways = {"ctx dict": (lambda c, x: setattr(c, "d", {"x": x}), lambda c: c.d["x"]),
            "ctx attribute": (lambda c, x: setattr(c, "x", x), lambda c: c.x),
            "ctx list": (lambda c, x: setattr(c, "l", [x]), lambda c: c.l[0]),
            "closure": (lambda c, x: setattr(c, "get", lambda: x), lambda c: c.get()),
            "global": (lambda c, x: store.__setitem__("x", x), lambda c: store["x"]),
            "clone in a module": (lambda c, x: setattr(torch, "_kept_for_test", x.detach().clone()),
                                  lambda c: torch._kept_for_test),
            "python floats": (lambda c, x: setattr(c, "v", x.tolist()), lambda c: torch.tensor(c.v))}
    try:
        for name, (forward, backward) in ways.items():
            kept = lab03.graph_keeps(silu(forward, backward), xs, seed=1)
            assert lab03.hidden_keeps(kept), name
    finally:
        vars(torch).pop("_kept_for_test", None)
    with pytest.raises(ExerciseFailed, match="deriving from torch.autograd.Function"):
        lab03.check_function_class(type("SiLU", (), {"apply": staticmethod(torch.nn.functional.silu)}))
    with pytest.raises(ExerciseFailed, match="overrides apply"):
        lab03.check_function_class(type("SiLU", (lab_namespace["SiLU"],), {"apply": staticmethod(torch.sigmoid)}))


def test_the_stride_check_asks_about_the_labs_own_expressions():
    """check_strides keeps its own list (a student's code could empty the notebook's): it must be
    the page's list, in the page's order."""
    from perflab.labs import lab03

    ns: dict = {}
    exec(compile(_cell(jupytext.read(LAB), 'expressions = ['), "<lab3 expressions>", "exec"), {"torch": torch}, ns)
    assert tuple(ns["expressions"]) == lab03.STRIDE_EXPRESSIONS


_REFERENCE = """
import torch


class SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_out * s * (1 + x * (1 - s))


def verdict(n):
    from perflab.labs import lab03
    kept = lab03.graph_keeps(SiLU, torch.randn(n), seed=3)
    return lab03.hidden_keeps(kept), kept["saved_bytes"]
"""


@pytest.mark.parametrize("method", [m for m in ("spawn", "forkserver")
                                    if m in multiprocessing.get_all_start_methods()])
def test_graph_keeps_passes_the_reference_in_a_fresh_process(method, tmp_path):
    """A grader's kernel is a fresh process: the reference must pass there too (the first use of
    the dispatch mode and of autograd imports modules, which must not count as kept memory),
    in a worker started with spawn or forkserver, on CPU."""
    (tmp_path / "ref_silu.py").write_text(_REFERENCE)
    code = (f"import multiprocessing, sys\nsys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]\n"
            "import ref_silu\n"
            "if __name__ == '__main__':\n"
            f"    with multiprocessing.get_context({method!r}).Pool(1) as pool:\n"
            "        print(pool.apply(ref_silu.verdict, (2**16,)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"([], {4 * 2**16})"
