import pytest

from perflab.internals import overhead as O


def test_python_and_operator_rates_are_positive_and_ordered():
    adds = O.python_adds_per_second(100_000)
    ops = O.op_rate("cpu", ops=500)
    assert adds > 0 and ops > 0
    # an operator call does far more work than an integer add: the ordering is the lesson
    assert adds > ops


def test_rates_reject_bad_arguments():
    with pytest.raises(ValueError, match="n must"):
        O.python_adds_per_second(0)
    with pytest.raises(ValueError, match="numel"):
        O.op_rate("cpu", numel=0)
    with pytest.raises(ValueError, match="batches"):
        O.batch_scaling(lambda b: (lambda: None), [], "cpu")


def test_cuda_graph_rate_needs_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        O.cuda_graph_op_rate()


def test_batch_scaling_returns_one_time_per_batch():
    import torch

    out = O.batch_scaling(lambda b: (lambda: torch.ones(b) * 2), [1, 4], "cpu")
    assert [b for b, _ in out] == [1, 4] and all(t > 0 for _, t in out)


def test_call_model_combines_issue_device_and_work():
    m = O.CallModel(host_issue_s=10e-6, device_fixed_s=1e-6, bandwidth=1e12,
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
    m = O.CallModel(host_issue_s=2e-6, device_fixed_s=0.0, bandwidth=1e10,
                    overlapped=False)
    assert m.stream_s(2e4) == pytest.approx(4e-6)
    assert m.crossover_bytes() == pytest.approx(2e4)
    with pytest.raises(ValueError, match="peak_flops"):
        m.work_s(8, 1.0)


def test_call_model_rejects_bad_values():
    with pytest.raises(ValueError, match="host_issue_s"):
        O.CallModel(host_issue_s=0.0, device_fixed_s=0.0, bandwidth=1.0)
    with pytest.raises(ValueError, match="device_fixed_s"):
        O.CallModel(host_issue_s=1.0, device_fixed_s=-1.0, bandwidth=1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        O.CallModel(host_issue_s=1.0, device_fixed_s=0.0, bandwidth=0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        O.call_model("cpu", 0.0)


def test_call_model_measures_the_host_issue_on_a_cpu():
    m = O.call_model("cpu", 1e10)
    assert m.host_issue_s > 0 and m.device_fixed_s == 0 and not m.overlapped


def _fake_sysfs(root, size, shared):
    d = root / "index3"
    d.mkdir(parents=True)
    (d / "level").write_text("3\n")
    (d / "type").write_text("Unified\n")
    (d / "size").write_text(size + "\n")
    (d / "shared_cpu_list").write_text(shared + "\n")
    return str(root)


def test_beyond_cache_numel_reads_the_last_level_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(O.os, "cpu_count", lambda: 4)
    sysfs = _fake_sysfs(tmp_path, "32768K", "0-1")  # 2 instances of 32 MiB
    # 4 x 64 MiB = 256 MiB of float32 = 2**26 elements
    assert O.beyond_cache_numel(sysfs=sysfs) == 2**26
    assert O.beyond_cache_numel(sysfs=sysfs, maximum=2**25) == 2**25
    assert O.beyond_cache_numel(sysfs=str(tmp_path / "none")) == 2**24
    with pytest.raises(ValueError, match="factor"):
        O.beyond_cache_numel(0.5)
    with pytest.raises(ValueError, match="maximum"):
        O.beyond_cache_numel(maximum=1)


def test_issue_time_is_the_median_burst_per_call_and_counts_every_call():
    calls = []
    # every call sleeps 2 ms: on a CPU the whole call is the issue time
    t = O.issue_time(lambda: (calls.append(1), __import__("time").sleep(0.002)),
                          "cpu", calls=4, bursts=3)
    assert len(calls) == 12
    assert 0.0019 < t < 0.05


@pytest.mark.parametrize("kw", [{"calls": 0}, {"bursts": 0}, {"calls": 2.0}, {"bursts": True}])
def test_issue_time_rejects_bad_counts(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        O.issue_time(lambda: None, "cpu", **kw)
