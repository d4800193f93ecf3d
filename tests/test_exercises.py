import json

import pytest
import torch

from perflab.labs import exercises as E
from perflab.labs import lab01
from perflab.labs import lab03


def test_check_close_passes_with_one_sentence(capsys):
    assert E.check_close(101, 100, "flops", rtol=0.02)
    assert capsys.readouterr().out.startswith("✓ flops")


@pytest.mark.parametrize("answer", [150, None, ..., "many", float("nan")])
def test_check_close_fails_clearly(answer):
    with pytest.raises(E.ExerciseFailed, match="✗ flops"):
        E.check_close(answer, 100, "flops", hint="count both")


def test_failure_is_an_assertion_error_for_nbgrader():
    assert issubclass(E.ExerciseFailed, AssertionError)


def test_check_choice_rejects_wrong_and_invalid_answers():
    assert E.check_choice("a", "a", "regime", choices=["a", "b"])
    with pytest.raises(E.ExerciseFailed, match="expected 'a'"):
        E.check_choice("b", "a", "regime", choices=["a", "b"])
    with pytest.raises(E.ExerciseFailed, match="not one of"):
        E.check_choice("c", "a", "regime", choices=["a", "b"])


def test_check_true_and_ratio():
    assert E.check_true(True, "fine", "broken")
    with pytest.raises(E.ExerciseFailed, match="broken"):
        E.check_true(False, "fine", "broken")
    assert E.check_ratio_at_least(4, 2, 1.5, "speed-up")
    with pytest.raises(E.ExerciseFailed, match="below"):
        E.check_ratio_at_least(2, 2, 1.5, "speed-up")
    with pytest.raises(E.ExerciseFailed, match="positive"):
        E.check_ratio_at_least(-1, 2, 1.5, "speed-up")


def test_overlay_table_shows_ratio_and_missing_reference():
    table = E.overlay_table([("bw", 2.0, 4.0, "TB/s"), ("knee", 10.0, None, "")])
    assert " 0.5 " in table and "—" in table


def test_overlay_table_never_rounds_a_ratio_to_zero():
    table = E.overlay_table([("op rate", 3.0, 1000.0, "/s"), ("tiny", 1e-6, 1.0, "")])
    assert " 0.003 " in table and "<0.0001" in table and "0.00 " not in table and "e-0" not in table


def test_overlay_table_names_the_reference_devices_once():
    rows = [("bw", 2.0, 4.0, "TB/s")]
    table = E.overlay_table(rows, reference_run={"devices": ["NVIDIA H200", "NVIDIA H200"]})
    assert table.splitlines()[:2] == ["reference: 2x NVIDIA H200", ""]
    assert table.count("H200") == 1
    assert E.overlay_table(rows, reference_run=None).startswith("reference: no reference run\n")
    assert E.overlay_table(rows).startswith("quantity")


def test_reference_devices_counts_identical_devices():
    assert E.reference_devices({"devices": ["NVIDIA H200", "NVIDIA H200"]}) == "2x NVIDIA H200"
    assert E.reference_devices(None) == "no reference run"


def test_not_done_and_require_say_which_exercise_in_one_sentence():
    with pytest.raises(E.ExerciseNotDone, match=r"^Exercise 3 is not done yet: write your code"):
        E.not_done(3)
    with pytest.raises(E.ExerciseNotDone, match=r"^Exercise 2 is not done yet: set regimes \(it is still None\)\.$"):
        E.require(2, ok=1, regimes=None)
    with pytest.raises(E.ExerciseNotDone, match="set answers"):
        E.require(1, answers={})
    assert E.require(1, answers={"a": 1}) is None
    assert issubclass(E.ExerciseNotDone, E.ExerciseFailed)


def test_answer_or_none_skips_only_unfinished_work():
    assert E.answer_or_none(lambda: E.not_done(4)) is None
    assert E.answer_or_none(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        E.answer_or_none(lambda: 1 / 0)


def test_record_appends_json_lines_only_under_the_grader(tmp_path, monkeypatch):
    monkeypatch.delenv("PERFLAB_GRADE_LOG", raising=False)
    E.record("x", 1.0)                                   # nothing happens
    E.ExerciseFailed("✗ not logged")
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("PERFLAB_GRADE_LOG", str(log))
    E.check_ratio_at_least(3.0, 1.0, 2.0, "speed-up")
    E.record("odd", float("nan"))
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"what": "speed-up", "value": 3.0},
        {"check": "ratio_at_least", "what": "speed-up", "passed": True,
         "inputs": {"numerator": 3.0, "denominator": 1.0, "minimum": 2.0}},
        {"what": "odd", "value": "nan"}]


