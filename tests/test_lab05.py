"""Lab 5: each check accepts the reference solution and rejects a plausible wrong one.

The lab's own set-up and solution cells run here on CPU sizes, with the data built under
pytest's tmp_path (PERFLAB_DATA_DIR)."""

import json
import os
from pathlib import Path

import jupytext
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from perflab.loading import datasets as ds
from perflab.labs import lab05 as lc
from perflab.labs.exercises import ExerciseFailed

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "05_data_loading.md"


from lab_cells import code_cell as _cell  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab's set-up, its given code and its solution cells, executed on CPU sizes."""
    old = os.environ.get("PERFLAB_DATA_DIR")
    os.environ["PERFLAB_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    os.environ["PERFLAB_FORCE_CPU_SIZES"] = "1"
    nb = jupytext.read(LAB)
    ns: dict = {}
    for needle in ("cores = len(", "slow_loader = DataLoader(", "fast_loader = None",
                   "def tuned_init", "total_threads = None", "def make_loader",
                   "curve = None", "memmap_path = None"):
        exec(compile(_cell(nb, needle), f"<lab5 cell {needle}>", "exec"), ns)
    yield ns
    os.environ.pop("PERFLAB_FORCE_CPU_SIZES")
    if old is None:
        os.environ.pop("PERFLAB_DATA_DIR")
    else:
        os.environ["PERFLAB_DATA_DIR"] = old


def test_ex1_rejects_more_workers_and_other_shapes_and_accepts_the_batched_memmap(lab):
    slow = lab["slow_loader"]
    with_workers = DataLoader(slow.dataset, batch_size=32, num_workers=2)
    with pytest.raises(ExerciseFailed, match="num_workers=2"):
        lc.check_loader_speedup(slow, with_workers)
    mm, fast = lab["mm"], lab["fast_loader"]
    wrong_size = DataLoader(mm, batch_size=None, collate_fn=ds.AugmentBatch(32),
                            sampler=fast.sampler)
    with pytest.raises(ExerciseFailed, match="same crops"):
        lc.check_loader_speedup(slow, wrong_size)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lc.check_loader_speedup(slow, None)
    # the reference solution: ~10-50x on one thread, far from the 4x line
    assert lc.check_loader_speedup(slow, fast)["speedup"] >= 4


def _omp_env(worker_id):
    _tuned_everywhere(worker_id)
    os.environ["OMP_NUM_THREADS"] = "1"   # too late: torch's pool is already sized


def test_ex2_rejects_a_wrong_count_and_an_environment_fix(lab):
    tuned = lab["tuned_init"]
    expected = 2 * (os.cpu_count() or 1)
    with pytest.raises(ExerciseFailed, match="total_threads is 2"):
        lc.check_oversubscription(2, tuned, lab["fixed_init"])
    if expected > 2:  # a one-core machine cannot oversubscribe
        with pytest.raises(ExerciseFailed, match="still run"):
            lc.check_oversubscription(expected, _tuned_everywhere, _omp_env)
    assert lab["total_threads"] == expected
    assert lc.check_oversubscription(lab["total_threads"], tuned, lab["fixed_init"])


def _tuned_everywhere(worker_id):
    torch.set_num_threads(os.cpu_count())


def test_ex3_rejects_the_most_workers_on_a_flat_curve_and_a_partial_curve():
    flat = {0: 100.0, 1: 380.0, 2: 700.0, 4: 1300.0, 8: 1340.0, 16: 1350.0}
    assert lc.rule_of_thumb_workers(flat) == 4
    with pytest.raises(ExerciseFailed, match="already at 4 workers"):
        lc.check_num_workers(flat, 16, cores=16)
    with pytest.raises(ExerciseFailed, match="from num_workers=0"):
        lc.check_num_workers({1: 1.0, 2: 2.0, 8: 3.0}, 8, cores=16)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lc.check_num_workers(None, None, cores=16)
    assert lc.check_num_workers(flat, 4, cores=16) == 4


def test_ex3_solution_follows_the_rule(lab):
    assert lab["best_workers"] == lc.rule_of_thumb_workers(lab["curve"])
    assert lc.check_num_workers(lab["curve"], lab["best_workers"], lab["cores"]) is not None


def test_ex4_rejects_a_channels_first_file_and_a_format_that_is_not_faster(lab, tmp_path):
    files = lab["files"]
    wrong = tmp_path / "chw.u8"
    arr = np.stack([ds.decode_resized(f, 72).transpose(2, 0, 1) for f in files])
    arr.tofile(wrong)
    Path(f"{wrong}.json").write_text(json.dumps({"shape": [len(files), 72, 72, 3],
                                                 "labels": [0] * len(files)}))
    with pytest.raises(ExerciseFailed, match="NHWC"):
        lc.check_storage_conversion(wrong, files, 72, 100.0, 10_000.0)
    with pytest.raises(ExerciseFailed, match="below the required 3"):
        lc.check_storage_conversion(lab["memmap_path"], files, 72, 100.0, 150.0)
    with pytest.raises(ExerciseFailed, match="uint8"):
        lc.check_storage_conversion(lab["memmap_path"], files[:-1], 72, 100.0, 1e4)
    assert lc.check_storage_conversion(lab["memmap_path"], files, 72, lab["jpeg_rate"],
                                       lab["memmap_rate"]) >= 3
