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
        'models = [': 31,
        'short = lambda name: name.split()[1][:4]       # "NVIDIA H200" -> "H20': 23,
        'for kind, rate in matmul.items():': 17,
        'glue("roofline_knee_check_repeat", knee_r)': 18,
        'if cuda_ops:': 18,
        'glue("doubling_clock", tel.summary().sentence())': 19,
        'glue("overhead_hidden_above_MiB", hidden / 2**20)': 17,
        'ln_of_copy = moved["layer norm"] / m_ln.seconds / copy_bw': 16,
        'glue("essay_layernorm_big_copy_fraction", ln_big_of_copy)': 38,
        'a100 = H.DATASHEETS["NVIDIA A100-SXM4-80GB"]': 116,
    },
    'book/02_hardware.md': {
        'import math': 46,
        'matched = caches.match_steps(steps, [c.size_bytes for c in levels])': 59,
        'if requires_gpu(what="The HBM bandwidth measurement"):': 41,
        'if requires_gpu(what="The L2-versus-HBM sweep"):': 70,
        'bf16_sizes = pick(cpu=[256, 512], gpu=[4096, 8192, 16384])': 62,
        'if requires_gpu(what="The elementwise (CUDA-core) rate"):': 45,
        'if requires_gpu(what="The wave-quantization sweep"):': 88,
        'mm_kind = pick(cpu="matmul_fp32", gpu="matmul_bf16")': 47,
        'if requires_gpu(what="The host<->device copy sweep"):': 75,
        'rows = [': 50,
    },
    'book/03_pytorch_internals.md': {
        'n = pick(cpu=4096, gpu=16384)': 40,
        'counts = perflab.internals.operators.operator_counts()': 31,
        'from perflab.internals.overhead import call_model, dram_copy_bandwidth': 32,
        'for kind, fit in fits.items():': 58,
        'if requires_gpu(what="The caching-allocator experiment"):': 41,
        'def one_linear(x, w, b):': 51,
        'def sigmoid_composite(x):': 33,
        'glue("custom_op_us", op_s * 1e6)': 16,
        'if requires_gpu(what="The unsynchronized-timing experiment"):': 79,
        'if requires_gpu(what="The sync-debug-mode survey"):': 47,
    },
    'book/04_measuring_and_profiling.md': {
        'import json': 41,
        'if interference:': 18,
        'def wall_and_cpu(fn):': 31,
        'first_call_script = WORK / "first_call.py"': 68,
        'small = torch.randn(pick(cpu=2**18, gpu=2**22), device=dev)': 48,
        'from torch.utils import benchmark as tub': 54,
        'rel = lambda k, o: (times[k, o, "event_timer"] / times[k, o, reference': 56,
        'from torch.profiler import ProfilerActivity, profile, record_function,': 59,
        'def profile_steps(step, name, active=2, folder=ART):': 33,
        'from perflab.profiling.trace import regime, short_name, summarize_trac': 39,
        'glue("trace_overhead_idle_fraction", summaries["overhead"].idle_fracti': 33,
        'from perflab.speed import datamovement': 50,
        'def full_step(fb=fwd_bwd):': 34,
        'def pct(x):': 74,
        'ncu_script = WORK / "ncu_target.py"': 83,
        'nsys = perflab.profiling.profilers.find_nsys()': 55,
        'pipeline_script = WORK / "pipeline.py"': 101,
        'reader_script = WORK / "read_file.py"': 80,
        'util_sentence = ("GPU-Util exists only on an NVIDIA GPU, so nothing wa': 76,
    },
    'book/05_data_loading.md': {
        'import math': 38,
        'dropped = raw_cold < 0.5 * raw_warm': 19,
        'one, many = threads.values()': 21,
        'if dev.type == "cuda":': [26, 16],
    },
    'book/06_single_gpu_speed.md': {
        'ov_batch, ov_steps = pick(cpu=16, gpu=512), pick(cpu=4, gpu=20)': 36,
        'if requires_gpu(what="The free wins"):': 42,
        'sync_steps = pick(cpu=3, gpu=50)': 51,
        'RUNGS = ("naive", "no per-step sync", "uint8 over the bus",': 45,
        'steps, ladder_batch = pick(cpu=4, gpu=200), pick(cpu=16, gpu=128)': 39,
        'rows, hits = [], 0': 36,
    },
    'book/07_single_gpu_memory.md': {
        'import copy': 37,
        'def exact(n):': 16,
        'snap_params = param_count(snap_cfg)': 19,
        'glue("snapshot_activation_predicted_mib", snap_act["total"] / MiB)': 20,
        'del hx, h4': 17,
        'if on_gpu:': 23,
        'glue("ladder_batch", ladder_batch)': 21,
    },
    'book/08_distributed_training.md': {
        'W, D = sized(cpu=512, gpu=8192, ci=256), 8  # the Linear stack': 38,
        'mv, sm = res["manual_vs_ddp"], res["ddp_small"]': 16,
        'glue("hang_timeout_s", hang_timeout)': 16,
        'blocks_bwd = 2 / 3 * block_flops / rate': 17,
        'on_nccl = backend == "nccl"': 31,
    },
    'book/09_advanced_optimizations.md': {
        'init = torch.cat([p.detach().flatten() for p in init_model.parameters(': 41,
        'import cProfile': 79,
        'def profile_groups(fn, calls=50):': 61,
        'if dev.type == "cuda":': 36,
    },
    'book/10_gpt2_case_study.md': {
        'own = {p: ceil.value(k) for p, k in (("fp32", "matmul_fp32"),': 24,
        'def ratio(a, b):': 47,
        'if on_gpu:': [48, 40],
        'if requires_gpu(what="The FP8 crossover", capability=(8, 9),': 41,
    },
    'book/roofline_explorer.md': {
        'small = next(pt for pt in here.points': 29,
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
        'ref_path = Path("../book/02_hardware.ipynb")': 34,
    },
    'labs/03_internals.md': {
        'def snippet_a(x):': 40,
        'perflab.labs.lab03.check_function_class(SiLU)   # a torch.autograd.Fun': 52,
        'def make_problem(seed=0):': 35,
        'def train_fast(model, opt, xs, ys):': 17,
        'fast_model, slow_model = copy.deepcopy(model), copy.deepcopy(model)': 115,
        'ref_path = Path("../book/03_pytorch_internals.ipynb")': 31,
    },
    'labs/04_profiling.md': {
        'from torch.profiler import ProfilerActivity, profile, schedule': 22,
        'from perflab.profiling.trace import count_cost, regime, summarize_trac': 38,
        'ref_path = Path("../book/04_measuring_and_profiling.ipynb")': 45,
    },
    'labs/05_data_loading.md': {
        'ref_path = Path("../book/05_data_loading.ipynb")': 33,
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
