"""Lab 6: each check accepts the reference solution and rejects a plausible wrong one (on CPU).

Speed parts that only exist on a GPU are proven with measured-looking numbers passed as a CUDA
device (the check's logic, not the machine, is under test); result and structure checks run
the lab's own loops on CPU sizes.
"""

import sys
from pathlib import Path

import jupytext
import pytest
import torch
import torch.nn.functional as F

from perflab.speed.tolerance import same_losses
from perflab.internals import hostsync
from perflab.labs import exercises, lab06
from perflab.labs.exercises import ExerciseFailed

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "labs" / "06_speed.md"
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402


@pytest.fixture(scope="module")
def ns():
    """The lab's set-up, given loops and solution cells (not the checks), on CPU sizes."""
    nb = jupytext.read(LAB)
    space: dict = {}
    for cell in nb.cells:
        grade = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or grade.get("grade") or "ref_path" in cell.source:
            continue
        exec(compile(cell.source, "<lab6 cell>", "exec"), space)
    return space


def test_student_edition_is_valid_python(tmp_path):
    import ast

    assert make_student.main([str(LAB), "-o", str(tmp_path)]) == 0
    nb = jupytext.read(tmp_path / "06_speed.ipynb")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)


def test_ex1_sync_count_accepts_the_solution_and_rejects_a_loop_that_still_syncs(ns):
    model = ns["make_model"]()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    args = (ns["xs1"], ns["ys1"], ns["ok1"])
    _, good = hostsync.count_host_syncs(ns["train_quiet"], model, sgd, *args)
    assert sum(good.values()) == 0

    def still_logs(model, opt, xs, ys, ok):  # wrong: keeps .item() every step
        out = ns["train_quiet"](model, opt, xs, ys, ok)
        return [v.item() for v in out]

    _, bad = hostsync.count_host_syncs(still_logs, model, sgd, *args)
    assert sum(bad.values()) > 0


def test_ex1_data_has_invalid_rows_and_a_loss_that_ignores_the_mask_fails(ns):
    """The mask the exercise asks to keep must matter: some rows are invalid, and the mean over
    every row trains on them."""
    ok = ns["ok1"]
    assert (~ok).any() and ok.any()
    args = (ns["xs1"], ns["ys1"], ok)
    slow = ns["train_logging"](*ns["fresh"](width=ns["width1"]), *args)

    def unmasked(model, opt, xs, ys, ok):    # wrong: every row counted
        return ns["train_quiet"](model, opt, xs, ys, torch.ones_like(ok))

    bad = unmasked(*ns["fresh"](width=ns["width1"]), *args).tolist()
    with pytest.raises(ExerciseFailed, match="result changed"):
        lab06.check_same_and_faster("Exercise 1: x", slow, bad, 1.0, "cpu", 1.05)


def test_ex1_result_check_rejects_a_loop_that_drops_the_mean(ns):
    args = (ns["xs1"], ns["ys1"], ns["ok1"])
    slow = ns["train_logging"](*ns["fresh"](), *args)
    good = ns["train_quiet"](*ns["fresh"](), *args).tolist()
    assert lab06.check_same_and_faster("Exercise 1: x", slow, good, 1.0, "cpu", 1.05)

    def summed(model, opt, xs, ys):          # wrong: sum instead of mean (8x the step)
        losses = torch.empty(len(xs))
        for i in range(len(xs)):
            loss = F.cross_entropy(model(xs[i]), ys[i], reduction="sum")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[i] = loss.detach() / len(ys[i])
        return losses

    torch.manual_seed(0)
    model = ns["make_model"]()
    sgd_like = torch.optim.SGD(model.parameters(), lr=0.5)
    bad = summed(model, sgd_like, ns["xs1"], ns["ys1"]).tolist()
    with pytest.raises(ExerciseFailed, match="result changed"):
        lab06.check_same_and_faster("Exercise 1: x", slow, bad, 1.0, "cpu", 1.05)


def test_speed_part_on_a_gpu_rejects_no_speedup_and_accepts_the_target():
    same = [2.0, 1.5]
    with pytest.raises(ExerciseFailed, match="below the required"):
        lab06.check_same_and_faster("Exercise 2: pinned", same, same, 1.03, "cuda", 1.15)
    assert lab06.check_same_and_faster("Exercise 2: pinned", same, same, 2.0, "cuda", 1.15)
    # on a CPU the speed part is not checked: a right answer never fails there
    assert lab06.check_same_and_faster("Exercise 2: pinned", same, same, 0.5, "cpu", 1.15)


