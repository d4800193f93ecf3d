"""Lab 8: its student version is valid Python, and each check rejects a wrong answer and accepts
the lab's own solution (the code checks on real gloo launches, the others on numbers)."""

import ast
import sys
from pathlib import Path

import jupytext
import pytest

from perflab.distributed import training as P
from perflab.labs import lab08
from perflab.labs.exercises import ExerciseFailed
from perflab.core.device import gpu_count

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "08_distributed.md"
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
        P.lab_launch(1, [], user_code=[stub])


WRONG_ALLREDUCE = '''
def allreduce_sum(model):  # forgets to divide by the world size
    for p in model.parameters():
        dist.all_reduce(p.grad)
'''

WRONG_OPTIMIZER = '''
def make_plain_adam(params):  # every rank keeps all of Adam's state
    return torch.optim.Adam(params, lr=1e-3)
'''


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU (gloo) path")
def test_code_checks_on_two_gloo_processes():
    solution = _cell("def allreduce_gradients")
    optimizer = _cell("def make_optimizer").split("\n\n\n### BEGIN SOLUTION")[0]
    ranks = P.launch([{"name": "user_allreduce", "args": {"fns": ["allreduce_gradients", "allreduce_sum"]}},
                      {"name": "user_optimizer", "args": {"fns": ["make_optimizer", "make_plain_adam"]}}],
                     nproc=2, backend="gloo", timeout_s=150, pg_timeout_s=30,
                     user_code=[solution, WRONG_ALLREDUCE, optimizer, WRONG_OPTIMIZER])
    ar = ranks[0]["results"]["user_allreduce"]
    assert lab08.check_manual_allreduce(ar["allreduce_gradients"])
    with pytest.raises(ExerciseFailed, match="averages"):
        lab08.check_manual_allreduce(ar["allreduce_sum"])
    opt = [r["results"]["user_optimizer"] for r in ranks]
    params = opt[0]["make_optimizer"]["params"]
    assert params == 8 * (32 * 32 + 32)
    right = [o["make_optimizer"]["state_bytes"] for o in opt]
    wrong = [o["make_plain_adam"]["state_bytes"] for o in opt]
    assert lab08.check_sharded_optimizer(right, params, 8 * params / 2)
    with pytest.raises(ExerciseFailed, match="not sharded"):
        lab08.check_sharded_optimizer(wrong, params, 8 * params)
    with pytest.raises(ExerciseFailed, match="predicted"):  # sharded, but a prediction of 8 P
        lab08.check_sharded_optimizer(right, params, 8 * params)


def test_comm_prediction_check():
    sweep = [{"nbytes": 4096, "seconds": 50e-6, "busbw": 0.08e9},
             {"nbytes": 2**20, "seconds": 1e-3, "busbw": 1.0e9},
             {"nbytes": 2**24, "seconds": 14e-3, "busbw": 1.2e9}]
    ns = {"sweep": sweep, "P_model": 1_250_000, "nproc": 2, "predicted_s": None,
          }
    from perflab.distributed import collectives as distributed
    ns["distributed"] = distributed
    exec(_cell("S = 4 * P_model"), ns)
    measured = 4 * 1_250_000 / 1.15e9 + 50e-6
    assert lab08.check_comm_prediction(ns["predicted_s"], measured)
    wrong = distributed.allreduce_time(1_250_000, 1.2e9, 2, 50e-6)  # parameters, not bytes
    with pytest.raises(ExerciseFailed, match="count bytes"):
        lab08.check_comm_prediction(wrong, measured)
    with pytest.raises(ExerciseFailed, match="no answer"):
        lab08.check_comm_prediction(None, measured)


def test_bucket_choice_check():
    step_s = {0.002: 0.030, 0.016: 0.012, 0.25: 0.0115, 2.0: 0.016}
    ns = {"step_s": step_s}
    exec(_cell("bucket_choice_mb = min("), ns)
    assert lab08.check_bucket_choice(ns["bucket_choice_mb"], step_s)
    assert lab08.check_bucket_choice(0.016, step_s)          # within 10 % of the best
    with pytest.raises(ExerciseFailed, match="fastest"):
        lab08.check_bucket_choice(0.002, step_s)             # the smallest bucket: latency-bound
    with pytest.raises(ExerciseFailed, match="not measured"):
        lab08.check_bucket_choice(25, step_s)
