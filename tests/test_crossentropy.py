import pytest
import torch
import torch.nn.functional as F

from perflab.gpt2 import heads
from perflab.kernels import crossentropy


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def test_loss_and_grad_match_autograd_of_the_plain_loss():
    torch.manual_seed(0)
    logits = torch.randn(24, 37) * 4
    y = torch.randint(0, 37, (24,))
    grad = torch.empty_like(logits)
    rows = heads.loss_and_grad(logits, y, grad, grad_scale=1.0 / 24)
    ref = logits.clone().requires_grad_()
    loss = F.cross_entropy(ref, y)
    loss.backward()
    assert rows.dtype == torch.float32 and rows.shape == (24,)
    assert float(rows.mean()) == pytest.approx(float(loss.detach()), rel=1e-6)
    torch.testing.assert_close(rows, F.cross_entropy(logits, y, reduction="none"))
    torch.testing.assert_close(grad, ref.grad)
    # a statically scaled gradient: every value within the bound, the sign of p - one_hot
    g8 = torch.empty(24, 37, dtype=torch.float8_e5m2)
    heads.loss_and_grad(logits, y, g8, grad_scale=torch.finfo(torch.float8_e5m2).max)
    assert torch.isfinite(g8.float()).all()
    assert (g8.float()[torch.arange(24), y] <= 0).all()
    assert rel(g8.float() / (24 * torch.finfo(torch.float8_e5m2).max), ref.grad) < 0.15


def test_bad_inputs_raise():
    x = torch.randn(4, 8)
    y = torch.randint(0, 8, (4,))
    with pytest.raises(ValueError, match="y int64"):
        heads.loss_and_grad(x, y.int(), torch.empty_like(x), 1.0)
    with pytest.raises(ValueError, match="grad must be"):
        heads.loss_and_grad(x, y, torch.empty(4, 7), 1.0)
    with pytest.raises(ValueError, match="contiguous rows"):
        heads.loss_and_grad(x.t().contiguous().t(), y, torch.empty_like(x), 1.0)
    with pytest.raises(ValueError, match="finite"):
        heads.loss_and_grad(x, y, torch.empty_like(x), float("inf"))
    with pytest.raises(ValueError, match="float"):
        heads.linear_cross_entropy(torch.ones(4, 3, dtype=torch.int64), torch.ones(8, 3), y)
    with pytest.raises(ValueError, match="target"):
        heads.linear_cross_entropy(torch.randn(4, 3), torch.randn(8, 3), y[:3])
    with pytest.raises(ValueError, match=r"w \(V, d\)"):
        heads.linear_cross_entropy(torch.randn(4, 3), torch.randn(8, 2), y)
    with pytest.raises(ValueError, match="contiguous 2-D"):
        crossentropy.transpose(x.t())


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_head_trains_like_the_plain_one(autocast):
    torch.manual_seed(1)
    h0 = torch.randn(2, 8, 16)
    w0 = torch.randn(40, 16) * 0.3
    y = torch.randint(0, 40, (2, 8))

    def run(loss_fn):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(h, w) * 0.25          # a later scale reaches the gradients
        loss.backward()
        return loss.detach(), h.grad, w.grad

    got = run(lambda h, w: heads.linear_cross_entropy(h, w, y))
    ref = run(lambda h, w: F.cross_entropy((h @ w.t()).flatten(0, 1).float(),
                                           y.flatten()))
    tol = 2e-2 if autocast else 1e-5
    assert got[0].dtype == torch.float32
    assert got[1].dtype == got[2].dtype == torch.float32     # the inputs' dtypes
    assert float(got[0]) == pytest.approx(float(ref[0]), rel=tol)
    assert rel(got[1], ref[1]) < tol and rel(got[2], ref[2]) < tol


def test_transpose_copies_any_dtype():
    t = torch.arange(12.0).reshape(3, 4)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e5m2):
        out = crossentropy.transpose(t.to(dtype))
        assert out.shape == (4, 3) and out.is_contiguous() and out.dtype == dtype
        assert torch.equal(out.float(), t.to(dtype).float().t())


def test_traced_by_dynamo_without_graph_breaks():
    """Both operators are opaque to the compiler, with fake implementations for tracing."""
    y = torch.randint(0, 40, (16,))

    def fn(h, w):
        return heads.linear_cross_entropy(h, w, y) + crossentropy.transpose(w).sum()

    h = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(40, 8, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(h, w)
    torch._dynamo.reset()
    out.backward()
    ref_h, ref_w = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    fn(h, w).backward()
    torch.testing.assert_close(ref_h, h.grad)
    torch.testing.assert_close(ref_w, w.grad)
