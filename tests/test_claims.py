"""perflab.record.claims: sentences chosen by the data, and typed sentences checked against it."""

import json

import numpy as np
import pytest

from perflab.core.rounds import Spread
from perflab.record import claims


class Glued(dict):
    """What the claims glued: ``glued[name]`` is the text, ``glued.records[name]`` the verdict
    record stored beside it."""

    def __init__(self):
        super().__init__()
        self.records = {}

    def __call__(self, name, value):
        if isinstance(value, claims._Claimed):
            self[name], self.records[name] = value.text, value.record
        else:
            self[name] = value


@pytest.fixture
def glued(monkeypatch):
    seen = Glued()
    monkeypatch.setattr(claims, "glue", seen)
    return seen


def test_claim_glues_the_sentence_the_data_supports(glued):
    assert claims.claim("fused", 1.0 < 2.0, "faster", "slower", bound="device") == "faster"
    assert glued["fused"] == "faster"
    assert glued.records["fused"] == {"verdict": "true", "bound": "device"}
    assert claims.claim("fused2", bool(np.float64(3) < 2), "faster", "slower",
                        bound="host") == "slower"
    assert glued.records["fused2"]["verdict"] == "false"
    assert claims.claim("np", np.float64(1) < np.float64(2), "yes", "no", bound="exact") == "yes"


def test_an_undecided_claim_says_so_and_needs_its_sentence(glued):
    assert claims.claim("tie", None, "a", "b", bound="device", if_undecided="cannot tell") \
        == "cannot tell"
    assert glued.records["tie"]["verdict"] == "undecided"
    with pytest.raises(ValueError, match="if_undecided"):
        claims.claim("tie2", None, "a", "b", bound="device")


def test_every_claim_declares_its_bound(glued):
    with pytest.raises(TypeError):
        claims.claim("x", True, "a", "b")                       # noqa: the missing bound
    with pytest.raises(ValueError, match="bound"):
        claims.claim("x", True, "a", "b", bound="gpu")
    with pytest.raises(TypeError):
        claims.compare("x", 1.0, 1.0, 0.1)


def test_a_claim_on_a_cell_s_last_line_shows_nothing(glued):
    """The sentence is glued (the prose quotes it) and returned, but a notebook displays nothing
    for it: it appears once on the page."""
    from IPython.core.formatters import DisplayFormatter

    sentence = claims.claim("fused", True, "faster", "slower", bound="device")
    assert isinstance(sentence, str) and sentence == "faster" and type(glued["fused"]) is str
    shown = DisplayFormatter().format(sentence)
    assert shown == ({}, {}), f"IPython would display the claim: {shown}"
    assert DisplayFormatter().format("a plain str")[0], "the check would not see a displayed str"


def test_expect_records_true_and_false(glued, capsys):
    # None, so a cell ending in expect(...) prints no stray True on the page
    assert claims.expect("knee_in_range", True, "the knee lies between 32 and 64") is None
    assert claims.expect("plateau", False, "the plateau is flat") is None
    assert glued == {"expect_knee_in_range": True, "expect_plateau": False}
    assert "does not hold" in capsys.readouterr().out


@pytest.mark.parametrize("call", [
    lambda: claims.claim("bad name", True, "a", "b", bound="device"),
    lambda: claims.claim("x", 1, "a", "b", bound="device"),
    lambda: claims.claim("x", True, "", "b", bound="device"),
    lambda: claims.expect("x", "yes", "s"),
    lambda: claims.expect("x", True, ""),
])
def test_bad_input_is_an_error(call, glued):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("a, b, quantity, words", [
    (1.0, 2.0, "time", "2.0x faster than"),
    (2.0, 1.0, "time", "2.0x slower than"),
    (2.0, 1.0, "rate", "2.0x faster than"),
    (1.05, 1.0, "time", "about the same as"),
    (3.0, 1.0, "size", "3.0x larger than"),
])
def test_relation_words(a, b, quantity, words):
    assert claims.relation(a, b, quantity) == words


def test_relation_rejects_bad_values():
    for args in [(0, 1), (1, float("nan")), (1, 1, "speed"), (1, 1, "time", -0.1)]:
        with pytest.raises(ValueError):
            claims.relation(*args)


def test_failed_expectations_read_from_a_notebook(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "read_glued", lambda p: {"expect_a": True, "expect_b": False, "x": 1})
    assert claims.failed_expectations(tmp_path / "nb.ipynb") == ["b"]


