"""Chapter 2's interconnect (perflab.machine.interconnect) and the one torchrun launcher
(perflab.core.torchrun): bandwidth formulas, the alpha-beta fit, topology, a rank's device, and
real gloo launches on 2 CPU processes."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from perflab.core import torchrun
from perflab.core.device import gpu_count
from perflab.machine import interconnect as D

TOPO = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tPXB\t0-31\t0\t\tN/A
GPU1\tNV18\t X \tPXB\t0-31\t0\t\tN/A
NIC0\tPXB\tPXB\t X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_bus_bandwidth_follows_nccl_tests():
    assert D.algorithm_bandwidth(1e9, 0.01) == 1e11
    assert D.bus_bandwidth(1e9, 0.01, 2) == 1e11                 # 2 (n-1)/n = 1 for n = 2
    assert D.bus_bandwidth(1e9, 0.01, 8) == pytest.approx(1e11 * 14 / 8)
    with pytest.raises(ValueError, match="world_size"):
        D.bus_bandwidth(1e9, 0.01, 1)
    with pytest.raises(ValueError, match="seconds"):
        D.algorithm_bandwidth(1e9, 0)


def test_allreduce_time_inverts_bus_bandwidth():
    t = D.allreduce_time(4e8, 2e11, 8, latency_s=1e-5)
    assert D.bus_bandwidth(4e8, t - 1e-5, 8) == pytest.approx(2e11)
    with pytest.raises(ValueError, match="busbw"):
        D.allreduce_time(1, 0, 2)


def test_gpu_link_reads_the_topology_matrix():
    assert D.gpu_link(TOPO, 0, 1) == "NV18"
    assert D.gpu_link(TOPO, 1, 0) == "NV18"
    assert D.gpu_link(TOPO, 0, 5) is None
    assert D.gpu_link("no matrix here", 0, 1) is None


def test_child_environment_keeps_nvlink_multicast_off_and_finds_perflab(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = torchrun._child_env({"EXTRA": 3})
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["EXTRA"] == "3"
    assert os.path.isdir(os.path.join(env["PYTHONPATH"].split(os.pathsep)[0], "perflab"))


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU fallback")
def test_gloo_allreduce_between_two_cpu_processes():
    assert torchrun.default_backend() == "gloo"
    result = D.allreduce_sweep([4096, 2**20], nproc=2)
    assert (result.backend, result.world_size, result.device) == ("gloo", 2, "cpu")
    assert [p.nbytes for p in result.points] == [4096, 2**20]
    for p in result.points:
        assert p.seconds > 0 and p.iters >= 5
        assert p.busbw == pytest.approx(p.algbw)          # n = 2
    assert result.peak_busbw == max(p.busbw for p in result.points)
    assert result.timer == "perf_counter"
    # rank 0 sampled the clock its timed part ran at (here the CPU's) and sent it back
    assert result.telemetry["sentence"].startswith("measured over")
    assert result.telemetry["source"] in ("/proc/cpuinfo", "none")


def test_a_failing_worker_raises_with_its_output():
    with pytest.raises(torchrun.LaunchError, match="invalid literal") as err:
        D.launch(["allreduce", "--sizes", "lots"], nproc=2, backend="gloo", timeout_s=120)
    assert "exited with status" in str(err.value)


def test_a_launch_that_runs_too_long_is_killed():
    with pytest.raises(torchrun.LaunchError, match="timed out"):
        D.launch(["allreduce", "--sizes", "4096"], nproc=2, backend="gloo", timeout_s=0.5)


def test_launch_rejects_bad_arguments_before_starting_anything():
    with pytest.raises(ValueError, match="nproc"):
        D.launch(["allreduce"], nproc=1)
    with pytest.raises(ValueError, match="backend"):
        D.launch(["allreduce"], backend="mpi")
    with pytest.raises(ValueError, match="sizes"):
        D.allreduce_sweep([6])
    if gpu_count() < 2:
        with pytest.raises(ValueError, match="GPUs"):
            D.launch(["allreduce"], backend="nccl")


def test_gpu_link_reads_the_h200_topology_with_its_escape_codes():
    from perflab.machine.interconnect import gpu_link

    # `nvidia-smi topo -m` on the 2x H200 reference machine, escape codes and all
    text = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
            "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    assert gpu_link(text, 0, 1) == "NV18"
    assert gpu_link(text, 1, 0) == "NV18"


def test_alpha_beta_recovers_latency_and_bus_bandwidth_from_a_sweep():
    alpha, busbw, n = 20e-6, 3.6e11, 2
    sizes = [2**k for k in range(12, 31, 2)]
    pts = tuple(D.AllReducePoint(s, D.allreduce_time(s, busbw, n, alpha), 10,
                                 0.0, 0.0) for s in sizes)
    fit = D.alpha_beta(D.AllReduceResult("nccl", n, "cuda", pts, {}, "cuda events"))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.busbw == pytest.approx(busbw, rel=1e-6)
    assert fit.rms_relative < 1e-9 and fit.points == len(sizes)
    assert fit.seconds(2**20, n) == pytest.approx(D.allreduce_time(2**20, busbw, n, alpha))
    assert fit.half_bandwidth_bytes == pytest.approx(alpha * busbw)
    flat = tuple(D.AllReducePoint(s, 1e-3 - 1e-13 * s, 10, 0.0, 0.0) for s in sizes)
    with pytest.raises(ValueError, match="grow"):
        D.alpha_beta(D.AllReduceResult("gloo", 2, "cpu", flat, {}))


def test_the_launcher_checks_its_arguments_before_starting_anything(tmp_path):
    with pytest.raises(ValueError, match="backend must be 'nccl' or 'gloo'"):
        torchrun.backend_for("mpi", 2)
    if gpu_count() < 2:
        with pytest.raises(ValueError, match="needs 2 GPUs"):
            torchrun.backend_for("nccl", 2)
    for kwargs, word in (({"nnodes": 3}, "nnodes"), ({"nproc": 0}, "nproc"),
                         ({"timeout_s": 0}, "timeout_s"), ({"max_restarts": -1}, "max_restarts")):
        with pytest.raises(ValueError, match=word):
            torchrun.run(["-c", "pass"], tmp_path, backend="gloo", **kwargs)
    assert list(tmp_path.iterdir()) == []          # nothing was started


def test_bus_factor_follows_nccl_tests():
    assert D.bus_factor("all_reduce", 2) == 1.0
    assert D.bus_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert D.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert D.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert D.bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError, match="op"):
        D.bus_factor("gather", 2)
    with pytest.raises(ValueError, match="world_size"):
        D.bus_factor("all_reduce", 1)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "broadcast"])
def test_the_fit_of_any_collective_uses_its_bus_factor(op):
    alpha, busbw, n = 50e-6, 2e9, 4
    sizes = [2**k for k in range(12, 25, 2)]
    times = [alpha + s * D.bus_factor(op, n) / busbw for s in sizes]
    fit = D.fit_alpha_beta(sizes, times, n, op)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6) and fit.busbw == pytest.approx(busbw, rel=1e-6)
    if op != "broadcast":   # a fit with another op's factor finds another bandwidth
        assert D.fit_alpha_beta(sizes, times, n, "broadcast").busbw != pytest.approx(busbw, rel=1e-3)


def _fake_gpus(monkeypatch, count):
    """This process sees ``count`` CUDA devices (a CPU machine pretending)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_a_gloo_rank_computes_on_the_cpu_however_many_gpus_the_machine_has(monkeypatch):
    """The trap of the first one-GPU run: with --backend gloo on one H200, rank 1 took
    cuda:1 and died with 'invalid device ordinal'."""
    _fake_gpus(monkeypatch, 1)
    assert torchrun.worker_device("gloo", 0) == torch.device("cpu")
    assert torchrun.worker_device("gloo", 1) == torch.device("cpu")
    assert torchrun.worker_device("nccl", 0) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="local rank 1 on cuda:1, but this process sees 1 GPU"):
        torchrun.worker_device("nccl", 1)
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="sees 0 GPU"):
        torchrun.worker_device("nccl", 0)
    with pytest.raises(ValueError, match="backend"):
        torchrun.worker_device("mpi", 0)
    with pytest.raises(ValueError, match="local_rank"):
        torchrun.worker_device("gloo", -1)