def test_ex2_reference_runs_on_cpu_with_the_same_result(ns):
    px = ns["prepare_host"](ns["host_x"])
    assert px is ns["host_x"] or px.is_pinned()
    slow = ns["train_from_host"](*ns["fresh"](), ns["host_x"], ns["host_y"]).tolist()
    fast = ns["train_pinned"](*ns["fresh"](), px, ns["host_y"]).tolist()
    assert lab06.check_same_and_faster("Exercise 2: p", slow, fast, 1.0, "cpu", 1.15)


def test_ex3_implementation_check_accepts_the_default_and_rejects_the_loop(ns):
    p = [torch.nn.Parameter(torch.ones(2))]
    assert lab06.multi_tensor(ns["make_fast_optimizer"](p))
    # PyTorch's default, foreach=None, is foreach for CUDA tensors: a right answer
    assert lab06.multi_tensor(torch.optim.AdamW(p, lr=2e-3))
    assert lab06.multi_tensor(torch.optim.AdamW(p, lr=2e-3, foreach=True))
    assert not lab06.multi_tensor(ns["make_slow_optimizer"](p))   # unchanged: the loop
    assert not lab06.multi_tensor(torch.optim.AdamW(p, lr=2e-3, foreach=False))


def test_ex3_result_check_tells_fused_rounding_from_another_training(ns):
    """for-loop against fused AdamW over the lab's steps: rounding only, inside 1e-3; a loop on
    the first batch only, or at another learning rate, outside it from the first steps."""
    def run(make, xs, ys):
        model = ns["make_model"](depth=ns["depth3"], width=64)
        return ns["train"](model, make(model.parameters()), xs, ys).tolist()

    xs, ys = ns["xs3"], ns["ys3"]
    slow = run(ns["make_slow_optimizer"], xs, ys)
    fused = run(lambda p: torch.optim.AdamW(p, lr=2e-3, fused=True), xs, ys)
    assert same_losses(slow, fused)
    one_batch = run(ns["make_slow_optimizer"], xs[:1].expand_as(xs), ys[:1].expand_as(ys))
    assert not same_losses(slow, one_batch)
    other_lr = run(lambda p: torch.optim.AdamW(p, lr=1e-3), xs, ys)
    assert not same_losses(slow, other_lr)


def test_ex4_batch_check_accepts_the_solution_and_rejects_a_small_batch(ns):
    """The check's logic on given numbers (the timing itself runs in the lab, tests/test_lab_checks.py):
    the same loss and 10x passes; batch 16 halves the calls, about 2x, below the 3x required."""
    args = (ns["eval_model"], ns["eval_x"], ns["eval_y"])
    slow_loss = ns["evaluate"](*args, 8)
    fast_loss = ns["evaluate"](*args, ns["fast_batch"])
    assert lab06.check_same_and_faster("Exercise 4: b", [slow_loss], [fast_loss], 10.0,
                                       "cpu", 3.0, ratio_on_cpu=True, rtol=1e-4)
    with pytest.raises(ExerciseFailed, match="below the required"):
        lab06.check_same_and_faster("Exercise 4: b", [slow_loss], [slow_loss], 2.0,
                                    "cpu", 3.0, ratio_on_cpu=True)
    with pytest.raises(ExerciseFailed, match="result changed"):     # another quantity
        lab06.check_same_and_faster("Exercise 4: b", [slow_loss], [slow_loss * 8], 10.0,
                                    "cpu", 3.0, ratio_on_cpu=True, rtol=1e-4)


def test_unfinished_answers_say_not_done():
    with pytest.raises(ExerciseFailed, match="Exercise 4 is not done yet"):
        exercises.not_done(4, "set fast_batch")
    with pytest.raises(ExerciseFailed, match="Exercise 2 is not done yet"):
        lab06.check_same_and_faster("Exercise 2: pinned", [1.0], None, 1.0, "cpu", 1.1)


def test_ex2_rejects_a_pinned_but_blocking_copy(ns):
    """Pinning makes a copy faster, non_blocking makes it asynchronous: a loop that pins and
    forgets non_blocking still waits for every copy, on any device."""
    px, py = ns["prepare_host"](ns["host_x"]), ns["prepare_host"](ns["host_y"])
    assert lab06.check_async_copies(ns["train_pinned"], *ns["fresh"](), px, py)
    with pytest.raises(ExerciseFailed, match="without non_blocking"):
        lab06.check_async_copies(ns["train_from_host"], *ns["fresh"](), px, py)
    x = torch.ones(3)
    assert lab06.blocking_copies(lambda: x.to("cpu")) == 1
    assert lab06.blocking_copies(lambda: x.to("cpu", non_blocking=True)) == 0
    assert lab06.blocking_copies(lambda: x.to(torch.float64)) == 0        # not a copy
    assert lab06.blocking_copies(lambda: torch.empty(3).copy_(x)) == 1
    assert lab06.blocking_copies(lambda: torch.empty(3).copy_(x, non_blocking=True)) == 0
    with pytest.raises(TypeError):
        lab06.blocking_copies(None)


