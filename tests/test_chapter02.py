"""Chapter 2, its section page on several GPUs, and lab 2: the issue's headline numbers are glued, each with
the clock it ran at, and the lab ends on the overlay.

The chapter page runs on one GPU; what needs two (the topology, the peer copy, the all-reduce sweep) lives on
the section page ``02_several_gpus.md``, in ``pending/book/`` until a two-GPU machine has run it, then in
``book/``."""

import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "book" / "02_hardware.md"
SECTION = next(p for p in (ROOT / "book" / "02_several_gpus.md", ROOT / "pending" / "book" / "02_several_gpus.md")
               if p.exists())
LAB = ROOT / "labs" / "02_hardware.md"

REQUIRED = ["cpu_memory_bandwidth_GBps", "gpu_copy_bandwidth_TBps", "matmul_tflops_bf16", "matmul_tflops_fp32",
            "h2d_pinned_GBps", "h2d_pageable_GBps", "l2_bandwidth_ratio",
            "burst_tflops", "sustained_tflops", "burst_clock", "sustained_clock",
            # issue 10, section 1: every headline number carries its clock
            "cpu_copy_clock", "cpu_cache_clock", "cpu_matmul_clock", "disk_clock", "gpu_copy_clock", "l2_clock",
            "matmul_fp32_clock", "matmul_bf16_clock", "elementwise_clock", "wave_clock", "h2d_clock",
            # what one GPU can read of NVLink, and the alpha-beta prediction from it
            "nvlink_predicted_GBps", "nvlink_read_sentence", "gpt2_allreduce_predicted_ms"]
# the section page measures what needs two GPUs; lab 2's overlay reads these names (the report card's)
SECTION_REQUIRED = ["p2p_bandwidth_GBps", "allreduce_busbw_GBps", "allreduce_latency_us", "allreduce_fit_busbw_GBps",
                    "allreduce_fit_rms", "p2p_clock", "allreduce_clock", "gpt2_allreduce_ms"]

# headline glue name -> how its cell runs under perflab.core.sampler (work on the host samples the CPU's clock)
UNDER_TELEMETRY = {
    "cpu_memory_bandwidth_GBps": 'telemetry_for("cpu")',
    "cpu_cache_clock": 'telemetry_for("cpu")',          # the sweep's cell (its treads are read in the next)
    "cpu_matmul_gflops_fp32": 'telemetry_for("cpu")',
    "disk_seq_cold_GBps": 'telemetry_for("cpu")',
    "gpu_copy_bandwidth_TBps": 'telemetry_for(work="memory")',   # a copy: the memory clock
    "l2_bandwidth_ratio": 'telemetry_for(work="memory")',
    "matmul_tflops_bf16": "telemetry_for()",
    "matmul_tflops_fp32": "telemetry_for()",
    "elementwise_tflops": "gpu.elementwise_rate(",        # returns the telemetry of its timing
    "wave_staircase_rms": "telemetry_for()",
    "burst_tflops": "gpu.burst_and_sustained(",           # samples burst and sustained itself
    "h2d_pinned_GBps": 'telemetry_for(work="link")',       # PCIe: no GPU clock sets it
}
SECTION_UNDER_TELEMETRY = {
    "p2p_bandwidth_GBps": "with Telemetry(index=0",       # the sending GPU
    "allreduce_latency_us": "ar.telemetry",               # rank 0 samples the timed sweep
}

# GPU results reach the prose as generated sentences (glue:md): each must carry its clock sentence
GPU_SENTENCES = ["hbm_sentence", "l2_sentence", "tensor_core_sentence", "wave_sentence", "h2d_sentence",
                 "non_blocking_sentence"]

# measured values the prose quotes with glue:text: the paragraph that reports each also quotes a clock
QUOTED_RESULTS = ["cpu_memory_bandwidth_1thread_GBps", "cpu_l1_read_GBps", "cpu_matmul_gflops_fp32",
                  "disk_rand_cold_iops", "matmul_tflops_bf16", "matmul_tflops_fp32", "burst_sentence"]