def test_compare_is_two_sided_and_states_the_ratio(glued):
    assert claims.compare("hit", 0.9, 1.0, 0.25, bound="device") == "within"
    assert glued["hit"] == "as predicted (0.90x)"
    assert glued["hit_spread"] == "0.90x the prediction, against its band of 0.75–1.25x (±25 %)"
    assert claims.compare("high", 1.7, 1.0, 0.25, bound="device") == "outside"
    assert glued["high"] == "outside the 25 % band (1.70x)"
    assert not claims.compare("low", 0.5, 1.0, tolerance=0.1, bound="host")  # below: a miss
    assert glued["low"] == "outside the 10 % band (0.50x)"
    assert claims.compare("none", -3.0, 1.0, 0.25, bound="exact") == "outside"
    assert glued["none"] == "none of the positive amount predicted"
    assert glued["none_spread"].startswith("a median of -3.0x the prediction")
    claims.compare("far", 2500.0, 1.0, 0.25, bound="device")
    assert glued["far"] == "outside the 25 % band (2,500x)"
    for bad in [(1.0, 0.0), (1.0, float("inf")), (True, 1.0), (float("nan"), 1.0)]:
        with pytest.raises(ValueError):
            claims.compare("x", *bad, 0.25, bound="device")
    with pytest.raises(ValueError):
        claims.compare("x", 1.0, 1.0, tolerance=1.5, bound="device")


def test_a_verdict_with_a_spread_is_within_outside_or_undecided(glued):
    """The 4 December re-run flipped chapter 6's rungs between 'within 25 %' (1.22x, 1.24x)
    and 'outside' (1.26x, 1.40x): single readings near the band's edge. With the rounds'
    spread, a spread across the edge is undecided, in both runs."""
    inside = Spread((0.95, 1.02, 1.10, 0.98, 1.05))
    across = Spread((1.18, 1.22, 1.31, 1.24, 1.27))
    beyond = Spread((1.36, 1.40, 1.45, 1.38, 1.42))
    assert claims.compare("inside", inside, 1.0, 0.25, bound="device") == "within"
    assert glued["inside"] == "as predicted (1.02x)"
    assert "(0.95–1.10x, min–max over 5 rounds)" in glued["inside_spread"]
    v = claims.compare("across", across, 1.0, 0.25, bound="host")
    assert v == "undecided" and v.holds is None and not v
    assert glued["across"] == "undecided (1.24x; the spread crosses the band's edge)"
    assert "the band's edge at 1.25x lies inside the spread" in glued["across_spread"]
    assert glued.records["across"]["verdict"] == "undecided"
    assert glued.records["across"]["bound"] == "host"
    assert claims.compare("beyond", beyond, 1.0, 0.25, bound="device") == "outside"
    # the low edge is found as well
    claims.compare("under", Spread((0.7, 0.8, 0.9)), 1.0, 0.25, bound="device")
    assert "edge at 0.75x" in glued["under_spread"]
    # the old single-reading behaviour would have called 'across' within (median 1.24x)
    assert abs(across.median - 1) <= 0.25


def test_a_band_that_cannot_fail_needs_a_reason(glued):
    """±40 % accepts 0.6x to 1.4x, a factor of 2.3: wider than a factor of two needs a written
    reason (chapter 3's 64 MiB-4 GiB context band was a factor of 64)."""
    with pytest.raises(ValueError, match="reason"):
        claims.compare("wide", 1.0, 1.0, 0.4, bound="device")
    claims.compare("wide", 1.0, 1.0, 0.4, bound="host",
                   reason="the per-call cost moves 2x between hosts")
    with pytest.raises(ValueError, match="reason"):
        claims.judge(1.0, 64.0, 4096.0)
    assert claims.judge(100.0, 64.0, 4096.0, reason="a CUDA context's size varies by driver")


@pytest.mark.parametrize("value, low, high, holds", [
    (3.0, 2.0, None, True), (1.5, 2.0, None, False), (Spread((1.9, 2.1, 2.3)), 2.0, None, None),
    (Spread((2.1, 2.2, 2.3)), 2.0, None, True), (Spread((1.2, 1.4)), 1.0, 1.5, True),
    (Spread((0.5, 0.7)), None, 1.0, True), (Spread((0.5, 1.2)), None, 1.0, None),
    (Spread((2.5, 3.0)), 1.0, 2.0, False)])
