import pytest
import torch

from perflab.core import device
from perflab.machine import datasheets


def test_pick_and_device_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr(device, "has_gpu", lambda: False)
    monkeypatch.delenv("PERFLAB_FORCE_CPU_SIZES", raising=False)
    assert device.pick(cpu=1, gpu=2) == 1
    assert device.device() == torch.device("cpu")
    with pytest.raises(ValueError, match="index"):
        device.device(-1)


def test_pick_prefers_gpu_sizes_when_a_gpu_is_present(monkeypatch):
    monkeypatch.setattr(device, "has_gpu", lambda: True)
    monkeypatch.delenv("PERFLAB_FORCE_CPU_SIZES", raising=False)
    assert device.pick(cpu=1, gpu=2) == 2
    monkeypatch.setenv("PERFLAB_FORCE_CPU_SIZES", "1")
    assert device.pick(cpu=1, gpu=2) == 1


def test_requires_gpu_prints_one_sentence_without_gpus(monkeypatch, capsys):
    monkeypatch.setattr(device, "gpu_count", lambda: 0)
    assert device.requires_gpu(2, what="The all-reduce") is False
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and out.startswith("The all-reduce needs 2 CUDA GPUs")
    with pytest.raises(ValueError, match="count"):
        device.requires_gpu(0)


def test_fp32_peak_formula(monkeypatch):
    class Props:
        major, minor, multi_processor_count = 9, 0, 132

    monkeypatch.setattr(datasheets, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    # 132 SMs x 128 lanes x 1.98 GHz = 33.45 TFLOP/s of multiplies; FMA counts double
    assert datasheets.fp32_peak_flops(clock_hz=1.98e9) == pytest.approx(33.45e12, rel=1e-3)
    assert datasheets.fp32_peak_flops(fma=True, clock_hz=1.98e9) == pytest.approx(66.9e12, rel=1e-3)
    Props.major = 1
    with pytest.raises(RuntimeError, match="compute capability"):
        datasheets.fp32_peak_flops(clock_hz=1e9)


def test_fp32_peak_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(device, "has_gpu", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        datasheets.fp32_peak_flops()


def test_describe_and_datasheets():
    info = device.describe()
    assert info["kind"] in ("cpu", "cuda") and info["torch"] == torch.__version__
    h200 = datasheets.datasheet("NVIDIA H200")
    assert h200["bf16_flops"] > h200["fp32_flops"] and "source" in h200
    assert datasheets.datasheet("no such GPU") is None


def test_the_clock_model_reproduces_the_datasheets():
    """FLOP per clock per SM x SMs x clock: the H100/H200 SXM's dense bf16 989.5 TFLOP/s is
    132 x 4,096 x 1.83 GHz, below the 1.98 GHz maximum; FP32's 67 TFLOP/s is at 1.98 GHz."""
    assert datasheets.peak_at("bf16", 132, (9, 0), 1.83e9) == pytest.approx(989.5e12, rel=1e-3)
    assert datasheets.peak_at("bf16", 132, (9, 0), 1.98e9) == pytest.approx(1070.6e12, rel=1e-3)
    assert datasheets.peak_at("fp32", 132, (9, 0), 1.98e9, fma=False) == pytest.approx(33.45e12, rel=1e-3)
    assert datasheets.peak_at("fp8", 108, (8, 0), 1.41e9) is None          # no FP8 on an A100
    assert datasheets.peak_at("fp32", 10, (8, 6), 1e9) == 2560e9            # from the lanes table
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        assert datasheets.datasheet_clock_hz(name, "bf16") == pytest.approx(1.83e9, rel=2e-3)
        assert datasheets.datasheet_clock_hz(name, "fp32") == pytest.approx(1.98e9, rel=2e-3)
    assert datasheets.datasheet_clock_hz("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(1.41e9, rel=2e-3)
    assert datasheets.datasheet_clock_hz("Tesla V100-SXM2-32GB", "fp16") == pytest.approx(1.53e9, rel=5e-3)
    assert datasheets.datasheet_clock_hz("Tesla V100-SXM2-32GB", "bf16") is None
    with pytest.raises(ValueError, match="precision"):
        datasheets.peak_at("fp4", 132, (9, 0), 1e9)
    with pytest.raises(ValueError, match="clock_hz"):
        datasheets.peak_at("bf16", 132, (9, 0), 0)


def test_peak_flops_takes_this_gpu_and_a_clock(monkeypatch):
    class Props:
        major, minor, multi_processor_count = 9, 0, 132

    monkeypatch.setattr(datasheets, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(datasheets.nvml, "max_sm_clock_hz", lambda i=0: 1.98e9)
    # the example: 691.8 TFLOP/s at 1,590 MHz is 80 % of the peak at that clock
    assert 691.8e12 / datasheets.peak_flops("bf16", 1.59e9) == pytest.approx(0.805, abs=0.002)
    assert datasheets.peak_flops("bf16") == pytest.approx(1070.6e12, rel=1e-3)
    monkeypatch.setattr(datasheets, "has_gpu", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        datasheets.peak_flops("bf16")


def test_memory_peak_is_two_transfers_per_clock_over_the_bus(monkeypatch):
    monkeypatch.setattr(datasheets.nvml, "readings", lambda index=0, links=False: {
        "mem_clock_max_hz": 3201e6, "memory_bus_width_bits": 6144})
    assert datasheets.memory_peak_bandwidth() == pytest.approx(4.917e12, rel=1e-3)
    monkeypatch.setattr(datasheets.nvml, "readings", lambda index=0, links=False: None)
    assert datasheets.memory_peak_bandwidth() is None


def test_requires_gpu_gates_on_compute_capability(monkeypatch, capsys):
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device.torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    monkeypatch.setattr(device.torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100")
    assert device.requires_gpu(what="FP8", capability=(8, 9), feature="FP8 tensor cores") is False
    out = capsys.readouterr().out
    assert "FP8 tensor cores" in out and "8.9" in out and "8.0" in out and out.count(".\n") == 1
    monkeypatch.setattr(device.torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    assert device.requires_gpu(what="FP8", capability=(8, 9)) is True
    with pytest.raises(ValueError, match="capability"):
        device.requires_gpu(capability=(9,))
