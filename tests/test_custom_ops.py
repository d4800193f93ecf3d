"""perflab.kernels.custom_ops: the C++ extension builds, registers, passes opcheck and compiles unbroken.

The build is cached in TORCH_EXTENSIONS_DIR (the clone's .cache by default), shared with
chapter 9 and lab 9, so CI compiles it once.
"""

import pytest
import torch

from perflab.kernels import axpby
from perflab.kernels import custom_ops
from perflab.kernels.compiler import graph_breaks
from perflab.labs import lab09
from perflab.labs.exercises import ExerciseFailed


@pytest.fixture(scope="module")
def built():
    return custom_ops.build_extension(cuda_source="")


def test_extension_dir_defaults_inside_the_clone(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert custom_ops.extension_dir() == custom_ops.ROOT / ".cache" / "torch_extensions"


def test_build_is_named_by_its_source_and_cached(built):
    assert built.name.startswith("perflab_axpby_") and not built.cuda
    assert custom_ops.build_extension(cuda_source="") is built
    with pytest.raises(ValueError):
        custom_ops.build_extension("   ")
    with pytest.raises(TypeError):
        custom_ops.build_extension(3)


def test_registered_operator_is_right_and_compiles_without_break(built):
    """The page's registration (perflab.kernels.axpby.register) of the page's C++ kernel."""
    op = axpby.register("test09::page_axpby", torch.ops.perflab_ext.axpby)
    x = torch.randn(100, requires_grad=True)
    y = torch.randn(100, requires_grad=True)
    out = op(x, 2.0, y, -0.5)
    torch.testing.assert_close(out, 2.0 * x - 0.5 * y)
    torch.library.opcheck(op, (x, 2.0, y, -0.5))
    assert graph_breaks(lambda p, q: op(p.sin(), 2.0, q, 1.0), x, y).breaks == 0
    f = torch.compile(lambda p, q: op(p, 2.0, q, 3.0).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, y).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    torch.testing.assert_close(y.grad, torch.full_like(y, 3.0))
    with pytest.raises(RuntimeError, match="differ in shape"):
        torch.ops.perflab_ext.axpby(torch.ones(3), 1.0, torch.ones(4), 1.0)


def test_fused_speedup_check_times_eager_against_yours_and_applies_the_bar(built, monkeypatch):
    """The ratio comes from paired_ratio (faked here: how fast a CPU is belongs to lab 9's run,
    not to a unit test); the check must pass eager as the base and the student's operator as
    the candidate, and hold the ratio to cpu_minimum."""
    calls = []

    def kernel(*args):
        calls.append(1)
        return torch.ops.perflab_ext.axpby(*args)

    seen = []

    def fake_ratio(ratio):
        def paired(base, candidate):
            before = len(calls)
            eager = base()
            assert len(calls) == before, "the base of the ratio must be eager a*x + b*y"
            seen.append((eager, candidate()))
            assert len(calls) == before + 1, "the candidate must be the student's operator"
            return ratio, (ratio,)
        return paired

    monkeypatch.setattr(lab09, "paired_ratio", fake_ratio(1.6))
    assert lab09.check_fused_speedup(kernel, "cpu", 1024) == 1.6
    (eager_out, fused_out), = seen
    torch.testing.assert_close(fused_out, eager_out)
    assert eager_out.numel() == lab09.CPU_TIMING_NUMEL          # small sizes are raised on a CPU
    monkeypatch.setattr(lab09, "paired_ratio", fake_ratio(1.1))
    with pytest.raises(ExerciseFailed, match="1.10x the eager composition; it must reach 1.20x"):
        lab09.check_fused_speedup(kernel, "cpu", 1024)
    with pytest.raises(ExerciseFailed, match="differs"):
        lab09.check_fused_speedup(lambda x, a, y, b: kernel(x, a, y, -b), "cpu", 1024)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab09.check_fused_speedup(None, "cpu", 1024)


def test_registration_check_rejects_wrong_gradients_and_missing_fake(built):
    kernel = torch.ops.perflab_ext.axpby
    good = axpby.register("test09::good", lambda x, a, y, b: kernel(x, a, y, b))
    assert lab09.check_registered(good, "cpu")

    @torch.library.custom_op("test09::nofake", mutates_args=())
    def nofake(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
        return kernel(x, a, y, b)

    nofake.register_autograd(lambda ctx, g: (ctx.a * g, None, ctx.b * g, None),
                             setup_context=lambda ctx, inputs, output: setattr(ctx, "a", inputs[1])
                             or setattr(ctx, "b", inputs[3]))
    with pytest.raises(ExerciseFailed, match="opcheck"):
        lab09.check_registered(nofake, "cpu")

    @torch.library.custom_op("test09::badgrad", mutates_args=())
    def badgrad(x: torch.Tensor, a: float, y: torch.Tensor, b: float) -> torch.Tensor:
        return kernel(x, a, y, b)

    badgrad.register_fake(lambda x, a, y, b: torch.empty_like(x))
    badgrad.register_autograd(lambda ctx, g: (g, None, g, None),
                              setup_context=lambda ctx, inputs, output: None)
    with pytest.raises(ExerciseFailed, match="gradients"):
        lab09.check_registered(badgrad, "cpu")
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab09.check_registered(None, "cpu")
    with pytest.raises(ExerciseFailed, match="not an operator"):
        lab09.check_registered(custom_ops.axpby_eager, "cpu")


def test_a_broken_source_raises_and_names_itself():
    broken = axpby.CPP_SOURCE.replace("po[i] = fa", "po[i] = undefined_name + fa")
    with pytest.raises(RuntimeError):
        custom_ops.build_extension(broken, cuda_source="")