def glued_names(path):
    code = "\n".join(c.source for c in jupytext.read(path).cells if c.cell_type == "code")
    return set(re.findall(r'(?:glue|claim)\(\s*"([A-Za-z0-9_]+)"', code))


def test_chapter_glues_every_headline_number_of_the_issue():
    missing = set(REQUIRED) - glued_names(CHAPTER)
    assert not missing, f"not glued: {sorted(missing)}"
    missing = set(SECTION_REQUIRED) - glued_names(SECTION)
    assert not missing, f"not glued on the section page: {sorted(missing)}"


def front_matter(path):
    return jupytext.read(path).metadata.get("perflab", {})


def test_the_chapter_needs_one_gpu_and_its_section_page_two():
    """Issue 27: a page runs on one GPU or declares how many it needs; the chapter measures nothing that
    needs a second GPU (no peer copy, no collective launched, no cell asking for two GPUs)."""
    assert front_matter(CHAPTER) == {"gpus": 1} and front_matter(SECTION) == {"gpus": 2}
    code = "\n".join(code_cells())
    for needs_two in ("requires_gpu(2", "allreduce_sweep(", "peer_copy", "topology_text(", "gpu_count() >= 2"):
        assert needs_two not in code, f"chapter 2 still runs {needs_two}"
    section = "\n".join(code_cells(SECTION))
    assert "distributed.alpha_beta(" in section and "ar.points[0].seconds" not in section


def test_nvlink_is_read_from_nvml_and_the_prediction_uses_the_alpha_beta_model():
    cell = cell_gluing("nvlink_predicted_GBps")
    assert "perflab.core.nvml.nvlinks(0)" in cell and 'sheet.get("nvlink_bandwidth")' in cell
    cell = cell_gluing("gpt2_allreduce_predicted_ms")
    assert "def t_model(nbytes, ranks):" in cell and "alpha + 2 * (ranks - 1) / ranks * nbytes / beta" in cell


def test_no_cell_rebinds_a_name_the_summary_reads_to_another_kind_of_value():
    """The one-GPU run of the rework raised in the summary ('str' object has no attribute 'items'): the burst
    cell had rebound `rates`, the matrix products' dict, to a sentence. CPU runs skip the summary's GPU rows,
    so only a GPU run would see it; this reads the code instead."""
    code = code_cells()
    summary = next(c for c in code if c.lstrip().startswith("rows = ["))
    assert "rates.items()" in summary
    binds = [c for c in code if re.search(r"^rates\s*=", c, re.M)]
    assert len(binds) == 1 and "rates = {kind:" in binds[0], "`rates` is bound in more than one cell"


@pytest.mark.parametrize("path", [CHAPTER, SECTION], ids=["chapter", "section"])
def test_prose_quotes_only_names_glued_on_every_machine(path):
    """A name glued only inside a GPU cell would make a CPU build warn: the prose must not quote it."""
    nb = jupytext.read(path)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    quoted = set(re.findall(r"\{glue:text\}`([A-Za-z0-9_]+)", prose))
    gpu_only = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith("if requires_gpu("):
            gpu_only |= set(re.findall(r'(?:glue|claim)\(\s*"([A-Za-z0-9_]+)"', cell.source))
    assert quoted, "the prose quotes no glued number"
    assert not quoted & gpu_only, f"prose quotes GPU-only names: {sorted(quoted & gpu_only)}"
    assert quoted <= glued_names(path), f"quoted but never glued: {sorted(quoted - glued_names(path))}"


def test_lab_uses_the_report_card_and_ends_on_the_overlay():
    cells = [c for c in jupytext.read(LAB).cells if c.cell_type == "code"]
    assert any("report.measure(" in c.source for c in cells)
    # the overlay table, then its figure in a cell of its own (the book's figure convention)
    assert "overlay_table" in cells[-2].source and "read_glued" in cells[-2].source
    assert "plt.subplots" in cells[-1].source and "overlay_table" not in cells[-1].source