def test_the_ledger_keeps_each_verdict_and_every_failure_even_a_caught_one(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("PERFLAB_GRADE_LOG", str(log))
    with pytest.raises(E.ExerciseFailed):
        E.check_close(63, 42, "double(21)", rtol=0)
    try:
        E.check_choice(torch.device("cpu"), "cuda", "device")
    except E.ExerciseFailed:
        pass                                              # swallowed: the ledger still has it
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    verdicts = [e for e in entries if "check" in e]
    failures = [e for e in entries if "failed" in e]
    assert verdicts[0] == {"check": "close", "what": "double(21)", "passed": False,
                           "inputs": {"got": 63.0, "expected": 42.0, "rtol": 0}}
    # an answer that is not plain data is recorded as such, never as its repr (the grader cannot
    # re-check that, so it fails)
    assert verdicts[1]["passed"] is False and verdicts[1]["inputs"]["unplain"] == "device"
    assert [f["failed"] for f in failures] == ["ExerciseFailed", "ExerciseFailed"]
    assert failures[0]["message"].startswith("✗ double(21): got 63")


def test_short_errors_is_a_no_op_outside_ipython(monkeypatch):
    # another test of the suite may have started an IPython shell in this process: outside
    # IPython means get_ipython() answers None, whatever ran before
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert E.short_errors() is False


def test_short_errors_sets_a_one_line_handler_inside_ipython(monkeypatch):
    import IPython

    seen = {}

    class Shell:
        def set_custom_exc(self, types, handler):
            seen["types"], seen["handler"] = types, handler

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert E.short_errors() is True
    assert seen["types"] == (E.ExerciseFailed,)


def test_timer_tolerance_grows_with_spread_within_bounds():
    assert lab01.timer_tolerance([1.0, 1.01, 0.99, 1.0, 1.02]) == pytest.approx(0.15)
    noisy = lab01.timer_tolerance([1.0, 1.3, 0.8, 1.1, 0.9])
    assert 0.15 < noisy <= 1.0
    assert lab01.timer_tolerance([1, 3, 0.3, 5, 0.1]) == 1.0
    with pytest.raises(ValueError, match="ratios"):
        lab01.timer_tolerance([1.0, 1.0])


def _trials(true_s, bias, noise, seed, n=7):
    """Modelled trials on a loaded machine: each trial of each timer is slowed by its own factor
    exp(|N(0, noise)|) (other programs only ever slow a trial down; noise 1.0 means single trials
    often 2-5x slow, as measured on this course's 2-core CI machine at a load average of 10)."""
    import math
    import random

    rnd = random.Random(seed)
    slow = lambda: math.exp(abs(rnd.gauss(0, noise)))
    mine = [true_s * bias * slow() for _ in range(n)]
    lib = [true_s * slow() for _ in range(n)]
    return mine, lib


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("noise", [0.01, 0.1, 0.3, 1.0])
def test_check_timer_accepts_a_right_timer_under_load(seed, noise, capsys):
    # the lab 1 failure this replaces: 11 % off on a loaded 2-core machine against a fixed 10 %
    mine, lib = _trials(3e-4, 1.0, noise, seed)
    assert lab01.check_timer(mine, lib)


def test_check_timer_accepts_a_right_timer_with_one_lucky_trial(capsys):
    # the CI failure this replaces: one trial of the student's timer beat every library trial
    # (ratio of the bests 0.68x) while the paired trials agreed
    mine = [1.0, 1.5, 1.5, 1.4, 1.5, 1.45, 1.5]
    lib = [1.47, 1.5, 1.48, 1.5, 1.46, 1.52, 1.5]
    assert min(mine) / min(lib) < 0.7
    assert lab01.check_timer([m * 1e-4 for m in mine], [b * 1e-4 for b in lib])


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("bias, why", [(0.02, "too low"), (8.0, "too high")])
def test_check_timer_rejects_wrong_timers_under_load(seed, bias, why):
    # 0.02: a host clock without events/synchronize on a 0.3 ms GPU kernel (it reads the ~6 us
    # launch); 8: a timer that includes a one-time cost or times allocation too
    mine, lib = _trials(3e-4, bias, 0.3, seed)
    with pytest.raises(E.ExerciseFailed, match=why):
        lab01.check_timer(mine, lib)


# Lab 3 exercise 4's CPU-time requirement, replayed on modelled machines. Per training step the host
# issues ~30 kernels (forward, backward, SGD with momentum, foreach) at a launch cost per kernel, and
# the device needs FLOPs / rate. Sizes as in the lab on a GPU: width 2048, batch 2048, 3 layers:
# 6 * 2048 * 2048 * 2048 * 3 = 155 GFLOP per step. FP32 (non-tensor-core) peaks from the datasheets:
# H200 67 TFLOP/s (NVIDIA H200 datasheet), A100 19.5 (NVIDIA A100 datasheet), RTX 4090 82.6 (Ada
# whitepaper), and a laptop iGPU-class / slow host case. Launch cost per kernel: 5 us on a server
# CPU, 12 us on a laptop CPU (chapter 1's measured eager op rate is of this order).
MACHINES = {  # name: (device FLOP/s reached at 60 % of peak, host seconds per kernel launch)
    "H200, server host": (0.6 * 67e12, 5e-6),
    "A100, server host": (0.6 * 19.5e12, 5e-6),
    "RTX 4090, desktop host": (0.6 * 82.6e12, 8e-6),
    "small GPU, laptop host": (0.6 * 5e12, 12e-6),
    "H200, tiny model on a slow host": (0.6 * 67e12, 40e-6),
}


def _loop_times(rate, launch, flops=155e9 / 64, kernels=30, steps=40, syncs_per_step=4):
    """(issue, total) seconds of a loop that never syncs, and the issue time of one that syncs."""
    host, device = kernels * launch, flops / rate
    fast_issue = steps * host
    fast_total = max(fast_issue, steps * device) + host
    # each sync makes the host wait for the device, and the device for the next launches
    slow_issue = steps * (max(host, device) + syncs_per_step * launch * 4)
    return fast_issue, fast_total, slow_issue


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("flops", [155e9, 155e9 / 64])   # the lab's size, and a model 64x smaller
def test_cpu_saving_requirement_never_fails_a_right_answer(machine, flops):
    rate, launch = MACHINES[machine]
    fast_issue, fast_total, slow_issue = _loop_times(rate, launch, flops)
    need = lab03.required_cpu_saving(fast_issue, fast_total)
    if need is None:    # the host is the bottleneck: nothing to require
        assert fast_total / fast_issue < 1.2
    else:
        # even with 30 % noise against the right answer, the requirement holds
        assert slow_issue / (fast_issue * 1.3) >= need, (machine, slow_issue / fast_issue, need)


def test_cpu_saving_requirement_bounds():
    assert lab03.required_cpu_saving(1.0, 1.1) is None
    assert lab03.required_cpu_saving(1.0, 2.0) == pytest.approx(1.5)
    assert lab03.required_cpu_saving(1.0, 1.4) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="> 0"):
        lab03.required_cpu_saving(0, 1)


