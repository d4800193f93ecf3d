"""perflab.speed on CPU: the workload, "the same result", what a step is measured with, and the
page's exported prefetcher and BN folding."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perflab.speed.measure import (capture_logs, graph_replay_semantics, kernel_names, op_count,
                                   wall_time)
from perflab.speed.tolerance import final_loss, loss_tolerance, same_losses
from perflab.speed.workload import SmallCNN, fused_on_gpu, normalize, synthetic_images


def test_synthetic_images_shapes_dtypes_and_determinism():
    x, y = synthetic_images(20, size=8, seed=1)
    assert x.shape == (20, 3, 8, 8) and x.dtype == torch.uint8
    assert y.shape == (20,) and y.dtype == torch.int64 and int(y.max()) < 10
    x2, y2 = synthetic_images(20, size=8, seed=1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    with pytest.raises(ValueError, match="size"):
        synthetic_images(4, size=2)


def test_normalize_matches_the_formula_and_rejects_bad_shapes():
    x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    assert torch.allclose(normalize(x), torch.full((1, 3, 2, 2), 2.0))
    with pytest.raises(ValueError, match="images"):
        normalize(torch.zeros(3, 2, 2, dtype=torch.uint8))


def test_capture_logs_returns_dynamo_graph_breaks_as_text(capsys):
    def f(x):
        y = x + 1
        print("side effect")   # a graph break
        return y * 2

    compiled = torch.compile(f, backend="eager")
    out, text = capture_logs(lambda: compiled(torch.ones(3)), graph_breaks=True)
    assert torch.equal(out, torch.full((3,), 4.0))
    assert "Graph break" in text or "graph break" in text.lower()
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError):
        capture_logs(3)


def test_gpu_only_helpers_raise_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"):
        graph_replay_semantics()
    with pytest.raises(RuntimeError, match="CUDA"):
        kernel_names(lambda: None)
    with pytest.raises(ValueError, match="calls"):
        kernel_names(lambda: None, calls=0)


def test_wall_time_counts_calls_and_checks_arguments(monkeypatch):
    from perflab.core import timing

    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    costs = iter([5.0, 5.0, 0.3, 0.1, 0.2] * 2)           # two warm-up calls, then three timed

    def call():
        clock["t"] += next(costs)

    assert wall_time(call, "cpu", reps=3, warmup=2, stat="min") == pytest.approx(0.1)
    assert wall_time(call, "cpu", reps=3, warmup=2, stat="median") == pytest.approx(0.2)
    with pytest.raises(ValueError, match="stat"):
        wall_time(lambda: None, "cpu", stat="mean")
    with pytest.raises(ValueError, match="reps"):
        wall_time(lambda: None, "cpu", reps=0)


def test_op_count_sees_forward_backward_and_optimizer():
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def forward():
        model(x)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
    step()
    assert 0 < op_count(forward) < op_count(step)
    with pytest.raises(TypeError):
        op_count(3)


def _train(seed, steps=40, one_batch=False):
    """A small CPU ladder-like run: SmallCNN, AdamW, fixed batches in order."""
    images, labels = synthetic_images(512, size=8, seed=0)
    torch.manual_seed(seed)
    model = SmallCNN(4)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, foreach=False)
    losses = []
    for i in range(steps):
        lo = 0 if one_batch else i * 32 % 512
        loss = torch.nn.functional.cross_entropy(
            model(normalize(images[lo:lo + 32])), labels[lo:lo + 32])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_the_seed_spread_tolerance_rejects_training_on_one_batch():
    """The ladder's same-result check can fail: a loop that sees one batch over and over ends far
    outside k standard deviations of the seeds' spread, a fused optimizer (rounding only) inside."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tol = loss_tolerance([final_loss(_train(s)) for s in range(1, 6)])
        ref = final_loss(_train(0))
        one = final_loss(_train(0, one_batch=True))
    finally:
        torch.set_num_threads(threads)
    assert abs(one - ref) > tol
    assert tol < 0.2 * ref
    with pytest.raises(ValueError, match="two"):
        loss_tolerance([1.0])
    assert loss_tolerance([1.0, 1.0]) == pytest.approx(1e-4)   # the floor


def test_final_loss_and_same_losses():
    assert final_loss([5, 4, 3, 2, 1, 1, 1, 1, 1, 3]) == 2.0    # the last fifth
    assert final_loss([2.0]) == 2.0
    with pytest.raises(ValueError):
        final_loss([])
    ref = [2.0, 1.5, 1.2]
    assert same_losses(ref, [2.0 * (1 + 1e-6), 1.5, 1.2])
    assert not same_losses(ref, [2.0, 1.4, 1.2])          # another step, another loss
    assert not same_losses(ref, ref[:2])                   # fewer steps
    with pytest.raises(ValueError, match="rtol"):
        same_losses(ref, ref, rtol=0)


