import os

import pytest

from perflab.distributed import collectives, torchrun
from perflab.core.device import gpu_count

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
    assert collectives.algorithm_bandwidth(1e9, 0.01) == 1e11
    assert collectives.bus_bandwidth(1e9, 0.01, 2) == 1e11                 # 2 (n-1)/n = 1 for n = 2
    assert collectives.bus_bandwidth(1e9, 0.01, 8) == pytest.approx(1e11 * 14 / 8)
    with pytest.raises(ValueError, match="world_size"):
        collectives.bus_bandwidth(1e9, 0.01, 1)
    with pytest.raises(ValueError, match="seconds"):
        collectives.algorithm_bandwidth(1e9, 0)


def test_allreduce_time_inverts_bus_bandwidth():
    t = collectives.allreduce_time(4e8, 2e11, 8, latency_s=1e-5)
    assert collectives.bus_bandwidth(4e8, t - 1e-5, 8) == pytest.approx(2e11)
    with pytest.raises(ValueError, match="busbw"):
        collectives.allreduce_time(1, 0, 2)


def test_gpu_link_reads_the_topology_matrix():
    assert collectives.gpu_link(TOPO, 0, 1) == "NV18"
    assert collectives.gpu_link(TOPO, 1, 0) == "NV18"
    assert collectives.gpu_link(TOPO, 0, 5) is None
    assert collectives.gpu_link("no matrix here", 0, 1) is None


def test_child_environment_keeps_nvlink_multicast_off_and_finds_perflab(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = torchrun._child_env({"EXTRA": 3})
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["EXTRA"] == "3"
    assert os.path.isdir(os.path.join(env["PYTHONPATH"].split(os.pathsep)[0], "perflab"))


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU fallback")
def test_gloo_allreduce_between_two_cpu_processes():
    assert torchrun.default_backend() == "gloo"
    result = collectives.allreduce_sweep([4096, 2**20], nproc=2)
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
        collectives.launch(["allreduce", "--sizes", "lots"], nproc=2, backend="gloo", timeout_s=120)
    assert "exited with status" in str(err.value)


def test_a_launch_that_runs_too_long_is_killed():
    with pytest.raises(torchrun.LaunchError, match="timed out"):
        collectives.launch(["allreduce", "--sizes", "4096"], nproc=2, backend="gloo", timeout_s=0.5)


def test_launch_rejects_bad_arguments_before_starting_anything():
    with pytest.raises(ValueError, match="nproc"):
        collectives.launch(["allreduce"], nproc=1)
    with pytest.raises(ValueError, match="backend"):
        collectives.launch(["allreduce"], backend="mpi")
    with pytest.raises(ValueError, match="sizes"):
        collectives.allreduce_sweep([6])
    if gpu_count() < 2:
        with pytest.raises(ValueError, match="GPUs"):
            collectives.launch(["allreduce"], backend="nccl")


def test_gpu_link_reads_the_h200_topology_with_its_escape_codes():
    from perflab.distributed.collectives import gpu_link

    # `nvidia-smi topo -m` on the 2x H200 reference machine, escape codes and all
    text = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
            "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    assert gpu_link(text, 0, 1) == "NV18"
    assert gpu_link(text, 1, 0) == "NV18"


def test_alpha_beta_recovers_latency_and_bus_bandwidth_from_a_sweep():
    alpha, busbw, n = 20e-6, 3.6e11, 2
    sizes = [2**k for k in range(12, 31, 2)]
    pts = tuple(collectives.AllReducePoint(s, collectives.allreduce_time(s, busbw, n, alpha), 10,
                                           0.0, 0.0) for s in sizes)
    fit = collectives.alpha_beta(collectives.AllReduceResult("nccl", n, "cuda", pts, {}, "cuda events"))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.busbw == pytest.approx(busbw, rel=1e-6)
    assert fit.rms_relative < 1e-9 and fit.points == len(sizes)
    assert fit.seconds(2**20, n) == pytest.approx(collectives.allreduce_time(2**20, busbw, n, alpha))
    assert fit.half_bandwidth_bytes == pytest.approx(alpha * busbw)
    flat = tuple(collectives.AllReducePoint(s, 1e-3 - 1e-13 * s, 10, 0.0, 0.0) for s in sizes)
    with pytest.raises(ValueError, match="grow"):
        collectives.alpha_beta(collectives.AllReduceResult("gloo", 2, "cpu", flat, {}))


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