class _Yes:
    """Equal to everything: the answer an attacker gives a check that compares with ==."""

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class _Peek(float):
    """A float whose float() is 42 whatever it holds: it would read the expected value."""

    def __float__(self):
        return 42.0


def test_plain_reads_what_an_answer_stores_never_its_own_methods():
    import numpy as np

    assert E.plain(_Peek(1.0)) == 1.0 and type(E.plain(_Peek(1.0))) is float
    assert E.plain([np.int64(3), (np.float32(0.5), "x")]) == (3, (0.5, "x"))
    assert E.plain({"a": torch.Size([2, 3]), "b": torch.tensor(True)}) == {"a": (2, 3), "b": True}
    assert E.plain(np.array([1.5])) == 1.5 and E.plain(np.bool_(True)) is True
    for bad in (_Yes(), [_Yes()], {"k": _Yes()}, torch.zeros(3), object(), lambda: 1):
        with pytest.raises(E.NotPlain):
            E.plain(bad)
    with pytest.raises(E.NotPlain, match="elements"):
        E.plain([0] * (E.MAX_PLAIN_ITEMS + 1))
    deep = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(E.NotPlain, match="nested"):
        E.plain(deep)


def test_checks_refuse_answers_that_are_not_plain_data():
    import numpy as np

    with pytest.raises(E.ExerciseFailed, match="got 1, expected 42"):      # not 42: its stored value
        E.check_close(_Peek(1.0), 42, "double(21)", rtol=0)
    with pytest.raises(E.ExerciseFailed, match="plain data"):
        E.check_choice(_Yes(), 3, "strides")
    with pytest.raises(E.ExerciseFailed, match="not True or False"):
        E.check_true(_Yes(), "ok", "not ok")
    with pytest.raises(E.ExerciseFailed, match="expected a number"):
        E.as_float("x", _Yes())
    assert E.check_choice([20, 1, 5], (20, 1, 5), "strides") is True        # a list is its tuple
    assert E.check_true(np.bool_(True), "ok", "no") is True                  # numpy's bool is one


