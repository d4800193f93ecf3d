"""perflab.profiling.profilers: finding and parsing Nsight Compute, py-spy and strace (the tools run where present)."""

import os
import sys
import textwrap
from pathlib import Path

import pytest

from perflab.profiling import profilers

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
    kernels = profilers.parse_ncu_csv(NCU_OUTPUT)
    assert [k.id for k in kernels] == ["0", "1"]
    ew, gemm = kernels
    assert ew.get("Memory Throughput") == 88.10 and ew.units["Memory Throughput"] == "%"
    assert ew.get("Compute (SM) Throughput") == 11.20
    assert profilers.ncu_duration_s(ew) == pytest.approx(612.35e-6)
    assert profilers.ncu_duration_s(gemm) == pytest.approx(1.45e-3)
    assert gemm.get("Elapsed Cycles") == 2841003            # thousands separators removed
    with pytest.raises(KeyError, match="Memory Throughput"):    # "n/a" is not a number
        gemm.get("Memory Throughput")


def test_parse_ncu_csv_without_a_table_raises():
    with pytest.raises(ValueError, match="Metric Name"):
        profilers.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n")


def test_run_ncu_rejects_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="script"):
        profilers.run_ncu(tmp_path / "nope.py", "/usr/bin/true")
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(FileNotFoundError, match="ncu"):
        profilers.run_ncu(script, str(tmp_path / "no-ncu"))


STRACE_OUTPUT = textwrap.dedent('''\
    % time     seconds  usecs/call     calls    errors syscall
    ------ ----------- ----------- --------- --------- ----------------
     96.17    0.069268          16      4118           read
      0.68    0.000487           6        70        24 newfstatat
    ------ ----------- ----------- --------- --------- ----------------
    100.00    0.072026          17      4188        24 total
''')


def test_parse_strace_summary():
    table = profilers.parse_strace_summary(STRACE_OUTPUT)
    assert table["read"] == {"pct_time": 96.17, "seconds": 0.069268, "calls": 4118.0, "errors": 0.0}
    assert table["newfstatat"]["errors"] == 24
    assert table["total"]["calls"] == 4188
    with pytest.raises(ValueError, match="strace"):
        profilers.parse_strace_summary("nothing here")


def test_find_tool_uses_path_then_candidates(tmp_path):
    exe = tmp_path / "v2" / "mytool"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert profilers.find_tool("surely-not-a-tool-xyz") is None
    assert profilers.find_tool("surely-not-a-tool-xyz", [str(tmp_path / "v*" / "mytool")]) == str(exe)
    assert profilers.find_tool("sh") is not None
    with pytest.raises(ValueError, match="name"):
        profilers.find_tool("")


def test_flamegraph_samples_adds_boxes_of_one_function():
    svg = ("<svg><g><title>all (300 samples, 100%)</title></g>"
           "<g><title>run (p.py:20) (300 samples, 100.00%)</title></g>"
           "<g><title>augment (p.py:12) (150 samples, 50.00%)</title></g>"
           "<g><title>augment (p.py:13) (60 samples, 20.00%)</title></g>"
           "<g><title>&lt;listcomp&gt; (p.py:13) (1,000 samples, 20.00%)</title></g></svg>")
    counts = profilers.flamegraph_samples(svg)
    assert counts == {"all": 300, "run": 300, "augment": 210, "<listcomp>": 1000}
    with pytest.raises(ValueError, match="flame"):
        profilers.flamegraph_samples("<svg></svg>")


