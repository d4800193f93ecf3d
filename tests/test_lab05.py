"""Lab 5: each check accepts the reference solution and rejects a plausible wrong one, and the lab
runs under every start method of worker processes and without ``os.sched_getaffinity``.

The lab's own set-up and solution cells run here on CPU sizes, with the data built under
pytest's tmp_path (PERFLAB_DATA_DIR)."""

import json
import multiprocessing
import os
import sys
from pathlib import Path

import jupytext
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from perflab.loading import loaders, measure, storage, transforms
from perflab.labs import lab05
from perflab.record import runs
from perflab.labs.exercises import ExerciseFailed

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "05_data_loading.md"
sys.path.insert(0, str(ROOT / "tests"))

from lab_cells import code_cell as _cell, run_reference_cell  # noqa: E402

METHODS = [m for m in ("spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab's set-up, its given code and its solution cells, executed on CPU sizes."""
    old = os.environ.get("PERFLAB_DATA_DIR")
    os.environ["PERFLAB_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    os.environ["PERFLAB_FORCE_CPU_SIZES"] = "1"
    nb = jupytext.read(LAB)
    ns: dict = {}
    for needle in ("cores = usable_cores()", "def make_slow_loader", "make_fast_loader = None",
                   "total_threads = None", "def make_loader", "curve = None",
                   "memmap_path = None"):
        exec(compile(_cell(nb, needle), f"<lab5 cell {needle}>", "exec"), ns)
    yield ns
    os.environ.pop("PERFLAB_FORCE_CPU_SIZES")
    if old is None:
        os.environ.pop("PERFLAB_DATA_DIR")
    else:
        os.environ["PERFLAB_DATA_DIR"] = old


def test_ex1_probe_rejects_workers_sizes_no_normalization_no_crop_no_shuffle(lab, tmp_path):
    """Each plausible shortcut fails on the probe folder; the reference passes at >= 4x."""
    F = torch.nn.functional
    slow, make_slow, files = lab["slow_loader"], lab["make_slow_loader"], lab["files"]

    def fast_with(collate=None, sampler=SequentialSampler, workers=0):
        def make(fs, folder):
            mm = storage.MemmapImages(storage.write_memmap(fs, folder / "w.u8", side=72))
            order = torch.utils.data.RandomSampler(mm) if sampler is None else sampler(mm)
            return DataLoader(mm, batch_size=None, num_workers=workers,
                              collate_fn=collate or transforms.AugmentBatch(64),
                              sampler=torch.utils.data.BatchSampler(order, 32, drop_last=True))
        return make

    cases = [
        (fast_with(sampler=None, workers=2), "num_workers=2"),
        (fast_with(transforms.AugmentBatch(32), sampler=None), "same crops"),
        (fast_with(lambda b: (F.interpolate(b[0].float(), size=64) / 255, b[1]), None),
         "not normalized"),
        (fast_with(lambda b: ((F.interpolate(b[0].float(), size=64) / 255 - 0.45) / 0.226,
                              b[1]), None), "crops every image the same way"),
        (fast_with(), "same order every epoch"),                   # no shuffle
    ]
    for make, message in cases:
        with pytest.raises(ExerciseFailed, match=message):
            lab05.check_loader_speedup(slow, make, files, make_slow)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab05.check_loader_speedup(slow, None, files, make_slow)
    # the reference solution: ~10-50x on one thread, far from the 4x line
    assert lab05.check_loader_speedup(slow, lab["make_fast_loader"], files,
                                      make_slow)["speedup"] >= 4


def test_ex1_the_slow_loader_passes_its_own_probe(tmp_path, lab):
    probe = lab05.make_probe_folder(tmp_path)
    props = lab05.probe_properties(lab["make_slow_loader"](probe))
    lab05._check_probe(props, props)                    # normalized, cropped, flipped, shuffled
    assert props["red_left"] > 0 and props["red_right"] > 0


def _omp_env(worker_id):
    lab05.tuned_init(worker_id)
    os.environ["OMP_NUM_THREADS"] = "1"   # too late: torch's pool is already sized


def _no_tuned(worker_id):
    torch.set_num_threads(1)


def test_ex2_rejects_a_wrong_count_an_environment_fix_and_a_dropped_init(lab):
    expected = 2 * (os.cpu_count() or 1)
    with pytest.raises(ExerciseFailed, match="total_threads is 2"):
        lab05.check_oversubscription(2, lab05.tuned_init, lab["fixed_init"])
    with pytest.raises(ExerciseFailed, match="still call"):
        lab05.check_oversubscription(expected, lab05.tuned_init, _no_tuned)
    if expected > 2:  # a one-core machine cannot oversubscribe
        with pytest.raises(ExerciseFailed, match="still run"):
            lab05.check_oversubscription(expected, lab05.tuned_init, _omp_env)
    assert lab["total_threads"] == expected
    threads = torch.get_num_threads()
    assert lab05.check_oversubscription(lab["total_threads"], lab05.tuned_init, lab["fixed_init"])
    assert torch.get_num_threads() == threads                # the check restores it


def test_ex3_rejects_the_most_workers_on_a_flat_curve_and_a_partial_curve():
    flat = {0: 100.0, 1: 380.0, 2: 700.0, 4: 1300.0, 8: 1340.0, 16: 1350.0}
    assert lab05.rule_of_thumb_workers(flat) == 4
    with pytest.raises(ExerciseFailed, match="already at 4 workers"):
        lab05.check_num_workers(flat, 16, cores=16)
    with pytest.raises(ExerciseFailed, match="from num_workers=0"):
        lab05.check_num_workers({1: 1.0, 2: 2.0, 8: 3.0}, 8, cores=16)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab05.check_num_workers(None, None, cores=16)
    assert lab05.check_num_workers(flat, 4, cores=16) == 4


def test_ex3_solution_follows_the_rule(lab):
    assert lab["best_workers"] == lab05.rule_of_thumb_workers(lab["curve"])
    assert lab05.check_num_workers(lab["curve"], lab["best_workers"], lab["cores"]) is not None


def test_ex3_rejects_a_curve_the_check_cannot_measure_again(lab):
    """A curve sketched from linear scaling (or timed with the start-up burst) is a self-
    consistent dict the rule accepts; the check's own measurement of two points does not."""
    curve, cores, files, batch = lab["curve"], lab["cores"], lab["files"], lab["ex3_batch"]
    assert lab05.check_num_workers(curve, lab["best_workers"], cores, files=files, batch=batch)
    sketched = {n: curve[1] * max(n, 1) * 3 for n in curve}    # far above what was measured
    with pytest.raises(ExerciseFailed, match="measured again here"):
        lab05.check_num_workers(sketched, lab05.rule_of_thumb_workers(sketched), cores,
                                files=files, batch=batch)
    # the 5 Dec H200 curve's shape: the all-cores point timed over batches built ahead, 82,216
    # images/s where the loader reaches about 6,000 (13.6x), the rest measured
    queued = {**curve, cores: curve[cores] * 82216 / 6044}
    with pytest.raises(ExerciseFailed, match=f"with {cores} worker"):
        lab05.check_num_workers(queued, lab05.rule_of_thumb_workers(queued), cores,
                                files=files, batch=batch)
    with pytest.raises(ValueError, match="files is empty"):
        lab05.remeasure([], 2)


def test_ex3_loaders_time_the_same_whole_rounds_at_every_count(lab):
    """make_loader(n) and the check's loader read the same files: a round skipped at each end
    and EX3_ROUNDS whole rounds timed, whatever n (the files repeat where they run out)."""
    files, batch = lab["files"], lab["ex3_batch"]
    for n in (0, 1, 2, 16):
        loader = lab["make_loader"](n)
        want = lab05.ex3_files(files, n, batch)
        assert loader.dataset.files == want and loader.batch_size == batch
        assert len(loader) == max(1, n) * (lab05.EX3_ROUNDS + 2)
    assert len(set(lab05.ex3_files(files, 16, batch))) == len(files)   # repeated
    with pytest.raises(ValueError, match="workers"):
        lab05.ex3_files(files, -1, batch)


def test_ex4_rejects_a_channels_first_file_and_a_short_one(lab, tmp_path):
    files = lab["files"]
    wrong = tmp_path / "chw.u8"
    arr = np.stack([transforms.decode_resized(f, 144).transpose(2, 0, 1) for f in files])
    arr.tofile(wrong)
    Path(f"{wrong}.json").write_text(json.dumps({"shape": [len(files), 144, 144, 3],
                                                 "labels": [0] * len(files)}))
    with pytest.raises(ExerciseFailed, match="NHWC"):
        lab05.check_storage_conversion(wrong, files, 144)
    with pytest.raises(ExerciseFailed, match="uint8"):
        lab05.check_storage_conversion(lab["memmap_path"], files[:-1], 144)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab05.check_storage_conversion(None, files, 144)
    assert lab05.check_storage_conversion(lab["memmap_path"], files, 144) >= 3


@pytest.mark.parametrize("method", METHODS)
def test_the_labs_worker_code_runs_under(method, lab):
    """What lab 5 sends to workers comes from modules: it runs under spawn and forkserver."""
    counts = loaders.worker_thread_counts(2, lab05.tuned_init, multiprocessing_context=method)
    assert set(counts.values()) == {os.cpu_count() or 1}
    loader = DataLoader(storage.JpegFolder(files=lab["files"][:96]), batch_size=16, num_workers=2,
                        worker_init_fn=loaders.seed_worker, multiprocessing_context=method)
    assert measure.loader_rate(loader)["images"] == 2 * 16     # 6 batches, a round of 2 at each end


@pytest.mark.alone   # lab 5's checks time DataLoader workers against the cores (tests/background.py)
def test_the_whole_lab_runs_under_spawn_without_sched_getaffinity(tmp_path):
    """macOS and Windows: spawn is the default start method and os has no sched_getaffinity.
    The lab, reference solution and checks included, runs in a kernel set up that way."""
    sys.path.insert(0, str(ROOT / "tests"))
    from lab_runs import Kernel  # noqa: E402 (test helper: a Jupyter kernel)

    env = dict(os.environ, PERFLAB_DATA_DIR=str(tmp_path), PERFLAB_FORCE_CPU_SIZES="1")
    kernel = Kernel(runs.home(LAB), env=env)
    try:
        kernel.run("import multiprocessing, os\n"
                   "multiprocessing.set_start_method('spawn', force=True)\n"
                   "del os.sched_getaffinity\n" if hasattr(os, "sched_getaffinity") else
                   "import multiprocessing\n"
                   "multiprocessing.set_start_method('spawn', force=True)\n")
        for cell in jupytext.read(LAB).cells:
            if cell.cell_type == "code":
                assert kernel.run(cell.source) is None, cell.source[:60]
        assert kernel.run("assert multiprocessing.get_start_method() == 'spawn'\n"
                          "assert not hasattr(os, 'sched_getaffinity')") is None
    finally:
        kernel.close()


@pytest.mark.parametrize("reference_run", [True, False])
def test_the_reference_run_compares_with_itself_not_with_an_earlier_run(reference_run, monkeypatch):
    """Reviews F18/F20: executed as the reference run (execute.py sets PERFLAB_REFERENCE_RUN),
    the closing table's reference column is this run's own numbers; anywhere else it reads the
    committed reference notebook."""
    ns = run_reference_cell(jupytext.read(LAB), monkeypatch, reference_run,
                            {"lab05_jpeg_rate": 1.0},
                            {"jpeg_rate": 300.0, "read_speedup": 40.0, "scaling": None})
    if reference_run:
        assert ns["ref"]["lab05_jpeg_rate"] == 300.0 and ns["run"] is None
    else:
        assert ns["ref"] == {"lab05_jpeg_rate": 1.0} and ns["run"]["git"] == "0" * 40
