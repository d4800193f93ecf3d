"""perflab.record.claims: sentences chosen by the data, and typed sentences checked against it."""

import numpy as np
import pytest

from perflab.record import claims


@pytest.fixture
def glued(monkeypatch):
    seen = {}
    monkeypatch.setattr(claims, "glue", lambda name, value: seen.__setitem__(name, value))
    return seen


def test_claim_glues_the_sentence_the_data_supports(glued):
    assert claims.claim("fused", 1.0 < 2.0, "faster", "slower") == "faster"
    assert glued["fused"] == "faster"
    assert claims.claim("fused2", bool(np.float64(3) < 2), "faster", "slower") == "slower"
    assert claims.claim("np", np.float64(1) < np.float64(2), "yes", "no") == "yes"


def test_expect_records_true_and_false(glued, capsys):
    # None, so a cell ending in expect(...) prints no stray True on the page
    assert claims.expect("knee_in_range", True, "the knee lies between 32 and 64") is None
    assert claims.expect("plateau", False, "the plateau is flat") is None
    assert glued == {"expect_knee_in_range": True, "expect_plateau": False}
    assert "does not hold" in capsys.readouterr().out


@pytest.mark.parametrize("call", [
    lambda: claims.claim("bad name", True, "a", "b"),
    lambda: claims.claim("x", 1, "a", "b"),
    lambda: claims.claim("x", True, "", "b"),
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