def test_collapsed_stacks_keep_the_programs_frames_by_function():
    raw = ("_find_and_load (<frozen importlib._bootstrap>:1176);<module> (site.py:1) 7\n"
           "<module> (/build/x/pipeline.py:40);run (pipeline.py:30);decode (pipeline.py:15);"
           "JSONDecoder.decode (/usr/lib/json/decoder.py:337) 5\n"
           "<module> (pipeline.py:40);run (pipeline.py:30);augment (pipeline.py:20) 8\n"
           "<module> (pipeline.py:40);run (pipeline.py:31);augment (pipeline.py:21) 2\n"
           "<module> (pipeline.py:40);make_records (pipeline.py:9) 5\n")
    stacks = profilers.collapsed_stacks(raw, ["pipeline.py"])
    assert stacks == {("<module>", "run", "decode"): 5, ("<module>", "run", "augment"): 10,
                      ("<module>", "make_records"): 5}
    shares = profilers.stack_shares(stacks, ["decode", "augment"], within="run")
    assert shares == {"decode": 5 / 15, "augment": 10 / 15}
    assert profilers.stack_shares(stacks, ["run"])["run"] == 15 / 20
    with pytest.raises(ValueError, match="no samples"):
        profilers.stack_shares(stacks, ["augment"], within="collate")
    with pytest.raises(ValueError, match="files"):
        profilers.collapsed_stacks(raw, [])
    with pytest.raises(ValueError, match="collapsed"):
        profilers.collapsed_stacks("no count here", ["pipeline.py"])
    with pytest.raises(ValueError, match="collapsed"):
        profilers.collapsed_stacks("12", ["pipeline.py"])


def test_collapsed_stacks_drop_a_sample_with_an_empty_stack():
    """py-spy 0.4 writes a sample taken with no Python frame (the interpreter starting or
    exiting) as a line holding only its count, ' 1': a sample with no kept frame, dropped."""
    raw = " 1\n<module> (pipeline.py:40);run (pipeline.py:30) 4\n 2\n"
    assert profilers.collapsed_stacks(raw, ["pipeline.py"]) == {("<module>", "run"): 4}


def test_plot_flame_puts_the_root_at_the_bottom():
    import matplotlib
    matplotlib.use("Agg")
    ax = profilers.plot_flame({("main", "a"): 3, ("main", "b"): 1})
    bars = sorted((p.get_y() + p.get_height() / 2, p.get_x(), p.get_width()) for p in ax.patches)
    assert bars[0][1:] == (0.0, 1.0)                 # the root: level 0, the whole width
    assert [round(b[2], 2) for b in bars if round(b[0]) == 2] == [0.75, 0.25]
    with pytest.raises(ValueError, match="samples"):
        profilers.plot_flame({})


@pytest.mark.skipif(profilers.find_strace() is None, reason="strace is not installed on this machine")
def test_strace_counts_the_reads_of_a_file_loop(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(64 * 1024))
    script = tmp_path / "read.py"
    script.write_text("import sys\nf = open(sys.argv[1], 'rb', buffering=0)\nwhile f.read(4096):\n    pass\n")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    run = lambda path: profilers.strace_summary([sys.executable, "-I", "-S", str(script), str(path)],  # noqa: E731
                                                profilers.find_strace(), ["read"])[1]
    base = run(empty)["read"]["calls"]                    # start-up reads + the empty file's EOF read
    assert run(data)["read"]["calls"] - base == 64 * 1024 // 4096
    with pytest.raises(ValueError, match="cmd"):
        profilers.strace_summary([], profilers.find_strace())


