"""perflab.core.rounds: interleaved rounds and the spread of what they measured."""

import pytest

from perflab.core.ranking import leader, outranked
from perflab.core.rounds import IQR_FROM, Spread, interleaved, spread


def test_spread_is_the_range_then_the_iqr():
    s = spread([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (s.median, s.lo, s.hi, s.n) == (3.0, 1.0, 5.0, 5)
    assert s.kind == "min–max over 5 rounds"
    many = spread([1.0] * (IQR_FROM - 1) + [100.0])             # one stray round
    assert many.hi == 1.0 and "inter-quartile" in many.kind   # no longer decides
    assert spread([2.0, 2.0]).relative_width == 0.0


def test_ratios_are_taken_round_by_round():
    """A drift that slows both variants of a round cancels in their ratio."""
    a = Spread((1.0, 2.0, 4.0))           # the machine slows down over the rounds
    b = Spread((2.0, 4.0, 8.0))
    r = b / a
    assert r.values == (2.0, 2.0, 2.0) and r.lo == r.hi == 2.0
    assert (a * 2).values == (2.0, 4.0, 8.0) and (1 / a).values == (1.0, 0.5, 0.25)
    assert (b - a).values == (1.0, 2.0, 4.0) and float(a) == 2.0
    with pytest.raises(ValueError, match="same rounds"):
        a / Spread((1.0,))


def test_interleaved_rotates_the_order_and_drops_warmup_rounds():
    order = []

    def variant(name, value):
        def run():
            order.append(name)
            return value
        return run

    out = interleaved({"a": variant("a", 1.0), "b": variant("b", 2.0), "c": variant("c", 3.0)},
                      rounds=3, warmup=1)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert list(out) == ["a", "b", "c"] and out["b"].values == (2.0, 2.0, 2.0)


@pytest.mark.parametrize("kwargs", [{"rounds": 0}, {"warmup": -1}, {"warmup": 1.5}])
def test_bad_arguments_name_themselves(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        interleaved({"a": lambda: 1.0}, **kwargs)


def test_bad_values_are_errors():
    with pytest.raises(ValueError, match="finite"):
        interleaved({"a": lambda: float("nan")})
    with pytest.raises(ValueError, match="work"):
        interleaved({})
    for bad in [(), (1.0, float("inf")), (True,)]:
        with pytest.raises(ValueError):
            Spread(bad)


def test_leader_must_lead_in_every_round():
    # b has the highest median and leads in every round
    assert leader({"a": spread([1, 2, 3]), "b": spread([1.5, 2.5, 3.5])}) == ("b", True)
    # b leads on the median, but a beats it in round 0: undecided
    assert leader({"a": spread([3, 1, 1]), "b": spread([2, 2, 2])}) == ("b", False)
    # a drift that lifts every variant alike does not decide it: round by round
    assert leader({"a": spread([1, 10, 100]), "b": spread([1.1, 11, 110]),
                   "c": spread([0.9, 9, 90])}) == ("b", True)
    assert leader({"only": spread([1.0])}) == ("only", True)


def test_outranked_settles_one_variant_without_ranking_the_rest():
    # the shape chapter 2's runs showed (values made up): two large sizes trade
    # places round by round, both beat 4096 in every round, so "4096 used the
    # cycles best" is settled (false) though the best size is not
    eff = {4096: spread([0.76, 0.77, 0.75]), 8192: spread([0.85, 0.80, 0.84]),
           16384: spread([0.82, 0.86, 0.83])}
    assert leader(eff)[1] is False                   # the best is not settled
    assert outranked(eff, 4096) == [8192, 16384]     # medians 0.84, 0.83
    assert outranked(eff, 8192) == []                # 16384 lost round 1
    # best median first
    assert outranked({"a": spread([1, 1]), "b": spread([3, 3]),
                      "c": spread([2, 2])}, "a") == ["b", "c"]
    with pytest.raises(ValueError, match="not among"):
        outranked(eff, 512)


def test_leader_rejects_bad_input():
    with pytest.raises(ValueError, match="spreads"):
        leader({})
    with pytest.raises(ValueError, match="spreads"):
        leader({"a": 1.0})
    with pytest.raises(ValueError, match="same number of rounds"):
        leader({"a": spread([1, 2]), "b": spread([1, 2, 3])})
