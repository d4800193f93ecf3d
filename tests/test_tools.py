"""perflab.profiling.profilers: finding and parsing Nsight Compute, py-spy and strace (the tools run where present)."""

import os
import sys
import textwrap

import pytest

from perflab.profiling import profilers as tools

# The layout of `ncu --csv` output (details page): messages first, then one row per kernel,
# section and metric. The numbers are invented for the test; the format follows the ncu CLI docs.
NCU_OUTPUT = textwrap.dedent('''\
    ==PROF== Connected to process 4242 (/usr/bin/python3.12)
    ==PROF== Profiling "vectorized_elementwise_kernel" - 0: 0%....50%....100% - 9 passes
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
    "0","4242","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4>(int)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","612.35"
    "0","4242","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4>(int)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Memory Throughput","%","88.10"
    "0","4242","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4>(int)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","11.20"
    "0","4242","python3.12","127.0.0.1","void at::native::vectorized_elementwise_kernel<4>(int)","1","7","(128, 1, 1)","(1048576, 1, 1)","0","9.0","SpeedOfLight","","","","SOLBottleneck"
    "1","4242","python3.12","127.0.0.1","nvjet_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","ms","1.45"
    "1","4242","python3.12","127.0.0.1","nvjet_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Elapsed Cycles","cycle","2,841,003"
    "1","4242","python3.12","127.0.0.1","nvjet_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","81.00"
    "1","4242","python3.12","127.0.0.1","nvjet_tst_256x128","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Memory Throughput","%","n/a"
''')


def test_parse_ncu_csv_reads_kernels_metrics_and_units():
    kernels = tools.parse_ncu_csv(NCU_OUTPUT)
    assert [k.id for k in kernels] == ["0", "1"]
    ew, gemm = kernels
    assert ew.get("Memory Throughput") == 88.10 and ew.units["Memory Throughput"] == "%"
    assert ew.get("Compute (SM) Throughput") == 11.20
    assert tools.ncu_duration_s(ew) == pytest.approx(612.35e-6)
    assert tools.ncu_duration_s(gemm) == pytest.approx(1.45e-3)
    assert gemm.get("Elapsed Cycles") == 2841003            # thousands separators removed
    with pytest.raises(KeyError, match="Memory Throughput"):    # "n/a" is not a number
        gemm.get("Memory Throughput")


def test_parse_ncu_csv_without_a_table_raises():
    with pytest.raises(ValueError, match="Metric Name"):
        tools.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n")


def test_run_ncu_rejects_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="script"):
        tools.run_ncu(tmp_path / "nope.py", "/usr/bin/true")
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(FileNotFoundError, match="ncu"):
        tools.run_ncu(script, str(tmp_path / "no-ncu"))


STRACE_OUTPUT = textwrap.dedent('''\
    % time     seconds  usecs/call     calls    errors syscall
    ------ ----------- ----------- --------- --------- ----------------
     96.17    0.069268          16      4118           read
      0.68    0.000487           6        70        24 newfstatat
    ------ ----------- ----------- --------- --------- ----------------
    100.00    0.072026          17      4188        24 total
''')


def test_parse_strace_summary():
    table = tools.parse_strace_summary(STRACE_OUTPUT)
    assert table["read"] == {"pct_time": 96.17, "seconds": 0.069268, "calls": 4118.0, "errors": 0.0}
    assert table["newfstatat"]["errors"] == 24
    assert table["total"]["calls"] == 4188
    with pytest.raises(ValueError, match="strace"):
        tools.parse_strace_summary("nothing here")


def test_find_tool_uses_path_then_candidates(tmp_path):
    exe = tmp_path / "v2" / "mytool"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert tools.find_tool("surely-not-a-tool-xyz") is None
    assert tools.find_tool("surely-not-a-tool-xyz", [str(tmp_path / "v*" / "mytool")]) == str(exe)
    assert tools.find_tool("sh") is not None
    with pytest.raises(ValueError, match="name"):
        tools.find_tool("")


def test_flamegraph_samples_adds_boxes_of_one_function():
    svg = ("<svg><g><title>all (300 samples, 100%)</title></g>"
           "<g><title>run (p.py:20) (300 samples, 100.00%)</title></g>"
           "<g><title>augment (p.py:12) (150 samples, 50.00%)</title></g>"
           "<g><title>augment (p.py:13) (60 samples, 20.00%)</title></g>"
           "<g><title>&lt;listcomp&gt; (p.py:13) (1,000 samples, 20.00%)</title></g></svg>")
    counts = tools.flamegraph_samples(svg)
    assert counts == {"all": 300, "run": 300, "augment": 210, "<listcomp>": 1000}
    with pytest.raises(ValueError, match="flame"):
        tools.flamegraph_samples("<svg></svg>")


@pytest.mark.skipif(tools.find_strace() is None, reason="strace is not installed on this machine")
def test_strace_counts_the_reads_of_a_file_loop(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(64 * 1024))
    script = tmp_path / "read.py"
    script.write_text("import sys\nf = open(sys.argv[1], 'rb', buffering=0)\nwhile f.read(4096):\n    pass\n")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    run = lambda path: tools.strace_summary([sys.executable, "-I", "-S", str(script), str(path)],  # noqa: E731
                                            tools.find_strace(), ["read"])[1]
    base = run(empty)["read"]["calls"]                    # start-up reads + the empty file's EOF read
    assert run(data)["read"]["calls"] - base == 64 * 1024 // 4096
    with pytest.raises(ValueError, match="cmd"):
        tools.strace_summary([], tools.find_strace())


@pytest.mark.skipif(tools.find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
def test_py_spy_records_a_flame_graph(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text("import time\ndef spin():\n    t = time.time()\n    while time.time() - t < 1.5:\n        pass\nspin()\n")
    svg = tmp_path / "out.svg"
    try:
        tools.py_spy_record(script, svg, tools.find_py_spy(), duration_s=3, rate_hz=50)
    except PermissionError as err:          # ptrace forbidden in this container: a stated limit
        pytest.skip(str(err))
    counts = tools.flamegraph_samples(svg.read_text())
    assert counts.get("spin", 0) > 0.5 * counts["all"]
    with pytest.raises(ValueError, match="duration_s"):
        tools.py_spy_record(script, svg, tools.find_py_spy(), duration_s=0)