@pytest.mark.skipif(profilers.find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
def test_py_spy_records_a_flame_graph(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text("import time\ndef spin():\n    t = time.time()\n    while time.time() - t < 1.5:\n        pass\nspin()\n")
    svg = tmp_path / "out.svg"
    try:
        profilers.py_spy_record(script, svg, profilers.find_py_spy(), duration_s=3, rate_hz=50)
    except PermissionError as err:          # ptrace forbidden in this container: a stated limit
        pytest.skip(str(err))
    counts = profilers.flamegraph_samples(svg.read_text())
    assert counts.get("spin", 0) > 0.5 * counts["all"]
    raw = tmp_path / "out.txt"
    profilers.py_spy_record(script, raw, profilers.find_py_spy(), duration_s=3, rate_hz=50,
                            output_format="raw")
    shares = profilers.stack_shares(profilers.collapsed_stacks(raw.read_text(), [script.name]), ["spin"])
    assert shares["spin"] > 0.5
    with pytest.raises(ValueError, match="output_format"):
        profilers.py_spy_record(script, raw, profilers.find_py_spy(), output_format="svg")
    with pytest.raises(ValueError, match="duration_s"):
        profilers.py_spy_record(script, svg, profilers.find_py_spy(), duration_s=0)


def test_nsys_is_found_or_none_and_run_nsys_checks_its_arguments(tmp_path):
    found = profilers.find_nsys()
    assert found is None or os.access(found, os.X_OK)
    with pytest.raises(FileNotFoundError, match="script"):
        profilers.run_nsys(tmp_path / "missing.py", "/bin/true", tmp_path / "r")
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(FileNotFoundError, match="nsys"):
        profilers.run_nsys(script, str(tmp_path / "no-nsys"), tmp_path / "r")


def test_kernel_summary_has_the_nsys_kernel_report_columns():
    from perflab.profiling.trace import kernel_summary
    events = [
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 0.0, "dur": 10.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 20.0, "dur": 30.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 60.0, "dur": 10.0, "args": {}},
    ]
    rows = kernel_summary(events)
    assert [r["name"] for r in rows] == ["k1", "k2"]
    assert rows[0]["instances"] == 2 and rows[0]["total_us"] == 40.0
    assert rows[0]["med_us"] == 20.0 and rows[0]["min_us"] == 10.0 and rows[0]["max_us"] == 30.0
    assert abs(sum(r["time_pct"] for r in rows) - 100) < 1e-9
    with pytest.raises(ValueError, match="no kernels"):
        kernel_summary([])


def _page_code(stem):
    import jupytext
    page = Path(__file__).resolve().parent.parent / "book" / f"{stem}.md"
    return [c.source for c in jupytext.read(page).cells if c.cell_type == "code"]


def _function_source(cells, name):
    import ast
    for src in cells:
        body = "\n".join(l for l in src.splitlines() if not l.startswith(":tags:"))
        try:
            tree = ast.parse(body)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return ast.get_source_segment(body, node)
    raise AssertionError(f"{name} is not defined on the page")


def test_chapter4_takes_one_efficiency_per_counted_cycle():
    """Review G1 (6 December, f): chapter 2 counts the clock the SMs ran at, and per counted cycle
    the 8192^3 bf16 product used 84 % in the burst (1,716 MHz) and 84 % in the sustained run
    (1,465 MHz), where NVML's clocks gave 73 % and 91 %. Chapter 4's model and the tools page
    take one efficiency per counted cycle, from chapter 2's counted points, not NVML's; with it
    the traced 787 TFLOP/s needs about 1,730 MHz, an ordinary burst clock."""
    tools = _page_code("04_measuring_and_profiling_tools")
    main = _page_code("04_measuring_and_profiling")
    src = _function_source(tools, "efficiency_per_cycle")
    assert src == _function_source(main, "efficiency_per_cycle"), "the two pages' models differ"
    ns = {}
    exec(src + "\n\n" + _function_source(tools, "clock_needed"), ns)
    pts = [(1716e6, 0.840), (1465e6, 0.841)]
    per_hz = 132 * 4096                          # H100 bf16 FLOP per clock
    assert abs(ns["efficiency_per_cycle"](pts) - 0.8405) < 1e-9
    assert ns["efficiency_per_cycle"]([]) is None
    needed = ns["clock_needed"](787e12, pts, per_hz)
    assert 1700e6 < needed < 1760e6
    for code in ("\n".join(tools), "\n".join(main)):
        assert "efficiency_at" not in code
        assert '_cycle_mhz"] * 1e6, ch2_glue[f"{k}_per_cycle"]' in code
    code = "\n".join(tools)
    assert "efficiency_per_cycle(clock_points) if f_step" in code
    assert "above {top}" in code and "top = f\"the chip's maximum of" in code


def _cell_defining(stem, name):
    import jupytext
    page = Path(__file__).resolve().parent.parent / "book" / f"{stem}.md"
    for c in jupytext.read(page).cells:
        if c.cell_type == "code" and f"def {name}(" in c.source:
            return c.source
    raise AssertionError(f"{name} is not defined on {stem}")


def test_chapter4_lesson_follows_the_counted_clocks():
    """Review G1: the lesson says what the counted points show: equal use of each cycle at both
    clocks (run 0607: 84 % and 84 %) is not "worse at a higher clock"; a real gap is named."""
    ns = {}
    main = _page_code("04_measuring_and_profiling")
    exec(_function_source(main, "lesson_words") + "\n\n"
         + _function_source(main, "one_count_words"), ns)
    same = ns["lesson_words"]([(1716e6, 0.840), (1465e6, 0.841)],
                              [(1980e6, 0.728), (1350e6, 0.912)])
    assert "equally well" in same and "worse" not in same and "NVML" in same
    worse = ns["lesson_words"]([(1716e6, 0.74), (1465e6, 0.84)], [])
    assert "12% worse at the higher clock" in worse
    assert "one clock or none" in ns["lesson_words"]([(1716e6, 0.84)], [])


def test_chapter4_tools_sets_the_spin_against_ncu():
    """Review G2: run 0607's ncu timed the 8192^3 bf16 product at 1.41 ms at 1.57 GHz (92 % per
    cycle) where chapter 2's spin gave 84 %: the spin read ~1.09x the clock ncu implies, and the
    page says so with numbers."""
    from perflab.record.numbers import fmt, fmt_range
    ns = {"fmt": fmt, "fmt_range": fmt_range}    # the page's imports the function reads
    exec(_function_source(_page_code("04_measuring_and_profiling_tools"), "spin_words"), ns)
    ratio, said = ns["spin_words"](1.41e-3, 1.57, 0.840, 132 * 4096)
    assert 1.08 < ratio < 1.11
    assert "92%" in said and "84%" in said and "1.09x" in said and "9% shorter" in said


def test_chapter4_tools_gpu_util_sentence_follows_its_verdict():
    """Review G4 (6 December, f): "GPU-Util is an honest signal" was printed under a false verdict
    (1.34x and 1.36x the busy fraction in two runs). The sentence now follows the verdict, and
    (stability review, 7 December d) the prediction adds NVML's time per busy stretch, measured
    on the page: the ratio is to that, over windows of one loop."""
    from perflab.core.rounds import Spread
    from perflab.record.claims import Verdict
    from perflab.record.numbers import fmt, fmt_range
    ns = {"fmt": fmt, "fmt_range": fmt_range}    # the page's imports the function reads
    exec(_function_source(_page_code("04_measuring_and_profiling_tools"), "util_words"), ns)
    over = ns["util_words"](Verdict("outside"), Spread((1.34, 1.36, 1.38)))
    assert "honest" not in over and "1.36x" in over and "over-reads" in over
    assert "1.34x–1.38x over 3 windows" in over   # numbers.fmt_range
    assert "time per stretch" in over
    assert "is honest" in ns["util_words"](Verdict("within"), Spread((0.9, 1.0, 1.1)))
    assert "undecided" in ns["util_words"](Verdict("undecided"), Spread((1.2, 1.3, 1.4)))


def test_chapter4_tools_util_windows_cut_one_loop_into_windows():
    """gpu_util_vs_busy (stability review, 7 December d): one loop's NVML readings and step marks
    cut into windows after the skipped first second; each window gives the median reading and
    its own wall time per step; a window without readings is left out."""
    import statistics
    ns = {"statistics": statistics}
    exec(_function_source(_page_code("04_measuring_and_profiling_tools"), "util_windows"), ns)
    samples = [(0.5, 90), (1.05, 10), (1.1, 20), (1.2, 30), (1.3, 12)]
    marks = [(0.9 + 0.01 * k, k) for k in range(1, 60)]     # 10 ms per step
    got = ns["util_windows"](samples, marks, start=1.0, width=0.25, n=3)
    assert len(got) == 2                               # the third window has no reading
    assert got[0][0] == 20 and got[1][0] == 12
    assert abs(got[0][1] - 0.01) < 1e-9 and abs(got[1][1] - 0.01) < 1e-9


def test_chapter2_spin_length_sentence_names_a_biased_spin():
    """Review G2 (6 December, f): a 400,000-cycle spin right after the products may count a clock
    that rises while it runs; spins of three lengths tell. Stability review (7 December d): in
    run 439fc20 their times (50,000, 100,000, 400,000 cycles at 1,725, 1,830, 1,919 MHz) lie on
    one line, one clock of 1,950 MHz plus 3.4 µs of start-up per spin, which the two-length
    count cancels; times off one line (run f96650c's, 3 % off) say the run cannot tell."""
    import statistics
    from perflab.record.numbers import fmt
    ns = {"statistics": statistics, "fmt": fmt}
    ch2 = _page_code("02_hardware_gpu")
    exec(_function_source(ch2, "spin_above_words") + "\n\n"
         + _function_source(ch2, "spin_length_words"), ns)
    line = ns["spin_length_words"]({50_000: 1725.0, 100_000: 1830.0, 400_000: 1919.0})
    assert "one line within 2 %" in line and "1,950 MHz" in line and "3.36 µs" in line
    bent = ns["spin_length_words"]({50_000: 1594.0, 100_000: 1679.0, 400_000: 1868.0})
    assert "miss one line by up to 3%" in bent and "a start-up that varied" in bent
    assert ns["spin_length_words"]({}) == ""


def test_chapter4_lock_guards_counts_above_the_chip_maximum():
    """Validation review e (7 December): chapter 2's burst count read 1,997 MHz on a chip whose
    maximum is 1,980 MHz, and chapter 4's lesson drew a cause from it. A count above the
    maximum is named and not compared; chapter 2's two NVML points are carried to a burst's
    clock on a line, held at the nearer point outside them; the spin-length line refuses a
    count above the maximum."""
    main = _page_code("04_measuring_and_profiling")
    ns = {}
    exec(_function_source(main, "lesson_words") + "\n\n"
         + _function_source(main, "one_count_words") + "\n\n"
         + _function_source(main, "interpolated"), ns)
    nvml = [(1500e6, 0.83), (1933e6, 0.75)]
    said = ns["lesson_words"]([(1505e6, 0.82)], nvml, [1997e6])
    assert "above the chip's maximum" in said and "73%" not in said
    assert "83% at 1,500 MHz" in said
    assert "one clock or none" in ns["lesson_words"]([], [], ())
    two = ns["lesson_words"]([(1505e6, 0.82), (1900e6, 0.74)], nvml)
    assert "worse at the higher clock" in two
    assert abs(ns["interpolated"](nvml, 1716.5e6) - 0.79) < 1e-9
    assert ns["interpolated"](nvml, 1980e6) == 0.75       # held, not extrapolated
    assert ns["interpolated"](nvml, 1400e6) == 0.83
    assert ns["interpolated"](nvml[:1], 1700e6) is None
    ch2 = _page_code("02_hardware_gpu")
    ns2 = {"fmt": lambda v, u: f"{v:g} {u}"}
    exec("import statistics\n" + _function_source(ch2, "spin_above_words") + "\n\n"
         + _function_source(ch2, "spin_length_words"), ns2)
    words = ns2["spin_length_words"]
    assert "no SM runs at" in words({50_000: 1698, 100_000: 1791, 400_000: 1997}, 1.98e9)
    steep = words({50_000: 1850, 100_000: 1920, 400_000: 1975}, 1.98e9)   # slope ~2 GHz
    assert "line's slope" in steep and "one clock of" not in steep
    ok = words({50_000: 1698, 100_000: 1791, 400_000: 1874}, 1.98e9)
    assert "one clock of" in ok and "above" not in ok
    assert words({50_000: 1698}, 1.98e9) == ""
    ch2_code = "\n".join(ch2)
    assert "if counted and over:" in ch2_code and "a clock no SM runs at" in ch2_code
