"""Lab 8: its student version is valid Python, and each check rejects a wrong answer and accepts
the lab's own solution, on 2, 3 and 4 ranks, the all-reduce model also on 8 (the code checks on
real gloo launches, the others on numbers); the reference run uses 4 gloo ranks (2 on a host of
fewer than 8 cores)."""

import ast
import statistics
import sys
from pathlib import Path

import jupytext
import pytest

from perflab.distributed import costs
from perflab.distributed.launch import launch
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
def allreduce_avg(model):  # right on NCCL, and on gloo from PyTorch 2.8: nothing is patched
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
'''

FROZEN_HALF = '''
def make_half_adam_synced(params):  # this rank's share stepped, then rank 0's copy everywhere
    params = list(params)
    mine = [p for i, p in enumerate(params) if (i // 2) % dist.get_world_size() == dist.get_rank()]
    inner = torch.optim.Adam(mine, lr=1e-3)

    class Synced:
        state = inner.state

        def zero_grad(self):
            inner.zero_grad()

        def step(self):
            inner.step()
            for p in params:
                dist.broadcast(p.data, src=0)
    return Synced()
'''

PART_ADAM = '''
def make_part_adam(params):  # Adam over half of the parameters, the same half on every rank
    params = list(params)
    return torch.optim.Adam(params[:len(params) // 2], lr=1e-3)
'''

ZERO_ADAMW = '''
def make_zero_adamw(params):  # sharded right, but AdamW: weight decay 0.01 moves the model
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)
'''

STRIDED_ADAM = '''
def make_strided_adam(params):  # every world-th tensor: weights and biases alternate
    params = list(params)
    return torch.optim.Adam(params[dist.get_rank()::dist.get_world_size()], lr=1e-3)
'''

SAME_BATCH = '''
def indices_same(n, rank, world, epoch):  # ignores the rank: every rank reads one slice
    g = torch.Generator().manual_seed(1000 + epoch)
    return torch.randperm(n, generator=g).tolist()[:n // world]
'''

NO_EPOCH = '''
def indices_no_epoch(n, rank, world, epoch):  # set_epoch forgotten: one order for ever
    g = torch.Generator().manual_seed(1000)
    order = torch.randperm(n, generator=g).tolist()
    return (order + order[:-(-n // world) * world - n])[rank::world]
'''


@pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU (gloo) path")
@pytest.mark.parametrize("n", [2, 4])
def test_code_checks_on_gloo_processes(n):
    """Every wrong function of exercises 1, 4 and 5 fails its check on the ranks of CI (2) and
    of the reference run (4 gloo ranks), all of them in one launch per world size."""
    solution = _cell("def allreduce_gradients")
    optimizer = _cell("def make_optimizer").split("\n\n\n### BEGIN SOLUTION")[0]
    sampler = _cell("def indices_for")
    ranks = launch([{"name": "user_allreduce", "args": {
                        "fns": ["allreduce_gradients", "allreduce_sum", "allreduce_avg"]}},
                    {"name": "user_optimizer", "args": {
                        "fns": ["make_optimizer", "make_plain_adam", "make_half_adam",
                                "make_half_adam_synced", "make_part_adam", "make_zero_adamw",
                                "make_strided_adam"]}},
                    {"name": "user_sampler", "args": {
                        "fns": ["indices_for", "indices_same", "indices_no_epoch"], "n": 63}}],
                   nproc=n, backend="gloo", timeout_s=200, pg_timeout_s=30,
                   user_code=[solution, WRONG_ALLREDUCE, AVERAGE_OP, optimizer, WRONG_OPTIMIZER,
                              UNSENT_SHARDS, FROZEN_HALF, PART_ADAM, ZERO_ADAMW, STRIDED_ADAM, sampler, SAME_BATCH, NO_EPOCH])
    ar = ranks[0]["results"]["user_allreduce"]
    assert lab08.check_manual_allreduce(ar["allreduce_gradients"])
    assert lab08.check_manual_allreduce(ar["allreduce_avg"])
    with pytest.raises(ExerciseFailed, match="averages"):
        lab08.check_manual_allreduce(ar["allreduce_sum"])
    opt = [r["results"]["user_optimizer"] for r in ranks]
    params = opt[0]["make_optimizer"]["params"]
    assert params == 8 * (32 * 32 + 32)

    def check(name, predicted):
        o = opt[0][name]
        return lab08.check_sharded_optimizer([r[name]["state_bytes"] for r in opt], params, predicted,
                                             rank_spread=o["rank_spread"], vs_reference=o["vs_reference"],
                                             settings=o["settings"])

    assert check("make_optimizer", 8 * params / n)
    assert opt[0]["make_optimizer"]["vs_reference"] < 1e-12        # float64: plain Adam's model
    with pytest.raises(ExerciseFailed, match="not sharded"):
        check("make_plain_adam", 8 * params)
    with pytest.raises(ExerciseFailed, match="predicted"):  # sharded, but a prediction of 8 P
        check("make_optimizer", 8 * params)
    half = sum(r["make_half_adam"]["state_bytes"] for r in opt) / n
    with pytest.raises(ExerciseFailed, match="different models"):
        check("make_half_adam", half)
    # the ranks agree (rank 0's copy everywhere), and train a model half of which never moves
    synced = sum(r["make_half_adam_synced"]["state_bytes"] for r in opt) / n
    assert opt[0]["make_half_adam_synced"]["rank_spread"] == 0.0
    with pytest.raises(ExerciseFailed, match="another model.*stepped by no rank"):
        check("make_half_adam_synced", synced)
    # Adam over half the parameters on every rank: the ranks agree, and on 2 ranks the bytes add
    # up to 8 P as a sharded optimizer's do; only the model it trains tells it from one
    part = sum(r["make_part_adam"]["state_bytes"] for r in opt) / n
    assert opt[0]["make_part_adam"]["rank_spread"] == 0.0
    with pytest.raises(ExerciseFailed, match="another model" if n == 2 else "in all"):
        check("make_part_adam", part)
    # ZeRO over AdamW: sharded, the ranks agree, the bytes are right; the check names the cause
    # (a student read "stepped by no rank or overwritten" for it)
    assert opt[0]["make_zero_adamw"]["settings"]["class"] == "AdamW"
    with pytest.raises(ExerciseFailed, match=r"AdamW, not Adam, weight_decay 0\.01"):
        check("make_zero_adamw", 8 * params / n)
    # whole tensors dealt by position: on 2 ranks one holds every weight (97 % of the state);
    # the sentence says it is split unevenly, not that it is not sharded; on 4 ranks the ranks
    # hold under the half-way mark and never receive each other's steps
    strided = sum(r["make_strided_adam"]["state_bytes"] for r in opt) / n
    with pytest.raises(ExerciseFailed, match="unevenly" if n == 2 else "different models"):
        check("make_strided_adam", strided)
    dealt = ranks[0]["results"]["user_sampler"]
    assert lab08.check_sampler(dealt["indices_for"])
    with pytest.raises(ExerciseFailed, match="both read"):
        lab08.check_sampler(dealt["indices_same"])
    with pytest.raises(ExerciseFailed, match="set_epoch"):
        lab08.check_sampler(dealt["indices_no_epoch"])


def test_allreduce_model_check_holds_for_every_world_size():
    ns = {}
    exec(_cell("def allreduce_seconds").split("\n\n\n### BEGIN SOLUTION")[0], ns)
    assert lab08.check_allreduce_seconds(ns["allreduce_seconds"])
    assert lab08.check_allreduce_seconds(costs.allreduce_seconds)      # the chapter's own
    with pytest.raises(ExerciseFailed, match="bus factor"):    # right on 2 ranks only
        lab08.check_allreduce_seconds(lambda s, bw, n, a=0.0: a + s / bw)
    with pytest.raises(ExerciseFailed, match="on 2 ranks"):    # all-gather's factor
        lab08.check_allreduce_seconds(lambda s, bw, n, a=0.0: a + s * (n - 1) / n / bw)
    with pytest.raises(ExerciseFailed, match="alpha=0.0"):     # no default: exercise 6 needs one
        lab08.check_allreduce_seconds(lambda s, bw, n, a: a + s * 2 * (n - 1) / n / bw)
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab08.check_allreduce_seconds(None)


def test_allreduce_model_check_rejects_a_bus_factor_right_only_where_the_student_ran():
    """A model with the bus factor looked up for the world sizes the lab's machines give (2, 3
    and 4 gloo ranks) and none beyond is right on 2, 3 and 4 ranks: only the check's 8 ranks,
    where chapter 8's eight-GPU prediction lives, can reject it."""
    factors = {2: 1.0, 3: 4 / 3, 4: 1.5}          # 2 (n-1)/n, typed for the ranks run
    table = lambda s, bw, n, a=0.0: a + s * factors.get(n, 1.0) / bw
    for n in (2, 3, 4):
        want = costs.allreduce_seconds(1e8, 100e9, n, 20e-6)
        assert table(1e8, 100e9, n, 20e-6) == pytest.approx(want)
    with pytest.raises(ExerciseFailed, match="on 8 ranks"):
        lab08.check_allreduce_seconds(table)


# the reference run's sweep on 4 gloo ranks (gpu-2026-12-06d-d911c2d): message bytes and seconds;
# its exercise-2 all-reduce of 4 x 1.25M bytes took 2.73 ms
REF_SWEEP = [(4096, 498e-6), (65536, 518e-6), (2**20, 900e-6), (2**22, 2.37e-3), (2**24, 8.87e-3)]
EX2 = "predicted_s = allreduce_seconds(S, busbw_net, nproc, alpha)"
# (what, the slip in exercise 2's solution cell, world sizes at which it is a different number)
EX2_SLIPS = [
    ("no bus factor", (EX2, "predicted_s = alpha + S / busbw_net"), (4,)),
    ("algorithm bandwidth", (EX2, "predicted_s = allreduce_seconds(S, nearest[\"nbytes\"] / (nearest[\"seconds\"]"
                                  " - alpha), nproc, alpha)"), (4,)),
    ("no alpha", (EX2, "predicted_s = allreduce_seconds(S, busbw_net, nproc)"), (2, 4)),
    ("bits", ("S = 4 * P_model", "S = 32 * P_model"), (2, 4)),
    # review of run 07ca410, finding 21: the sweep's busbw (alpha inside it) plus alpha again
    ("alpha twice", (EX2, "predicted_s = allreduce_seconds(S, nearest[\"busbw\"], nproc, alpha)"), (2, 4)),
]


def _ex2(world, slip=None, check=True):
    """Exercise 2's solution and check cells, as the lab runs them, on the reference run's sweep
    timed on ``world`` ranks (bus bandwidth = bytes / seconds x 2 (n-1)/n)."""
    import perflab
    factor = 2 * (world - 1) / world
    sweep = [{"nbytes": b, "seconds": t, "busbw": b / t * factor} for b, t in REF_SWEEP]
    points = sweep + [{"nbytes": 5_000_000, "seconds": 2.73e-3, "busbw": 5e6 / 2.73e-3 * factor}]
    ns = {"sweep": sweep, "points": points, "P_model": 1_250_000, "nproc": world, "predicted_s": None,
          "costs": costs, "lab08": lab08, "perflab": perflab}
    solution = _cell("S = 4 * P_model")
    if slip:
        assert slip[0] in solution
        solution = solution.replace(*slip)
    exec(solution, ns)
    if check:
        exec(_cell("measured_s = next("), ns)
    return ns


@pytest.mark.parametrize("world", [2, 4])
def test_comm_prediction_check_is_the_model_of_the_measured_inputs(world):
    """Exercise 2's prediction is checked against the model of the sweep's own numbers: the
    reference passes on 2 and 4 ranks; the slips fail wherever they give another number, on 4
    ranks (the reference run's) even where, as leaving out the bus factor, they come closer to
    the measured time than the model does (0.87x against 1.22x: a check within 2x of the
    measured time alone passed them)."""
    ns = _ex2(world)
    want = costs.allreduce_seconds(5e6, lab08.net_busbw(ns["near"], 498e-6, world), world, 498e-6)
    assert ns["predicted_s"] == pytest.approx(want, rel=1e-12)
    for what, slip, wrong_at in EX2_SLIPS:
        if world in wrong_at:
            with pytest.raises(ExerciseFailed, match="model of the measured inputs"):
                _ex2(world, slip)
        else:   # on 2 ranks the bus factor is 1: the same number, rightly passed
            assert _ex2(world, slip)["predicted_s"] == pytest.approx(ns["predicted_s"], rel=1e-9), what
    if world == 4:
        slip = _ex2(4, EX2_SLIPS[0][1], check=False)["predicted_s"]
        assert 0.5 < slip / 2.73e-3 < 0.8   # within 2x: the old check passed it
        assert ns["predicted_s"] / 2.73e-3 == pytest.approx(1, abs=0.05)   # alpha net: on it
        with pytest.raises(ExerciseFailed, match="bus factor"):
            _ex2(4, EX2_SLIPS[0][1])
        with pytest.raises(ExerciseFailed, match="alpha twice"):
            _ex2(4, EX2_SLIPS[-1][1])


def test_comm_prediction_check():
    measured = 4 * 1_250_000 / 1.15e9 + 50e-6
    right = costs.allreduce_seconds(5e6, 1.2e9, 2, 50e-6)
    assert lab08.check_comm_prediction(right, measured)
    assert lab08.check_comm_prediction(right, measured, expected_s=right, world=2)
    with pytest.raises(ExerciseFailed, match="count bytes"):     # parameters, not bytes
        lab08.check_comm_prediction(right / 4, measured)
    with pytest.raises(ExerciseFailed, match="bits instead of bytes"):
        lab08.check_comm_prediction(costs.allreduce_seconds(4e7, 1.2e9, 2, 50e-6), measured,
                                    expected_s=right, factor=10)
    with pytest.raises(ExerciseFailed, match="no answer"):
        lab08.check_comm_prediction(None, measured)


def test_comm_prediction_check_reports_a_noisy_measurement_and_judges_the_model(capsys):
    """A loaded CI host ran the reference's 7.21 ms prediction at 3.37 ms (2.14x): the model of
    the measured inputs passes with the ratio said; a wrong model still fails there, and without
    the model to compare with, the factor of 2 still judges."""
    model = 7.21e-3
    assert lab08.check_comm_prediction(model, 3.37e-3, expected_s=model, world=4)
    assert "beyond 2x" in capsys.readouterr().out
    with pytest.raises(ExerciseFailed, match="bus factor"):
        lab08.check_comm_prediction(model / 1.5, 3.37e-3, expected_s=model, world=4)
    with pytest.raises(ExerciseFailed, match="2.14x"):
        lab08.check_comm_prediction(model, 3.37e-3)


def test_exposed_model_check_names_a_wrong_exercise_2_it_calls():
    """A wrong allreduce_seconds of exercise 2 made exercise 3 fail with a sentence that did not
    name exercise 2 (student finding); a wrong exposed() with a right allreduce says what to try."""
    ns = {"allreduce_seconds": lambda b, bw, n, a=0.0: a + b / bw}   # no bus factor
    exec(_cell("def exposed").split("\n\n\n### BEGIN SOLUTION")[0], ns)
    with pytest.raises(ExerciseFailed, match="calls allreduce_seconds of exercise 2, which is wrong.*3 ranks"):
        lab08.check_exposed_model(ns["exposed"], allreduce_fn=ns["allreduce_seconds"])
    ns = {"allreduce_seconds": costs.allreduce_seconds}
    exec(_cell("def exposed").split("\n\n\n### BEGIN SOLUTION")[0].replace(
        "ready = backward_s * done / total", "ready = backward_s"), ns)
    with pytest.raises(ExerciseFailed, match="Try: bucket k is ready") as err:
        lab08.check_exposed_model(ns["exposed"], allreduce_fn=costs.allreduce_seconds)
    assert "exercise 2" not in str(err.value)


def test_sharded_optimizer_messages_say_what_was_wrong_and_what_to_try(capsys):
    """On numbers: the reference passes without printing a byte count (the student edition shows
    its output before the student predicts), and each wrong answer's sentence names its cause."""
    P, n = 8 * (32 * 32 + 32), 2
    full = 8 * P
    assert lab08.check_sharded_optimizer([full / n] * n, P, full / n, rank_spread=0.0, vs_reference=0.0,
                                         settings={"class": "Adam", "lr": 1e-3, "weight_decay": 0})
    out = capsys.readouterr().out
    assert out.startswith("✓ Exercise 4") and f"{full // n:,}" not in out and str(full // n) not in out
    with pytest.raises(ExerciseFailed, match="replicated, not sharded.*ZeroRedundancyOptimizer"):
        lab08.check_sharded_optimizer([full] * n, P, full)
    weights = 8 * 8 * 32 * 32                  # params[0::2]: every weight on rank 0
    with pytest.raises(ExerciseFailed, match=r"unevenly: 65,536 \(97 %\), 2,048 \(3 %\)") as err:
        lab08.check_sharded_optimizer([weights, full - weights], P, full / n)
    assert "not sharded" not in str(err.value)
    with pytest.raises(ExerciseFailed, match=r"AdamW, not Adam, weight_decay 0\.01"):
        lab08.check_sharded_optimizer([full / n] * n, P, full / n, rank_spread=0.0, vs_reference=1e-4,
                                      settings={"class": "AdamW", "lr": 1e-3, "weight_decay": 0.01})
    with pytest.raises(ExerciseFailed, match=r"lr 0\.01, not 0\.001"):
        lab08.check_sharded_optimizer([full / n] * n, P, full / n, rank_spread=0.0, vs_reference=1e-4,
                                      settings={"class": "Adam", "lr": 1e-2, "weight_decay": 0})
    with pytest.raises(ExerciseFailed, match="stepped by no rank"):     # a hand-made class: no settings
        lab08.check_sharded_optimizer([full / n] * n, P, full / n, rank_spread=0.0, vs_reference=1e-4,
                                      settings={})


def test_exposed_model_check_rejects_the_start_up_of_every_bucket():
    ns = {"allreduce_seconds": costs.allreduce_seconds}    # exercise 2's, which it calls
    exec(_cell("def exposed").split("\n\n\n### BEGIN SOLUTION")[0], ns)
    assert lab08.check_exposed_model(ns["exposed"])
    assert lab08.check_exposed_model(costs.exposed_seconds)            # the chapter's own
    # every bucket's start-up exposed, and the last bucket's transfer
    with pytest.raises(ExerciseFailed, match="long backward"):
        lab08.check_exposed_model(lambda b, t, bw, n, a: len(b) * a + b[-1] * 2 * (n - 1) / n / bw)
    # no overlap at all
    with pytest.raises(ExerciseFailed, match="long backward"):
        lab08.check_exposed_model(lambda b, t, bw, n, a: sum(a + x * 2 * (n - 1) / n / bw for x in b))
    # every bucket ready at once when the backward ends: a queue, but no overlap
    with pytest.raises(ExerciseFailed):
        lab08.check_exposed_model(lambda b, t, bw, n, a: lab08.exposed_reference(b, 0.0, bw, n, a))
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab08.check_exposed_model(None)


def _bucket_rounds(n_rounds=9, seed=8):
    """Step times per cap like the reference lab run's 4 gloo ranks (medians 32.7, 34.1, 31.4,
    30.7 and 35.6 ms at 0.0625 to 16 MiB), each round slowed by a drift common to every cap
    (up to 15 %, as its rounds spread) and 1 % of noise of its own."""
    import random
    rng = random.Random(seed)
    medians = {0.0625: 0.0327, 0.25: 0.0341, 1.0: 0.0314, 4.0: 0.0307, 16.0: 0.0356}
    drift = [1 + rng.uniform(0, 0.15) for _ in range(n_rounds)]
    return {mb: [m * d * (1 + rng.gauss(0, 0.01)) for d in drift] for mb, m in medians.items()}


def test_bucket_choice_check_judges_per_round_ratios():
    """Each round divided by its fastest cap: the drift of the rounds cancels, so the caps 2 % to
    16 % behind the fastest are told apart, where the old rule (the choice's fastest round
    against the best cap's slowest) passed every cap but 16 MiB on the reference run and every
    cap on the chapter's."""
    rounds = _bucket_rounds()
    assert lab08.check_bucket_choice(4.0, rounds)                      # the fastest median
    for wrong in (0.0625, 0.25, 16.0):                                 # 6 %, 11 % and 16 % slower
        if wrong != 16.0:                                               # the old rule passed it
            assert min(rounds[wrong]) <= max(rounds[4.0])
        with pytest.raises(ExerciseFailed, match="rounds tell them apart"):
            lab08.check_bucket_choice(wrong, rounds)
    assert lab08.check_bucket_choice(1.0, rounds)                      # 2 %: within 5 %
    # a machine whose rounds cannot tell the caps apart (noise larger than the differences) fails
    # no choice; the cap of the fastest median passes whatever the rounds
    import random
    rng = random.Random(1)
    noisy = {mb: [0.03 * rng.uniform(0.5, 3) for _ in range(9)] for mb in (0.0625, 1.0, 16.0)}
    best = min(noisy, key=lambda mb: statistics.median(noisy[mb]))
    assert lab08.check_bucket_choice(best, noisy)
    for few in (2, 3):                                                  # CI's 2 rounds: min-max
        r = _bucket_rounds(few, seed=few)
        assert lab08.check_bucket_choice(min(r, key=lambda mb: statistics.median(r[mb])), r)
    with pytest.raises(ValueError, match="same number"):
        lab08.check_bucket_choice(1.0, {1.0: [0.1, 0.2], 4.0: [0.1]})


def test_bucket_choice_check_reads_the_rounds():
    rounds = {0.0625: [0.030, 0.031, 0.029], 0.25: [0.012, 0.0125, 0.0118],
              1.0: [0.0115, 0.013, 0.0121], 16.0: [0.016, 0.017, 0.0165]}
    sweep = [{"nbytes": 4096, "seconds": 50e-6, "busbw": 0.08e9},
             {"nbytes": 2**24, "seconds": 14e-3, "busbw": 1.2e9}]
    bk = {"bucket_bytes": {"0.0625": [2**16] * 48, "0.25": [2**18] * 12, "1.0": [2**20] * 3,
                           "16.0": [3 * 2**20]},
          "backward_s": 0.004, "grad_bytes": 3 * 2**20}
    ns = {"rounds_by_mb": rounds, "bk": bk, "nproc": 2, "alpha": 50e-6, "busbw_max": 1.2e9,
          "statistics": statistics, "allreduce_seconds": costs.allreduce_seconds}
    exec(_cell("def exposed"), ns)
    want = min(rounds, key=lambda mb: lab08.exposed_reference(bk["bucket_bytes"][str(mb)], 0.004, 1.2e9,
                                                              2, 50e-6))
    assert ns["predicted_best_mb"] == want
    assert lab08.check_bucket_choice(ns["bucket_choice_mb"], rounds, predicted_mb=ns["predicted_best_mb"],
                                     expected_mb=want)
    assert lab08.check_bucket_choice(0.25, rounds)                 # the rounds cannot tell it from 1.0
    with pytest.raises(ExerciseFailed, match="rounds tell them apart"):
        lab08.check_bucket_choice(16.0, rounds)
    with pytest.raises(ExerciseFailed, match="rounds tell them apart"):
        lab08.check_bucket_choice(0.0625, rounds)               # the smallest bucket: start-up bound
    with pytest.raises(ExerciseFailed, match="not measured"):
        lab08.check_bucket_choice(25, rounds)
    other = next(mb for mb in rounds if mb != want)
    with pytest.raises(ExerciseFailed, match="exposes least"):
        lab08.check_bucket_choice(ns["bucket_choice_mb"], rounds, predicted_mb=other, expected_mb=want)


def test_sampler_check_on_numbers():
    right = {"n": 8, "per_rank": [[[0, 2, 4, 6], [1, 3, 5, 7]], [[7, 5, 3, 1], [6, 4, 2, 0]]]}
    assert lab08.check_sampler(right)
    with pytest.raises(ExerciseFailed, match="both read"):
        lab08.check_sampler({"n": 8, "per_rank": [[[0, 1, 2, 3], [0, 1, 2, 3]]]})
    with pytest.raises(ExerciseFailed, match="every sample"):
        lab08.check_sampler({"n": 8, "per_rank": [[[0, 1], [2, 3]]]})
    with pytest.raises(ExerciseFailed, match="set_epoch"):
        lab08.check_sampler({"n": 8, "per_rank": [right["per_rank"][0]] * 2})
    with pytest.raises(ExerciseFailed, match="not done yet"):
        lab08.check_sampler(None)


def test_sampler_check_takes_distributed_samplers_padding_and_wants_equal_shares():
    """Review L6: with n not a multiple of the world size DistributedSampler pads the shares to
    equal length by repeating samples, which the check rejected as two ranks reading the same
    data; and unequal shares passed. Checked against torch's own sampler."""
    import torch.utils.data as tud

    for n, world in ((10, 4), (7, 3), (64, 4), (9, 2)):
        per_epoch = []
        for epoch in (0, 1):
            ranks = []
            for r in range(world):
                smp = tud.DistributedSampler(range(n), num_replicas=world, rank=r, seed=3)
                smp.set_epoch(epoch)
                ranks.append(list(smp))
            per_epoch.append(ranks)
        assert lab08.check_sampler({"n": n, "per_rank": per_epoch}), (n, world)
    uneven = [[[0, 1, 2, 3, 4], [5, 6, 7]], [[7, 6, 5, 4, 3], [2, 1, 0]]]
    with pytest.raises(ExerciseFailed, match="ceil"):
        lab08.check_sampler({"n": 8, "per_rank": uneven})
    # padding allows as many repeats as it needs, no more: 10 on 4 ranks pads 2
    three = [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]] * 1
    assert lab08.check_sampler({"n": 10, "per_rank": three})
    with pytest.raises(ExerciseFailed, match="both read|every sample"):
        lab08.check_sampler({"n": 10, "per_rank": [[[0, 1, 2], [0, 1, 2], [6, 7, 8], [9, 3, 4]]]})


DONE = """
def done_fn(params):
    return params
"""

STUB = """
def stub_fn(params):
    # YOUR CODE HERE
    perflab.labs.exercises.not_done(5)
"""


def test_one_launch_runs_what_is_finished_and_each_check_names_what_is_not(monkeypatch, capsys):
    """Lab 8 runs exercises 4 and 5 (and exercise 6's all-reduce) in one launch: an unfinished
    function drops only the tasks that call it, a finished one still runs, and the check of
    the unfinished one stops with one sentence."""
    seen = []
    monkeypatch.setattr(lab08, "launch", lambda tasks, user_code=(), **kw: seen.append(
        (tasks, list(user_code))) or [{"results": {t["name"]: {"done_fn": 1} for t in tasks}}])
    tasks = [{"name": "user_optimizer", "args": {"fns": ["done_fn"]}},
             {"name": "user_sampler", "args": {"fns": ["stub_fn"]}},
             {"name": "sweep", "args": {"sizes": [4096]}}]
    ranks = lab08.lab_launch({"done_fn": 4, "stub_fn": 5}, tasks, user_code=[DONE, STUB],
                             skip_unfinished=True)
    assert [t["name"] for t in seen[0][0]] == ["user_optimizer", "sweep"] and seen[0][1] == [DONE]
    assert "Exercise 5 is not done yet: write the body of stub_fn()" in capsys.readouterr().out
    assert lab08.task_result(ranks, "user_optimizer", 4, "x", fn="done_fn") == 1
    with pytest.raises(ExerciseFailed, match="^Exercise 5 is not done yet: write indices_for"):
        lab08.task_result(ranks, "user_sampler", 5, "write indices_for", fn="stub_fn")
    # nothing left to run: no launch at all, and every check says which exercise waits
    assert lab08.lab_launch({"stub_fn": 5}, tasks[1:2], user_code=[STUB], skip_unfinished=True) == []
    assert len(seen) == 1
    with pytest.raises(ExerciseFailed, match="^Exercise 4 is not done yet"):
        lab08.task_result([], "user_optimizer", 4, "write make_optimizer", fn="make_optimizer")
    with pytest.raises(ExerciseFailed, match="^Exercise 5 is not done yet"):
        lab08.lab_launch({"stub_fn": 5}, tasks[1:2], user_code=[STUB])


def test_bucket_choice_check_says_whether_the_rounds_contradict_the_prediction(capsys):
    """Review F6 of chapter 8 (series f): the prediction was graded against the reference model
    only, so a model the measurement contradicts passed without a word; the check now prints the
    predicted cap beside the fastest median, by the rule that judges the choice."""
    rounds = _bucket_rounds()                                 # 4.0 fastest, 16.0 16 % behind
    assert lab08.check_bucket_choice(4.0, rounds, predicted_mb=16.0, expected_mb=16.0)
    assert "The rounds contradict the model: its cap, 16 MiB" in capsys.readouterr().out
    assert lab08.check_bucket_choice(4.0, rounds, predicted_mb=4.0, expected_mb=4.0)
    assert "the rounds agree" in capsys.readouterr().out
    assert lab08.check_bucket_choice(4.0, rounds, predicted_mb=1.0, expected_mb=1.0)
    assert "the rounds do not tell it from 4 MiB" in capsys.readouterr().out


def test_a_contradicted_model_cap_is_explained_where_gloo_shares_the_backwards_cores(capsys):
    """Student review (6 December, finding 11): on 1-thread gloo ranks the model's cap was the
    slowest measured one and nothing said why."""
    rounds = {0.0625: [0.027, 0.028], 1.0: [0.0062, 0.0063], 16.0: [0.0066, 0.0065]}
    assert lab08.check_bucket_choice(1.0, rounds, predicted_mb=0.0625, expected_mb=0.0625,
                                     overlap=False)
    out = capsys.readouterr().out
    assert "contradict the model" in out and "share the backward's cores" in out
    assert lab08.check_bucket_choice(1.0, rounds, predicted_mb=0.0625, expected_mb=0.0625,
                                     overlap=True)
    out = capsys.readouterr().out
    assert "contradict the model" in out and "share the backward's cores" not in out
    assert lab08.check_bucket_choice(1.0, rounds, predicted_mb=1.0, expected_mb=1.0, overlap=False)
    assert "share the backward's cores" not in capsys.readouterr().out   # the rounds agree
