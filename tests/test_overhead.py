import pytest

from perflab.internals import overhead


def test_python_and_operator_rates_divide_the_work_by_the_best_time(monkeypatch):
    """best_of is faked (chapter 1's run shows the real rates and their ordering): the rates
    must be the work done over the best block time, and the block must do that work."""
    seen = []

    def fake_best_of(fn, repeats=3, calls=1, device=None):
        seen.append((fn(), repeats, device))
        return 0.5

    monkeypatch.setattr(overhead, "best_of", fake_best_of)
    assert overhead.python_adds_per_second(1000) == 2000.0
    assert seen[-1] == (1000, 3, None)             # the loop really added 1000 times
    assert overhead.op_rate("cpu", ops=500) == 1000.0
    assert seen[-1][1:] == (3, overhead.torch.device("cpu"))


def test_rates_reject_bad_arguments():
    with pytest.raises(ValueError, match="n must"):
        overhead.python_adds_per_second(0)
    with pytest.raises(ValueError, match="numel"):
        overhead.op_rate("cpu", numel=0)
    with pytest.raises(ValueError, match="batches"):
        overhead.batch_scaling(lambda b: (lambda: None), [], "cpu")


def test_cuda_graph_rate_needs_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        overhead.cuda_graph_op_rate()


def test_batch_scaling_returns_one_time_per_batch():
    import torch

    out = overhead.batch_scaling(lambda b: (lambda: torch.ones(b) * 2), [1, 4], "cpu")
    assert [b for b, _ in out] == [1, 4] and all(t > 0 for _, t in out)


def test_call_model_combines_issue_device_and_work():
    m = overhead.CallModel(host_issue_s=10e-6, device_fixed_s=1e-6, bandwidth=1e12,
                           peak_flops=1e13)
    assert m.t0 == pytest.approx(11e-6)
    # bandwidth-bound: 1 MB at 1 TB/s = 1 us; compute-bound: 1e8 FLOP at 1e13 = 10 us
    assert m.work_s(1e6) == pytest.approx(1e-6)
    assert m.work_s(1e6, 1e8) == pytest.approx(10e-6)
    assert m.isolated_s(1e6) == pytest.approx(12e-6)
    # in a stream the host issue hides the small kernel, and a large kernel hides the issue
    assert m.stream_s(1e6) == pytest.approx(10e-6)
    assert m.stream_s(1e8) == pytest.approx(101e-6)
    assert m.crossover_bytes() == pytest.approx(9e6)
    assert m.stream_s(m.crossover_bytes()) == pytest.approx(m.host_issue_s)


def test_call_model_on_a_cpu_adds_the_host_and_the_work():
    m = overhead.CallModel(host_issue_s=2e-6, device_fixed_s=0.0, bandwidth=1e10,
                           overlapped=False)
    assert m.stream_s(2e4) == pytest.approx(4e-6)
    assert m.crossover_bytes() == pytest.approx(2e4)
    with pytest.raises(ValueError, match="peak_flops"):
        m.work_s(8, 1.0)


def test_call_model_rejects_bad_values():
    with pytest.raises(ValueError, match="host_issue_s"):
        overhead.CallModel(host_issue_s=0.0, device_fixed_s=0.0, bandwidth=1.0)
    with pytest.raises(ValueError, match="device_fixed_s"):
        overhead.CallModel(host_issue_s=1.0, device_fixed_s=-1.0, bandwidth=1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        overhead.CallModel(host_issue_s=1.0, device_fixed_s=0.0, bandwidth=0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        overhead.call_model("cpu", 0.0)


def test_call_model_measures_the_host_issue_on_a_cpu():
    m = overhead.call_model("cpu", 1e10)
    assert m.host_issue_s > 0 and m.device_fixed_s == 0 and not m.overlapped


def test_issue_time_is_the_median_burst_per_call_and_counts_every_call(monkeypatch):
    from perflab.core import timing

    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    costs = iter([0.001] * 4 + [0.009] * 4 + [0.002] * 4)     # three bursts of four calls

    def call():
        clock["t"] += next(costs)

    assert overhead.issue_time(call, "cpu", calls=4, bursts=3) == pytest.approx(0.002)   # the median burst
    with pytest.raises(StopIteration):
        call()                                                  # all twelve calls were made


def test_issue_time_with_warm_calls_leaves_the_first_calls_of_each_burst_untimed(monkeypatch):
    from perflab.core import timing

    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    costs = iter(([0.009] + [0.001] * 3) * 2)   # two bursts: a slow first call, then three

    def call():
        clock["t"] += next(costs)

    assert overhead.issue_time(call, "cpu", calls=3, bursts=2, warm=1) == pytest.approx(0.001)
    with pytest.raises(StopIteration):
        call()                                  # 2 x (1 warm + 3 timed) calls were made


@pytest.mark.parametrize("kw", [{"calls": 0}, {"bursts": 0}, {"calls": 2.0}, {"bursts": True},
                                {"warm": -1}, {"warm": 1.0}])
def test_issue_time_rejects_bad_counts(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        overhead.issue_time(lambda: None, "cpu", **kw)


class _SlowDevice:
    """A fake GPU and host clock: each launch costs the host `host_s`; the device runs each
    kernel in `device_s`, in order, starting when it was issued or when the previous one ended;
    synchronize waits until the device has run everything issued."""

    def __init__(self, host_s, device_s):
        self.t, self.done, self.host_s, self.device_s = 0.0, 0.0, host_s, device_s
        self.launches = 0

    def sleep(self, cycles):
        self.t += self.host_s
        self.done = max(self.done, self.t) + self.device_s
        self.launches += 1

    def synchronize(self, device=None):
        self.t = max(self.t, self.done)


def _fake_gpu(monkeypatch, fake):
    import contextlib

    from perflab.core import timing
    monkeypatch.setattr(timing.time, "perf_counter", lambda: fake.t)
    monkeypatch.setattr(overhead, "synchronize", fake.synchronize)
    monkeypatch.setattr(overhead.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(overhead.torch.cuda, "_sleep", fake.sleep, raising=False)
    monkeypatch.setattr(overhead.torch.cuda, "device", lambda d: contextlib.nullcontext())


def test_launch_rate_times_the_host_even_when_the_device_is_slower(monkeypatch):
    """The empty kernels run 5x slower on the fake device than the host issues them: the rate
    must still be the host's (one over 2 us), not the device's (one over 10 us), which a block
    of launches synchronized at its end would report."""
    fake = _SlowDevice(host_s=2e-6, device_s=10e-6)
    _fake_gpu(monkeypatch, fake)
    rate = overhead.launch_rate("cuda", calls=50, bursts=7)
    assert rate == pytest.approx(1 / 2e-6, rel=1e-6)
    assert fake.launches == 100 + 50 * 7       # the warm-up, then every burst's launches


def test_launch_rate_needs_a_gpu_and_positive_counts(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA GPU"):
            overhead.launch_rate("cpu")
    _fake_gpu(monkeypatch, _SlowDevice(1e-6, 1e-6))
    for kw in ({"calls": 0}, {"bursts": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            overhead.launch_rate("cuda", **kw)


def _gpu_model():
    return overhead.CallModel(host_issue_s=8e-6, device_fixed_s=1e-6, bandwidth=4.2e12)
