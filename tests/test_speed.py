"""perflab.speed.techniques on CPU: data, prefetcher, ladder, overlap arithmetic, BN folding, log capture."""

import pytest
import torch
from torch import nn

from perflab.speed import techniques as speed


def test_synthetic_images_shapes_dtypes_and_determinism():
    x, y = speed.synthetic_images(20, size=8, seed=1)
    assert x.shape == (20, 3, 8, 8) and x.dtype == torch.uint8
    assert y.shape == (20,) and y.dtype == torch.int64 and int(y.max()) < 10
    x2, y2 = speed.synthetic_images(20, size=8, seed=1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    with pytest.raises(ValueError, match="size"):
        speed.synthetic_images(4, size=2)


def test_normalize_matches_the_formula_and_rejects_bad_shapes():
    x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    assert torch.allclose(speed.normalize(x), torch.full((1, 3, 2, 2), 2.0))
    with pytest.raises(ValueError, match="images"):
        speed.normalize(torch.zeros(3, 2, 2, dtype=torch.uint8))


def test_prefetcher_is_a_plain_iterator_on_cpu():
    batches = [(torch.arange(3) + i, torch.tensor([i])) for i in range(4)]
    out = list(speed.Prefetcher(batches, "cpu"))
    assert len(out) == 4
    for (a, b), (c, d) in zip(batches, out):
        assert torch.equal(a, c) and torch.equal(b, d)
    with pytest.raises(TypeError):
        speed.Prefetcher(3, "cpu")


def test_host_batches_cycle_and_check_the_batch_size():
    x, y = speed.synthetic_images(8, size=4)
    got = list(speed.host_batches(x, y, 4, steps=3, float_on_cpu=False))
    assert len(got) == 3 and torch.equal(got[2][0], x[:4])
    floats = next(speed.host_batches(x, y, 4, steps=1, float_on_cpu=True))[0]
    assert floats.dtype == torch.float32
    with pytest.raises(ValueError, match="batch_size"):
        next(speed.host_batches(x, y, 3, steps=1, float_on_cpu=False))


def test_ladder_configs_are_cumulative_and_reject_unknown_fields():
    cfgs = [c for _, c in speed.ladder_configs()]
    assert cfgs[0] == speed.StepConfig()
    last = cfgs[-1]
    assert (not last.sync_every_step and last.uint8_transfer and last.pinned and last.prefetch
            and last.optimizer == "fused" and last.cuda_graph)
    with pytest.raises(ValueError, match="unknown"):
        speed.ladder_configs([speed.Rung("x", {"nope": 1}, "")])


def test_every_rung_runs_on_cpu_and_keeps_the_baseline_loss():
    x, y = speed.synthetic_images(64, size=8)
    results = speed.run_ladder(x, y, steps=4, batch_size=16, device="cpu", width=4, warmup=1)
    assert [r.name for r in results] == [r.name for r in speed.LADDER]
    base = results[0]
    assert len(base.losses) == 5 and len(base.log) == 5   # the naive rung logs every step
    for r in results:
        assert r.samples_per_s > 0 and not r.graphed      # no CUDA graph on a CPU
        assert speed.loss_within(r.final_loss, base.final_loss, rtol=0.05, atol=0.02), r.name
    table = speed.ladder_table(results)
    assert "CUDA graph" in table and "NO" not in table


def test_loss_within_tolerances():
    assert speed.loss_within(1.04, 1.0, rtol=0.05, atol=0.0)
    assert not speed.loss_within(1.2, 1.0, rtol=0.05, atol=0.02)
    with pytest.raises(ValueError):
        speed.loss_within(float("nan"), 1.0)


def test_make_optimizer_kinds():
    p = [nn.Parameter(torch.ones(2))]
    assert speed.make_optimizer(p, "fused").defaults["fused"]
    assert speed.make_optimizer(p, "forloop").defaults["foreach"] is False
    with pytest.raises(ValueError, match="kind"):
        speed.make_optimizer(p, "turbo")


def test_overlap_fraction_merges_kernels_and_checks_intervals():
    assert speed.overlap_fraction([(0, 10)], [(0, 5), (2, 5)]) == pytest.approx(0.5)
    assert speed.overlap_fraction([(0, 10), (20, 30)], [(5, 25)]) == pytest.approx(0.5)
    assert speed.overlap_fraction([(0, 10)], []) == 0.0
    with pytest.raises(ValueError):
        speed.overlap_fraction([], [(0, 1)])
    with pytest.raises(ValueError, match="ends before"):
        speed.overlap_fraction([(5, 1)], [])


def test_trace_intervals_reads_a_chrome_trace():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)",
         "ts": 0, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
         "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3}]}
    copies, kernels = speed.trace_intervals(trace)
    assert copies == [(0.0, 10.0)] and kernels == [(5.0, 15.0)]
    with pytest.raises(ValueError):
        speed.trace_intervals({})


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_fold_batchnorm_matches_layer_then_bn_in_eval(kind):
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
    fused = speed.fold_batchnorm(layer, bn)
    assert torch.allclose(fused(x), bn(layer(x)), atol=1e-5)
    with pytest.raises(ValueError, match="channels"):
        speed.fold_batchnorm(layer, nn.BatchNorm2d(7) if kind == "conv" else nn.BatchNorm1d(7))
    with pytest.raises(TypeError):
        speed.fold_batchnorm(nn.ReLU(), bn)


def test_capture_logs_returns_dynamo_graph_breaks_as_text(capsys):
    def f(x):
        y = x + 1
        print("side effect")   # a graph break
        return y * 2

    compiled = torch.compile(f, backend="eager")
    out, text = speed.capture_logs(lambda: compiled(torch.ones(3)), graph_breaks=True)
    assert torch.equal(out, torch.full((3,), 4.0))
    assert "Graph break" in text or "graph break" in text.lower()
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError):
        speed.capture_logs(3)


def test_gpu_only_helpers_raise_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"):
        speed.graph_replay_semantics()
    with pytest.raises(RuntimeError, match="CUDA"):
        speed.GraphedStep(nn.Linear(2, 2), None, [(torch.ones(1), torch.ones(1))])


def test_wall_time_counts_calls_and_checks_arguments():
    calls = []
    t = speed.wall_time(lambda: calls.append(1), "cpu", reps=3, warmup=2, stat="min")
    assert t >= 0 and len(calls) == 5
    with pytest.raises(ValueError, match="stat"):
        speed.wall_time(lambda: None, "cpu", stat="mean")
    with pytest.raises(ValueError, match="reps"):
        speed.wall_time(lambda: None, "cpu", reps=0)