def test_judge_reads_the_spread(value, low, high, holds):
    assert claims.judge(value, low, high) is holds


def test_judge_rejects_bad_edges():
    for args in [(1.0, None, None), (1.0, 2.0, 1.0), (float("nan"), 0.0, 1.0)]:
        with pytest.raises(ValueError):
            claims.judge(*args)


def test_verdicts_are_read_back_from_an_executed_notebook(tmp_path):
    """What compare_runs reads: the record stored beside the sentence, under VERDICT_MIME."""
    from IPython.core.formatters import format_display_data

    bundle, _ = format_display_data(claims._Claimed("within", {"verdict": "true",
                                                               "bound": "device"}))
    prefix = "application/papermill.record/"
    nb = {"cells": [{"cell_type": "code", "outputs": [{
        "output_type": "display_data", "metadata": {"scrapbook": {"name": "c",
                                                                  "mime_prefix": prefix}},
        "data": {prefix + k: v for k, v in bundle.items()}}]}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert claims.read_verdicts(path) == {"c": {"verdict": "true", "bound": "device"}}
    from perflab.record.provenance import read_glued
    assert read_glued(path) == {"c": "within"}


def test_a_spread_across_zero_reads_as_a_range_not_a_dashed_negative(glued):
    """Chapter 10's saving read "-0.17–2.74x": a minus then a dash. Across zero: "x to y"."""
    across_zero = Spread((-0.17, 0.8, 1.4, 2.74, 1.1))
    assert claims.compare("z", across_zero, 1.0, 0.25, bound="device") == "undecided"
    assert "-0.17x to 2.74x" in glued["z_spread"] and "-0.17–" not in glued["z_spread"]


def test_a_spread_whose_ends_print_alike_is_one_value_not_a_range(glued):
    """Reader review M2: "(1.00x it; 1.00–1.00x, min–max over 5 rounds)" fourteen times."""
    claims.compare("same", Spread((1.0001, 1.0002, 1.0, 1.0003, 0.9999)), 1.0, 0.25,
                   bound="device")
    assert glued["same_spread"].startswith("1.00x the prediction (the same in each of 5 rounds)")
    claims.compare("far", Spread((2.0, 2.001, 2.002)), 1.0, 0.25, bound="device")
    assert glued["far_spread"].startswith("2.00x the prediction (the same in each of 3 rounds)")


def test_compare_glues_a_short_phrase_and_its_spread_for_the_note(glued):
    """Reader review R4: "within 25 % of the prediction (1.02x it; 0.99–1.12x, inter-quartile
    range over 8 rounds)" in running prose, 92 times. The prose gets a short phrase whose
    verdict is still the computed one; the spread, the band and the rounds go under
    ``<name>_spread``, for the page's folded note."""
    rounds = Spread((0.99, 1.0, 1.02, 1.05, 1.12, 1.01, 1.03, 0.98))
    for name, value, words in [("a", rounds, "as predicted"), ("b", rounds * 1.6, "outside"),
                               ("c", rounds * 1.22, "undecided")]:
        v = claims.compare(name, value, 1.0, 0.25, bound="device")
        assert glued[name].startswith(words) and v.phrase == glued[name]
        assert v.detail == glued[name + claims.SPREAD_SUFFIX]
        assert glued.records[name]["verdict"] == {"a": "true", "b": "false",
                                                  "c": "undecided"}[name]
        for long_words in ("inter-quartile", "rounds", "band of", "prediction ("):
            assert long_words not in glued[name]
        assert "inter-quartile range over 8 rounds" in glued[name + "_spread"]
        assert "0.75–1.25x (±25 %)" in glued[name + "_spread"]
        assert len(glued[name].split()) <= 9
    assert abs(claims.compare("d", 2.0, 1.0, 0.25, bound="host").ratio - 2.0) < 1e-12


def test_a_single_pass_verdict_says_it_has_no_spread(glued):
    """A quantity measured once (a cold read) is declared single_pass: the prose's phrase, the
    note's sentence and a claim's sentence say "one pass, no spread", the record marks it, and
    a measurement with rounds cannot be declared one pass."""
    v = claims.compare("cold", 0.9, 1.0, 0.25, bound="host", single_pass=True)
    assert v.phrase == glued["cold"] == "as predicted (0.90x, one pass, no spread)"
    assert "(one pass, no spread)" in glued["cold_spread"]
    assert glued.records["cold"]["single_pass"] is True
    claims.compare("cold_miss", 2.0, 1.0, 0.25, bound="host", single_pass=True)
    assert glued["cold_miss"] == "outside the 25 % band (2.00x, one pass, no spread)"
    claims.compare("cold_none", -1.0, 1.0, 0.25, bound="host", single_pass=True)
    assert "one pass, no spread" in glued["cold_none"]
    assert "one pass" in glued["cold_none_spread"]
    claims.compare("plain", 0.9, 1.0, 0.25, bound="host")
    assert "one pass" not in glued["plain"] + glued["plain_spread"]
    assert "single_pass" not in glued.records["plain"]
    with pytest.raises(ValueError, match="single_pass"):
        claims.compare("r", Spread((0.9, 1.0, 1.1)), 1.0, 0.25, bound="host", single_pass=True)
    assert claims.claim("once", True, "no faster.", "faster.", bound="host",
                        single_pass=True) == "no faster (one pass, no spread)."
    assert glued.records["once"] == {"verdict": "true", "bound": "host", "single_pass": True}
    assert claims.claim("once2", False, "x", "faster", bound="host",
                        single_pass=True) == "faster (one pass, no spread)"


def test_not_compared_glues_the_claim_and_its_spread(glued):
    """Where a compare() cannot run, the prose's verdict and the note's spread both need text."""
    claims.not_compared("a_vs_prediction", "b_vs_prediction", why="not measured (no GPU)")
    assert glued["a_vs_prediction"] == glued["b_vs_prediction_spread"] == "not measured (no GPU)"
    with pytest.raises(ValueError, match="why"):
        claims.not_compared("a", why=None)
    with pytest.raises(ValueError):
        claims.not_compared(why="x")
    with pytest.raises(ValueError, match="identifier"):
        claims.not_compared("a b", why="x")


def test_reach_judges_how_far_the_rounds_reach(glued):
    # eight ratios to their own median: the IQR 0.97-1.03 lies inside 0.9-1.1
    calm = Spread((0.96, 0.97, 0.99, 1.0, 1.0, 1.01, 1.03, 1.05))
    assert claims.reach("lock", calm, 0.9, 1.1, bound="device", if_inside="steady",
                        if_beyond="moving") == "steady"
    rec = glued.records["lock"]
    assert rec["verdict"] == "true" and rec["band_lo"] == 0.9 and rec["band_hi"] == 1.1
    assert rec["rounds"] == 8 and rec["lo"] == calm.lo and rec["hi"] == calm.hi
    assert glued["lock_spread"].endswith("against its band of 0.90x–1.10x: inside")
    assert "inter-quartile range over 8 rounds" in glued["lock_spread"]
    # the upper quartile past 1.1: false, never undecided (the spread is the quantity)
    wide = Spread((0.8, 0.85, 0.95, 1.0, 1.0, 1.12, 1.2, 1.3))
    assert claims.reach("lock2", wide, 0.9, 1.1, bound="device", if_inside="steady",
                        if_beyond="moving") == "moving"
    assert glued.records["lock2"]["verdict"] == "false"
    assert "reaching past an edge" in glued["lock2_spread"]
    low = Spread((0.5, 0.6, 0.6, 0.7, 1.0, 1.0))           # min-max below 8 rounds
    claims.reach("lock3", low, 0.9, 1.1, bound="host", if_inside="a", if_beyond="b")
    assert glued.records["lock3"]["verdict"] == "false"


@pytest.mark.parametrize("spread, low, high, match", [
    (1.0, 0.9, 1.1, "Spread"),                             # a number has no reach
    (Spread((1.0,)), 0.9, 1.1, "at least 2"),
    (Spread((1.0, 1.0)), 1.1, 0.9, "0 < low < high"),
    (Spread((1.0, 1.0)), -1e9, 1e9, "0 < low < high"),     # no factor: cannot fail
    (Spread((1.0, 1.0)), 0.4, 1.1, "factor"),              # a band that can hardly fail
    (Spread((1.0, 1.0)), float("nan"), 1.1, "low"),
])
def test_reach_refuses_bad_input(glued, spread, low, high, match):
    with pytest.raises(ValueError, match=match):
        claims.reach("r", spread, low, high, bound="device", if_inside="a", if_beyond="b")