def _host_losses(ns):
    """Student review (6 December, finding 5): the losses gathered in a host tensor, a D2H
    copy (a sync) per step on a GPU, passed on a CPU, where the host is the device."""
    def train(model, opt, xs, ys, ok):
        losses = torch.empty(len(xs))                # no device: the host
        for i in range(len(xs)):
            w = ok[i].float()
            per_row = F.cross_entropy(model(xs[i]), ys[i], reduction="none")
            loss = (per_row * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[i] = loss.detach()
        return losses
    return train


def test_ex1_losses_on_the_device_catch_a_host_tensor_on_a_cpu(ns, capsys):
    model = ns["make_model"](width=ns["width1"])
    args = (model, ns["xs1"], ns["ys1"], ns["ok1"])
    before = [p.clone() for p in model.parameters()]
    assert lab06.check_losses_on_device(ns["train_quiet"], *args)
    assert "keeps every loss on the device" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    wrong = _host_losses(ns)
    _, found = hostsync.count_host_syncs(wrong, model, torch.optim.SGD(model.parameters(), lr=0.01),
                                         *args[1:])
    assert sum(found.values()) == 0                   # the counter cannot see it
    with pytest.raises(ExerciseFailed, match=r"reaches the host \(aten\.copy_, at `losses\[i\] = "):
        lab06.check_losses_on_device(wrong, *args)

    # right: a tensor made on the notebook's dev (the device on a GPU; the check's stand-in
    # names it for the duration), the losses stacked
    notebook = dict(ns)
    exec("def with_dev(model, opt, xs, ys, ok):\n"
         "    losses = torch.zeros(len(xs), device=dev)\n"
         "    losses.copy_(torch.stack(list(train_quiet(model, opt, xs, ys, ok))))\n"
         "    return losses\n", notebook)
    assert lab06.check_losses_on_device(notebook["with_dev"], *args)
    assert notebook["dev"] is ns["dev"] and ns["dev"] == torch.device("cpu")   # put back

    def a_list(model, opt, xs, ys, ok):
        return list(ns["train_quiet"](model, opt, xs, ys, ok))

    with pytest.raises(ExerciseFailed, match="must return one tensor"):
        lab06.check_losses_on_device(a_list, *args)

    def tensor_of(model, opt, xs, ys, ok):            # torch.tensor reads every loss
        return torch.tensor(list(ns["train_quiet"](model, opt, xs, ys, ok)))

    with pytest.raises(ExerciseFailed, match="needs values of the device on the host"):
        lab06.check_losses_on_device(tensor_of, *args)


def test_say_speedup_prints_the_spread_and_what_it_decides(capsys):
    """Student review (6 December, finding 11): 'speedup 0.10x' printed after a ✓ for the same
    work on a CPU."""
    text = lab06.say_speedup(0.61, [0.21, 0.61, 6.75, 0.9, 2.0], "cpu")
    assert "0.21x to 6.75x" in text and "noise" in text and "not checked on a CPU" in text
    assert text in capsys.readouterr().out
    assert "faster in every pair" in lab06.say_speedup(5.5, [5.0, 5.5, 6.0], "cpu", checked_on_cpu=True)
    gpu = lab06.say_speedup(0.8, [0.7, 0.8, 0.9], "cuda")
    assert "slower in every pair" in gpu and "CPU" not in gpu
    with pytest.raises(ValueError):
        lab06.say_speedup(1.0, [], "cpu")


def test_stand_in_device_swaps_the_host_device_names_and_puts_them_back():
    from perflab.labs import standin

    dev = torch.device("cpu")
    env = {"dev": dev, "other": torch.device("meta"), "n": 3}
    fn = eval("lambda: dev", env)
    with standin.stand_in_device(fn, "meta") as new:
        assert fn() == new == torch.device("meta") and env["other"].type == "meta"
    assert fn() is dev and env["n"] == 3


def test_stand_in_replaces_the_notebook_s_gpu_device_too():
    """On a GPU the notebook's ``dev`` is a cuda device: the meta probe of exercise 1 must
    rebind it as it rebinds a CPU's, or a right answer (``device=dev``) copies a meta loss into
    a cuda tensor and reads as a host read (review of 7 December)."""
    from perflab.labs.standin import stand_in_device
    notebook = {"torch": torch, "dev": torch.device("cuda"), "host": torch.device("cpu")}
    exec("def f():\n    return dev\n", notebook)
    with stand_in_device(notebook["f"], "meta", replaced=torch.device("cuda", 0)) as new:
        assert notebook["f"]() == new == torch.device("meta")
        assert notebook["host"] == torch.device("cpu")
    assert notebook["dev"] == torch.device("cuda")