def test_claims_about_waves_clocks_and_the_alpha_beta_fit_follow_the_data():
    """The sentences that compare measured values are chosen by perflab.record.claims, not typed."""
    code = "\n".join(c.source for c in jupytext.read(CHAPTER).cells if c.cell_type == "code")
    for name in ("wave_sentence_text", "burst_sentence", "ceiling_vs_burst",
                 "cpu_littles_law_verdict", "cpu_cache_verdict", "disk_random_verdict"):
        assert re.search(r'claim\(\s*"' + name + '"', code), f"{name} is not generated by claim()"
    section = "\n".join(c.source for c in jupytext.read(SECTION).cells if c.cell_type == "code")
    for name in ("allreduce_fit_sentence", "gpt2_allreduce_sentence"):
        assert re.search(r'claim\(\s*"' + name + '"', section), f"{name} is not generated by claim()"
    # typed sentences about measured values are backed by expect()
    for name in ("elementwise_orders_slower", "h2d_small_latency_bound", "h2d_large_near_link"):
        assert re.search(r'expect\(\s*"' + name + '"', code), f"{name} is not checked by expect()"
    # the HBM copy and the pinned copy are compared with the run's ceilings, not shown as a second value
    assert code.count("vs_ceiling(") >= 3 and "ceilings.load()" in code
    assert "gpu.graph_copy_sweep(" in code and "working_set_sweep(dev" not in code


def test_lab_reference_column_reads_the_chapters_glued_values_only():
    src = "\n".join(c.source for c in jupytext.read(LAB).cells if c.cell_type == "code")
    assert "read_glued" in src and "load_reference" not in src and "ratios(card, reference_card)" not in src


def test_report_card_measures_the_l2_and_the_latency_as_the_chapter_does():
    """The lab's reference column is chapter 2's glued values, so the card the lab measures must use the
    chapter's methods: graph-replayed copies for the L2 and the alpha-beta fit for the latency."""
    report = (ROOT / "perflab" / "machine" / "report.py").read_text()
    assert "gpu.graph_copy_sweep(" in report and "working_set_sweep(dev" not in report
    assert "distributed.alpha_beta(" in report and "result.points[0].seconds" not in report
    lab = "\n".join(c.source for c in jupytext.read(LAB).cells if c.cell_type == "code")
    assert "other_method" not in lab, "the lab still leaves out a row the card now measures as the chapter does"
    assert "overlay_table(rows, reference_run=" in lab


def code_cells(path=CHAPTER):
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


def cell_gluing(name, path=CHAPTER):
    cells = [c for c in code_cells(path) if re.search(r'(?:glue|claim)\(\s*"' + name + '"', c)]
    assert len(cells) == 1, f"{name} is glued in {len(cells)} cells"
    return cells[0]


def test_every_headline_measurement_runs_under_telemetry():
    """Issue 10, section 1: each headline measurement runs under perflab.core.sampler and states its clock."""
    for path, table in ((CHAPTER, UNDER_TELEMETRY), (SECTION, SECTION_UNDER_TELEMETRY)):
        for name, how in table.items():
            cell = cell_gluing(name, path)
            assert how in cell, f"the cell of {name} does not run under telemetry ({how})"
            assert ".sentence()" in cell or 'telemetry.get("sentence"' in cell, f"the cell of {name} states no clock"
    # one sampler, perflab's: the chapter opens Telemetry blocks and writes no sampler or timing loop of its own
    setup = code_cells()[0]
    assert "from perflab.core.telemetry import Telemetry" in setup and "return Telemetry(" in setup
    for path in (CHAPTER, SECTION):
        code = "\n".join(code_cells(path))
        for banned in ("threading", "perf_counter", "Event(enable_timing", "nvml.readings(0, links=False)"):
            assert banned not in code, f"{path.name} times or samples by itself: {banned}"


def test_each_gpu_sentence_carries_the_clock_of_its_measurement():
    for name in GPU_SENTENCES:
        cell = cell_gluing(name)
        assert re.search(r"\{\w+\.sentence\(\)\}", cell), f"{name} carries no clock sentence"
    assert re.search(r"\{\w+\.sentence\(\)\}", cell_gluing("p2p_sentence", SECTION))