def test_the_pages_prefetcher_is_a_plain_iterator_on_cpu():
    from perflab.speed.overlap import Prefetcher

    batches = [(torch.ones(2), torch.zeros(2)), (torch.full((2,), 2.0), torch.ones(2))]
    out = list(Prefetcher(batches, "cpu"))
    assert len(out) == 2 and all(torch.equal(a, b) for (a, _), (b, _) in zip(out, batches))


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_the_pages_bn_folding_matches_layer_then_bn_in_eval(kind):
    from perflab.speed.fusion import fold_batchnorm

    torch.manual_seed(0)
    if kind == "conv":
        layer, bn, x = nn.Conv2d(3, 5, 3, bias=False), nn.BatchNorm2d(5), torch.randn(2, 3, 8, 8)
    else:
        layer, bn, x = nn.Linear(4, 5), nn.BatchNorm1d(5), torch.randn(6, 4)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 2)
    bn.bias.data.uniform_(-1, 1)
    bn.eval()
    assert torch.allclose(fold_batchnorm(layer, bn)(x), bn(layer(x)), atol=1e-5)


class _FakeCuda:
    """Stand-ins for torch.cuda's streams and graphs on a CPU: capture runs the step's Python
    once (as a real capture does, recording instead of computing), replay does nothing."""

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        replays = 0

        def replay(self):
            type(self).replays += 1

    def __init__(self):
        self.modes = []

    def graph(self, g, capture_error_mode="global"):
        self.modes.append(capture_error_mode)
        return contextlib.nullcontext()


def test_graphed_step_warms_up_eagerly_then_captures_the_given_loss(monkeypatch):
    from perflab.speed.graphs import GraphedStep

    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "Stream", fake.Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: fake.Stream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", fake.CUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake.graph)
    # a real capture records kernels without running them, so uninitialized static inputs are
    # harmless there; this stand-in runs the step, so they start at zero
    monkeypatch.setattr(torch, "empty_like", torch.zeros_like)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def loss(x, y):
        seen.append(x.shape[0])
        return torch.nn.functional.mse_loss(model(x), y)

    batches = [(torch.randn(2, 4), torch.randn(2, 3)) for _ in range(2)]
    gs = GraphedStep(model, opt, batches, loss=loss, capture_error_mode="thread_local")
    assert seen == [2, 2, 2]                          # two warm-up steps, then the capture
    assert len(gs.warmup_losses) == 2 and fake.modes == ["thread_local"]
    x, y = torch.ones(2, 4), torch.zeros(2, 3)
    assert gs.step(x, y) is gs.static_loss and torch.equal(gs.static_x, x)
    assert fake.CUDAGraph.replays == 1
    plain = GraphedStep(model, opt, [(torch.randn(2, 4), torch.tensor([0, 2]))])  # cross-entropy
    assert fake.modes[-1] == "global" and plain.static_loss.dim() == 0


def test_same_losses_tells_reordered_sums_from_another_training():
    """Chapter 6's ladder compares every rung's losses step by step (0.1 %): a fused optimizer
    (the same update, summed in another order) passes; a dropped batch, one batch over and
    over, or another learning rate fail within the first steps."""
    images, labels = synthetic_images(256, size=16)
    x = normalize(images)

    def train(order, fused=False, lr=2e-3, steps=12):
        torch.manual_seed(0)
        model = SmallCNN(4)
        opt = torch.optim.AdamW(model.parameters(), lr=lr,
                                **(dict(fused=True) if fused else dict(foreach=False)))
        losses = []
        for i in order[:steps]:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[16 * i:16 * i + 16]), labels[16 * i:16 * i + 16])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    batches = list(range(16))
    ref = train(batches)
    assert same_losses(ref, train(batches, fused=True))
    assert not same_losses(ref, train(batches[:3] + batches[4:]))     # a batch dropped
    assert not same_losses(ref, train([0] * 16))                         # one batch
    assert not same_losses(ref, train(batches, lr=3e-3))                 # another rate


def test_op_kinds_splits_multi_tensor_from_cpu_operators_and_sums_to_op_count():
    from perflab.speed.measure import op_kinds
    xs = [torch.ones(3) for _ in range(4)]
    s = torch.zeros(())

    def f():
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_add_(xs, 1.0)
        s.add_(1)
        s.item()
    kinds = op_kinds(f)
    assert kinds == {"foreach": 2, "device": 0, "cpu": 2}
    assert sum(kinds.values()) == op_count(f)
    with pytest.raises(TypeError, match="callable"):
        op_kinds(3)


def test_op_kinds_counts_a_tensor_off_the_cpu_as_device(monkeypatch):
    from perflab.speed import measure
    meta = torch.empty(2, device="meta")
    assert measure._kind(torch.ops.aten.add.Tensor, (meta, meta), {}) == "device"
    assert measure._kind(torch.ops.aten.add.Tensor, (torch.ones(1), 2), {}) == "cpu"
    assert measure._kind(torch.ops.aten._foreach_add_.Scalar, ([meta], 1), {}) \
        == "foreach"


def test_fused_on_gpu_fuses_only_on_a_gpu():
    """One choice of Adam's implementation by device: fused on CUDA, torch's default (None,
    the for-loop step on a CPU) elsewhere; on a CPU it steps as fused=False did."""
    assert fused_on_gpu("cuda") is True and fused_on_gpu(torch.device("cuda", 1)) is True
    assert fused_on_gpu("cpu") is None
    out = []
    for fused in (False, fused_on_gpu("cpu")):
        torch.manual_seed(0)
        m = SmallCNN(4)
        opt = torch.optim.AdamW(m.parameters(), lr=2e-3, fused=fused)
        m(torch.randn(2, 3, 16, 16)).sum().backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.equal(out[0], out[1])