def test_as_tensor_copies_into_a_fresh_plain_tensor():
    class Sub(torch.Tensor):
        pass

    t = torch.arange(6.0).reshape(2, 3).t()
    out = E.as_tensor("t", t, torch.float64)
    assert out.dtype == torch.float64 and out.is_contiguous() and torch.equal(out, t.double())
    assert out.data_ptr() != t.data_ptr() and not out.requires_grad
    with pytest.raises(E.ExerciseFailed, match="expected a tensor"):
        E.as_tensor("t", t.as_subclass(Sub))


def test_in_kernel_is_the_call_itself_outside_the_grader(monkeypatch):
    assert E.in_kernel(max, 2, 5) == 5
    monkeypatch.setattr(E, "_IN_KERNEL", lambda fn, *a, **k: ("sent", fn.__name__, a))
    assert E.in_kernel(max, 2, 5) == ("sent", "max", (2, 5))


def test_overlay_table_names_the_reference_run_it_read():
    run = {"devices": ["NVIDIA H200"], "git": "b8037d704a66", "started": "2026-12-05T04:16:59Z"}
    head = E.overlay_table([("x", 1.0, 2.0, "s")], reference_run=run).splitlines()[0]
    assert head == "reference: NVIDIA H200, run of b8037d7 started 2026-12-05"


def test_check_close_tells_a_near_miss_from_the_answer():
    """A student's count 2 w short of GPT-2 medium's read "got 354.8M, expected 354.8M (±0%);
    yours is 1x": the numbers now show the digits that differ, the tolerance, and the gap."""
    with pytest.raises(E.ExerciseFailed) as err:
        E.check_close(354_821_120, 354_823_168, "count", rtol=0, hint="add the final LayerNorm")
    msg = str(err.value)
    assert "got 354,821,120, expected 354,823,168 (exactly)" in msg
    assert "2,048 below it" in msg and "1x" not in msg and "Hint: add the final" in msg
    assert E.check_close(354_823_168, 354_823_168, "count", rtol=0)


def test_check_close_writes_the_unit_and_a_small_tolerance():
    with pytest.raises(E.ExerciseFailed) as err:
        E.check_close(0.135, 1.08, "time", rtol=1e-6, unit="s")
    msg = str(err.value)
    assert "got 135 ms, expected 1.08 s" in msg and "±0.0001 %" in msg and "0.125x" in msg
    with pytest.raises(E.ExerciseFailed, match=r"got 1\.000001 s, expected 1 s"):
        E.check_close(1.000001, 1.0, "time", rtol=1e-9, unit="s")
    assert E.check_close(1.08 * (1 + 1e-8), 1.08, "time", rtol=1e-6, unit="s")


def test_overlay_table_header_names_what_ran_the_reference():
    """Lab 8's reference all-reduce ran on gloo on the host CPU: its header must not say it ran
    on the GPU the run's metadata names."""
    run = {"devices": ["NVIDIA H100 80GB HBM3"]}
    where = "gloo on the host CPU of the NVIDIA H100 80GB HBM3 machine"
    head = E.overlay_table([("busbw", 2.0, 2.6, "GB/s")], reference_run=run, where=where)
    assert head.splitlines()[0] == f"reference: {where}"
    assert E.overlay_table([("x", 1.0, 2.0, "s")], reference_run=run).startswith(
        "reference: NVIDIA H100 80GB HBM3")



def test_check_close_hint_may_follow_the_ratio():
    """A hint that is a function gets got / expected, so it names the mistake the ratio shows."""
    with pytest.raises(E.ExerciseFailed, match=r"Hint: ratio 2\.0"):
        E.check_close(200, 100, "flops", hint=lambda r: f"ratio {r:.1f}")
    assert E.check_close(100, 100, "flops", hint=lambda r: 1 / 0)