def test_prose_quotes_a_clock_beside_each_measured_result():
    prose = "\n".join(c.source for c in jupytext.read(CHAPTER).cells if c.cell_type == "markdown")
    section = "\n".join(c.source for c in jupytext.read(SECTION).cells if c.cell_type == "markdown")
    paragraphs = re.split(r"\n\s*\n", prose) + re.split(r"\n\s*\n", section)
    for name in QUOTED_RESULTS + ["allreduce_latency_us"]:
        hits = [p for p in paragraphs if "`" + name in p]
        assert hits, f"the prose does not quote {name}"
        # the first paragraph reports the result; later ones may compare it with other machines
        assert re.search(r"\{glue:text\}`\w*clock`", hits[0]), f"{name} is reported without its clock"


def test_rates_are_compared_with_the_clock_models_peak_at_their_clock():
    """Issue 29: the efficiency per clock is the rate over FLOP per clock per SM x SMs x the clock it ran
    at (perflab.machine.ceilings.Ceilings.peak), not the datasheet scaled by median / maximum clock (which takes
    the wrong clock for a Hopper GPU's tensor cores, 1.83 of 1.98 GHz)."""
    setup = code_cells()[0]
    assert "def per_clock(" in setup and "ceil.peak(fmt, tel.sm_clock_hz, fma)" in setup
    text = "\n".join(code_cells())
    assert "clock_normalized(" not in text and ".clock_fraction" not in text
    assert "per_clock(rate, kind, kind_tel)" in cell_gluing("matmul_tflops_bf16")       # every format
    assert 'per_clock(best_bf16, "bf16", best_tel)' in cell_gluing("matmul_tflops_bf16")
    assert 'per_clock(ew, "fp32", ew_tel, fma=False)' in cell_gluing("elementwise_tflops")
    assert 'ceil.ridge(' in cell_gluing("ridge_bf16_flop_per_byte")   # one ridge, the run's
    summary = [c for c in code_cells() if "published" in c and "at_clk" in c]
    assert summary, "the summary table has no ratio at the measurement's clock"


def test_the_wave_model_is_chosen_after_reading_which_kernel_ran():
    """Issue 29: check which kernel ran (names, grids, tiles) before fitting a staircase."""
    cell = cell_gluing("wave_staircase_rms")
    assert cell.index("perflab.core.profiler.kernels_of(") < cell.index("waves.fit_wave_width(")
    assert "persistent" in cell and "tiles=candidates" in cell


def test_the_pageable_model_is_tested_per_size_and_the_littles_law_check_can_fail():
    cell = cell_gluing("h2d_pinned_GBps")
    assert "cpu.memory_bandwidth(p.nbytes, 1)" in cell and '"pageable_model_sentence"' in cell
    littles = cell_gluing("cpu_memory_bandwidth_GBps")
    assert "0.5 <= bw_one / littles_law <= 2" in littles


def test_the_sum_probes_fixed_cost_is_measured_not_typed():
    """The L2 section said x.sum() costs "several microseconds" per call in a CUDA graph without measuring it:
    now the sum is replayed like the copy, its fixed cost fitted and the sentence chosen by the data."""
    prose = "\n".join(c.source for c in jupytext.read(CHAPTER).cells if c.cell_type == "markdown")
    assert "several microseconds" not in prose and "few microseconds" not in prose
    cell = cell_gluing("l2_sum_verdict")
    assert "gpu.graph_sum_sweep(" in cell and "caches.fit_fixed_cost(sum_raw)" in cell
    assert "l2_sentence += claim(" in cell


def test_code_lines_fit_in_80_columns():
    for path in (CHAPTER, SECTION, LAB):
        for cell in code_cells(path):
            long = [line for line in cell.splitlines() if len(line) > 80]
            assert not long, f"{path.name}: {long[0]!r} is {len(long[0])} columns"
