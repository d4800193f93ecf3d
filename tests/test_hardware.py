import pytest
import torch

from perflab.core import device as H
from perflab.machine import datasheets


def test_pick_and_device_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr(H, "has_gpu", lambda: False)
    monkeypatch.delenv("PERFLAB_FORCE_CPU_SIZES", raising=False)
    assert H.pick(cpu=1, gpu=2) == 1
    assert H.device() == torch.device("cpu")
    with pytest.raises(ValueError, match="index"):
        H.device(-1)


def test_pick_prefers_gpu_sizes_when_a_gpu_is_present(monkeypatch):
    monkeypatch.setattr(H, "has_gpu", lambda: True)
    monkeypatch.delenv("PERFLAB_FORCE_CPU_SIZES", raising=False)
    assert H.pick(cpu=1, gpu=2) == 2
    monkeypatch.setenv("PERFLAB_FORCE_CPU_SIZES", "1")
    assert H.pick(cpu=1, gpu=2) == 1


def test_requires_gpu_prints_one_sentence_without_gpus(monkeypatch, capsys):
    monkeypatch.setattr(H, "gpu_count", lambda: 0)
    assert H.requires_gpu(2, what="The all-reduce") is False
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and out.startswith("The all-reduce needs 2 CUDA GPUs")
    with pytest.raises(ValueError, match="count"):
        H.requires_gpu(0)


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
    monkeypatch.setattr(H, "has_gpu", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        datasheets.fp32_peak_flops()


def test_describe_and_datasheets():
    info = H.describe()
    assert info["kind"] in ("cpu", "cuda") and info["torch"] == torch.__version__
    h200 = datasheets.datasheet("NVIDIA H200")
    assert h200["bf16_flops"] > h200["fp32_flops"] and "source" in h200
    assert datasheets.datasheet("no such GPU") is None


def test_requires_gpu_gates_on_compute_capability(monkeypatch, capsys):
    monkeypatch.setattr(H, "gpu_count", lambda: 1)
    monkeypatch.setattr(H.torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    monkeypatch.setattr(H.torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100")
    assert H.requires_gpu(what="FP8", capability=(8, 9), feature="FP8 tensor cores") is False
    out = capsys.readouterr().out
    assert "FP8 tensor cores" in out and "8.9" in out and "8.0" in out and out.count(".\n") == 1
    monkeypatch.setattr(H.torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    assert H.requires_gpu(what="FP8", capability=(8, 9)) is True
    with pytest.raises(ValueError, match="capability"):
        H.requires_gpu(capability=(9,))
