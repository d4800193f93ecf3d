import pytest
import torch

from perflab.machine import cpu


def fake_sysfs(root, entries):
    for i, (level, kind, size, shared) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "shared_cpu_list").write_text(f"{shared}\n")
        (d / "coherency_line_size").write_text("64\n")
    return root


def test_cache_levels_parse_sizes_sharing_and_order(tmp_path):
    root = fake_sysfs(tmp_path, [(3, "Unified", "32768K", "0-7,16-23"), (1, "Instruction", "32K", "0"),
                                 (1, "Data", "48K", "0,16"), (2, "Unified", "2M", "0")])
    levels = cpu.cache_levels(root)
    assert [c.name for c in levels] == ["L1d", "L1i", "L2", "L3"]
    assert levels[0].size_bytes == 48 * 1024 and levels[0].shared_by == 2
    assert levels[2].size_bytes == 2 * 2**20
    assert levels[3].size_bytes == 32 * 2**20 and levels[3].shared_by == 16
    assert levels[3].line_bytes == 64


def test_cache_levels_is_empty_where_the_os_says_nothing(tmp_path):
    assert cpu.cache_levels(tmp_path / "missing") == []


def test_threads_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu.threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu.threads(None) as n:
        assert n == before
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="count"):
            with cpu.threads(bad):
                pass


def test_default_thread_counts_double_up_to_the_maximum():
    assert cpu.default_thread_counts(6) == [1, 2, 4, 6]
    assert cpu.default_thread_counts(8) == [1, 2, 4, 8]
    assert cpu.default_thread_counts(1) == [1]
    with pytest.raises(ValueError, match="maximum"):
        cpu.default_thread_counts(0)


def test_memory_bandwidth_and_matmul_scaling_measure_positive_rates():
    assert cpu.memory_bandwidth(4 * 2**20, num_threads=1) > 0
    (t, rate), = cpu.matmul_thread_scaling(64, [1])
    assert t == 1 and rate > 0
    with pytest.raises(ValueError, match="nbytes"):
        cpu.memory_bandwidth(3)
    with pytest.raises(ValueError, match="thread_counts"):
        cpu.matmul_thread_scaling(64, [])


def test_simd_lanes_and_bf16_unit_come_from_the_flags():
    assert cpu.simd_fp32_lanes({"avx512f", "avx2"}) == 16
    assert cpu.simd_fp32_lanes({"avx2", "fma"}) == 8
    assert cpu.simd_fp32_lanes({"asimd"}) == 4
    assert cpu.bf16_matmul_unit({"avx512_bf16", "amx_bf16"}) == "amx_bf16"
    assert cpu.bf16_matmul_unit({"avx512_bf16"}) == "avx512_bf16"
    assert cpu.bf16_matmul_unit(set()) is None


def test_peak_flops_estimate_is_the_product_of_its_factors():
    assert cpu.peak_flops_estimate(cores=4, fma_units=2, clock=3e9, lanes=16) == 4 * 16 * 2 * 2 * 3e9
    with pytest.raises(ValueError, match="cores"):
        cpu.peak_flops_estimate(cores=0, clock=1e9, lanes=8)
    with pytest.raises(ValueError, match="clock"):
        cpu.peak_flops_estimate(clock=-1.0, lanes=8)


def test_physical_cores_count_distinct_sibling_sets(tmp_path):
    """Two logical CPUs of one core (SMT) share its FMA units: chapter 2's SIMD estimate counts
    physical cores, read from the OS's sibling lists."""
    for i, siblings in enumerate(["0,2", "1,3", "0,2", "1,3"]):
        topo = tmp_path / f"cpu{i}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(siblings + "\n")
    (tmp_path / "cpufreq").mkdir()                       # not a cpuN directory
    assert cpu.physical_cores(tmp_path) == 2
    assert cpu.physical_cores(tmp_path / "nowhere") is None


def test_core_shares_read_busy_and_stolen_ticks_from_proc_stat():
    """Chapter 8's review of run 439fc20, finding 12: the telemetry of the gloo launch said
    only that the CPU clock cannot be read; what decides its host-bound verdicts is whether
    the ranks' cores were busy with something else, or stolen by the hypervisor."""
    from perflab.machine.cpu import core_shares, core_times
    before = core_times("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 0 5 80 5 0 0 0 0 0\n"
                        "cpu1 10 0 5 80 5 0 0 0 0 0\nintr 1 2 3\n")
    after = core_times("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 70 0 15 100 5 0 0 10 0 0\n"
                       "cpu1 20 0 5 170 5 0 0 0 0 0\n")
    assert sorted(before) == [0, 1] and before[0]["steal"] == 0
    one = core_shares(before, after, [0])
    assert one == {"busy": 0.7, "steal": 0.1, "iowait": 0.0}
    both = core_shares(before, after, [0, 1])
    assert both["busy"] == pytest.approx(80 / 200)
    assert core_shares(before, after, [7]) is None
    assert core_shares(before, before, [0]) is None
    with pytest.raises(ValueError, match="went back"):
        core_shares(after, before, [0])
    assert isinstance(core_times(), dict)