def test_a_gloo_launch_hides_the_gpus_from_its_ranks(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert torchrun._child_env(backend="gloo")["CUDA_VISIBLE_DEVICES"] == ""
    assert torchrun._child_env(backend="nccl")["CUDA_VISIBLE_DEVICES"] == "0"
    # the caller may still decide
    assert torchrun._child_env({"CUDA_VISIBLE_DEVICES": "0"}, backend="gloo")["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_two_gpu_figures_are_the_run_records_own(tmp_path):
    """Chapter 8's inputs for GPUs are the 30 November run's numbers as its run record keeps them,
    not figures typed in."""
    run = D.two_gpu_run()
    record = json.loads((Path(__file__).resolve().parent.parent / "runs" / "2026-12-03-15861cf.json")
                        .read_text())["pages"]["book/08_distributed_training"]
    n = record["numbers"]
    assert run["measured"] == record["run"]["started"] and run["devices"] == record["run"]["devices"]
    assert run["smallest_s"] == pytest.approx(n["allreduce_small_us"] * 1e-6, rel=1e-12)
    assert run["largest_busbw"] == pytest.approx(n["allreduce_busbw_GBps"] * 1e9, rel=1e-12)
    assert run["largest_bytes"] == n["allreduce_largest_MiB"] * 2**20
    assert run["largest_busbw"] / run["link_one_way"] == pytest.approx(n["allreduce_fraction_of_peak"])
    assert run["known_defects"] and "03e60ca" in run["source"]
    # the all-gather and reduce-scatter figures, as that notebook printed them (where git has it)
    shown = subprocess.run(["git", "show", "03e60ca:book/08_distributed_training.ipynb"],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parent)
    if shown.returncode == 0:
        out = "".join("".join(o.get("text", "")) for o in json.loads(shown.stdout)["cells"][11]["outputs"])
        for op in ("all_gather", "reduce_scatter"):
            printed = re.search(op + r" +S = 1024.00 MiB: .* busbw +([\d.]+) GB/s", out).group(1)
            assert run[f"{op}_busbw"] == pytest.approx(float(printed) * 1e9, rel=1e-12)
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="schema"):
        D.two_gpu_run(tmp_path / "x.json")
