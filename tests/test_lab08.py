"""Lab 8 (the revised source waiting in pending/labs/): its student version is valid Python, and
each check rejects a wrong answer and accepts the lab's own solution, on 2, 3 and 4 ranks (the
code checks on real gloo launches, the others on numbers)."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest

from perflab.distributed import training
from perflab.labs import lab08
from perflab.labs.exercises import ExerciseFailed
from perflab.core.device import gpu_count

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "pending" / "labs" / "08_distributed.md"
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402
from lab_cells import code_cell  # noqa: E402


def _cell(needle):
    return code_cell(jupytext.read(LAB), needle)


def test_student_version_is_valid_python_and_stubs_refuse_to_launch(tmp_path):
    assert make_student.main([str(LAB), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / "08_distributed.ipynb")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)
    stub = make_student.strip_code(_cell("def allreduce_gradients"))
    assert "not_done(" in stub
    with pytest.raises(ExerciseFailed, match="Exercise 1 is not done yet"):
        lab08.lab_launch(1, [], user_code=[stub])


WRONG_ALLREDUCE = '''
def allreduce_sum(model):  # forgets to divide by the world size
    for p in model.parameters():
        dist.all_reduce(p.grad)
'''

WRONG_OPTIMIZER = '''
def make_plain_adam(params):  # every rank keeps all of Adam's state
    return torch.optim.Adam(params, lr=1e-3)
'''

UNSENT_SHARDS = '''
def make_half_adam(params):  # this rank's share of the parameters, never sent to the others
    mine = [p for i, p in enumerate(params)   # its own layers (weight and bias)
            if (i // 2) % dist.get_world_size() == dist.get_rank()]
    return torch.optim.Adam(mine, lr=1e-3)
'''

AVERAGE_OP = '''
def allreduce_avg(model):  # right on NCCL; gloo has no AVG (the worker sums and divides)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
'''


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU (gloo) path")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_code_checks_on_gloo_processes(n):
    solution = _cell("def allreduce_gradients")
    optimizer = _cell("def make_optimizer").split("\n\n\n### BEGIN SOLUTION")[0]
    ranks = training.launch([{"name": "user_allreduce", "args": {
                          "fns": ["allreduce_gradients", "allreduce_sum", "allreduce_avg"]}},
                      {"name": "user_optimizer", "args": {
                          "fns": ["make_optimizer", "make_plain_adam", "make_half_adam"]}}],
                     nproc=n, backend="gloo", timeout_s=200, pg_timeout_s=30,
                     user_code=[solution, WRONG_ALLREDUCE, AVERAGE_OP, optimizer,
                                WRONG_OPTIMIZER, UNSENT_SHARDS])
    ar = ranks[0]["results"]["user_allreduce"]
    assert lab08.check_manual_allreduce(ar["allreduce_gradients"])
    assert lab08.check_manual_allreduce(ar["allreduce_avg"])
    with pytest.raises(ExerciseFailed, match="averages"):
        lab08.check_manual_allreduce(ar["allreduce_sum"])
    opt = [r["results"]["user_optimizer"] for r in ranks]
    params = opt[0]["make_optimizer"]["params"]
    assert params == 8 * (32 * 32 + 32)

    def state(name):
        return [o[name]["state_bytes"] for o in opt]

    assert lab08.check_sharded_optimizer(state("make_optimizer"), params, 8 * params / n,
                                         rank_spread=opt[0]["make_optimizer"]["rank_spread"])
    with pytest.raises(ExerciseFailed, match="not sharded"):
        lab08.check_sharded_optimizer(state("make_plain_adam"), params, 8 * params)
    with pytest.raises(ExerciseFailed, match="predicted"):  # sharded, but a prediction of 8 P
        lab08.check_sharded_optimizer(state("make_optimizer"), params, 8 * params)
    half = state("make_half_adam")
    with pytest.raises(ExerciseFailed, match="different models"):
        lab08.check_sharded_optimizer(half, params, sum(half) / n,
                                      rank_spread=opt[0]["make_half_adam"]["rank_spread"])


def test_allreduce_model_check_holds_for_every_world_size():
    ns = {}
    exec(_cell("def allreduce_model").split("\n\n\n### BEGIN SOLUTION")[0], ns)
    assert lab08.check_allreduce_model(ns["allreduce_model"])
    with pytest.raises(ExerciseFailed, match="bus factor"):    # right on 2 ranks only
        lab08.check_allreduce_model(lambda s, bw, n, a: a + s / bw)
    with pytest.raises(ExerciseFailed, match="on 2 ranks"):    # all-gather's factor
        lab08.check_allreduce_model(lambda s, bw, n, a: a + s * (n - 1) / n / bw)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab08.check_allreduce_model(None)


def test_comm_prediction_check():
    sweep = [{"nbytes": 4096, "seconds": 50e-6, "busbw": 0.08e9},
             {"nbytes": 2**20, "seconds": 1e-3, "busbw": 1.0e9},
             {"nbytes": 2**24, "seconds": 14e-3, "busbw": 1.2e9}]
    ns = {"sweep": sweep, "P_model": 1_250_000, "nproc": 2, "predicted_s": None}
    from perflab.distributed import collectives
    exec(_cell("S = 4 * P_model"), ns)
    measured = 4 * 1_250_000 / 1.15e9 + 50e-6
    assert lab08.check_comm_prediction(ns["predicted_s"], measured)
    wrong = collectives.allreduce_time(1_250_000, 1.2e9, 2, 50e-6)  # parameters, not bytes
    with pytest.raises(ExerciseFailed, match="count bytes"):
        lab08.check_comm_prediction(wrong, measured)
    with pytest.raises(ExerciseFailed, match="no answer"):
        lab08.check_comm_prediction(None, measured)


def test_bucket_choice_check():
    step_s = {0.002: 0.030, 0.016: 0.012, 0.25: 0.0115, 2.0: 0.016}
    sweep = [{"nbytes": 4096, "seconds": 50e-6, "busbw": 0.08e9},
             {"nbytes": 2**24, "seconds": 14e-3, "busbw": 1.2e9}]
    ns = {"step_s": step_s, "sweep": sweep, "nproc": 2,
          "bk": {"grad_bytes": 4 * 100_000}}
    exec(_cell("bucket_choice_mb = min("), ns)
    want = lab08.best_bucket_bytes(50e-6, 4e5, 1.2e9, 2) / 2**20
    assert lab08.check_bucket_choice(ns["bucket_choice_mb"], step_s,
                                     predicted_mb=ns["predicted_best_mb"], expected_mb=want)
    with pytest.raises(ExerciseFailed, match="balance at"):
        lab08.check_bucket_choice(0.25, step_s, predicted_mb=100 * want, expected_mb=want)
    flat = {1.0: 0.0100, 5.0: 0.0104, 25.0: 0.0102}   # a 4 % spread: only near-best passes
    with pytest.raises(ExerciseFailed, match="fastest"):
        lab08.check_bucket_choice(5.0, flat)
    assert lab08.check_bucket_choice(0.016, step_s)          # within 10 % of the best
    with pytest.raises(ExerciseFailed, match="fastest"):
        lab08.check_bucket_choice(0.002, step_s)             # the smallest bucket: latency-bound
    with pytest.raises(ExerciseFailed, match="not measured"):
        lab08.check_bucket_choice(25, step_s)
