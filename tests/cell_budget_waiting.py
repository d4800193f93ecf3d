"""Code cells over the cell budget today (tests/test_cell_budget.py), waiting for their authors.

Keys: a page, then the cell's first line of code (70 characters at most), then its lines of code
today (a list, longest first, where several cells of the page start alike). The list only shrinks:
a cell over budget that is not listed, or longer than listed, fails the test; so does a listed
cell that keeps its budget now (remove its entry in the commit that shortens it). Budgets:
visible cells 30 lines of code, hidden cells (remove-cell, remove-input, hide-input) 15, #@save
cells 40 (CONTRIBUTING.md, "Cells a reader takes in at once").
"""

OVER_BUDGET: dict[str, dict[str, int | list[int]]] = {
    'book/01_why_training_is_slow.md': {
        'short = lambda name: name.split()[1][:4]       # "NVIDIA H200" -> "H20': 23,
        'for kind, rate in matmul.items():': 17,
        'small = step_t[batches[1]] / step_t[batches[0]]': 24,
        'big_ln = of_copy["layer norm, 8x rows"] / ln_of_copy': 47,
        'from IPython.display import Markdown': 122,
    },
    'book/02_hardware.md': {
        'top_read = max(p.bytes_per_s for p in ws[:3])': 27,
    },
    'book/02_hardware_gpu.md': {
        'if sweep is not None:': 62,
        'if probe_check is not None:': 30,
        'rates = {kind: r for (kind, n), (r, _) in mm.items() if n == n_mm}': 26,
        'glue("burst_tflops", bst.burst_rate / 1e12)': 16,
    },
    'book/03_pytorch_internals.md': {
        'contiguous = times["sum(dim=1), contiguous"]': 23,
        'glue("host_dram_copy_GBps", dram_bw / 1e9)': 56,
        'alloc_big = Spread(tuple(fault_pairs))': 22,
    },
    'book/03_pytorch_internals_graphs.md': {
        'glue("call_path_addmm_host_us", addmm_us)': 31,
        'def sigmoid_composite(x):': 32,
        'glue("custom_op_us", op_t["op"].median * 1e6)': 23,
        'if dev.type == "cuda":': 58,
        'if requires_gpu(what="The sync-debug-mode survey"):': 37,
    },
    'book/04_measuring_and_profiling.md': {
        'if lock_ms is not None:': 20,
        'overhead_ms = (first["first_matmul_s"] - first["warm_matmul_s"]) * 1e3': 17,
        'l2_bytes = describe().get("l2_bytes")': 34,
        'med_us, mean_us = statistics.median(s_us), statistics.fmean(s_us)': 23,
        'seq_t = [s for _, s, _ in seq]': 42,
    },
    'book/04_measuring_and_profiling_tools.md': {
        'columns = [Column("name", "operator or range"), Column("calls", "calls': 21,
        'glue("trace_overhead_idle_fraction", summaries["overhead"].idle_fracti': 42,
        'glue("datamovement_contraction_flop_share", flop_sh[C])': 21,
        'glue("datamovement_contraction_time_share_eager", time_eager[C])': 67,
        'dram_peak = run_ceil.roof("copy_bandwidth")     # None on a CPU': 40,
        'steps_o = max(summaries["overhead"].steps, 1)': 35,
        'glue("stage_timing_augment_share", stage_share["augment"])': 27,
        'if on_gpu:': 28,
    },
    'book/08_distributed_training.md': {
        'blocks_bwd = 2 / 3 * block_flops / rate': 17,
        'on_nccl = backend == "nccl"': 23,
    },
    'book/09_1_torch_compile.md': {
        'import cProfile': 68,
    },
    'book/roofline_explorer.md': {
        'SHEETS = perflab.machine.datasheets.DATASHEETS': 18,
    },
    'labs/01_roofline.md': {
        'def cost_A():': 19,
        'require(1, regimes=regimes)': 34,
        'def my_timer(fn, warmup=5, reps=30):': 24,
        'n = pick(cpu=256, gpu=2048)  # ~0.3 ms (GPU) to ~1 ms (one CPU core)': 38,
        'predictions = None  # set by your code': 24,
        'require(3, predictions=predictions, measured=measured)': 43,
    },
    'labs/02_hardware.md': {
        'my_ridge = None    # FLOP/byte, set by your code': 20,
    },
    'labs/03_internals.md': {
        'def snippet_a(x):': 40,
        'perflab.labs.lab03.check_function_class(SiLU)   # a torch.autograd.Fun': 52,
        'def make_problem(seed=0):': 35,
        'def train_fast(model, opt, xs, ys):': 17,
        'fast_model, slow_model = copy.deepcopy(model), copy.deepcopy(model)': 103,
        'ref_path = Path("../book/03_pytorch_internals.ipynb")   # the sweep\'s ': 31,
    },
    'labs/04_profiling.md': {
        'top_name = None  # set by your code': 21,
        'from perflab.profiling.trace import count_cost, regime, summarize_trac': 38,
        'ref_path = Path("../book/04_measuring_and_profiling_tools.ipynb")': 45,
    },
    'labs/09_advanced.md': {
        'predicted_speedup = None  # your prediction, from the bytes moved': 24,
        'seconds = None        # set by your code: {mode: seconds per step}': 17,
    },
    'pending/book/02_several_gpus.md': {
        'if ar.backend == "nccl":': 31,
    },
    'pending/book/10_multi_gpu.md': {
        'from dataclasses import asdict': 36,
        'ladder = speed_ladder(base)': 35,
        'if out:': 21,
    },
}
