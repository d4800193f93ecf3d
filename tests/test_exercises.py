import pytest

from perflab import exercises as E


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
    assert "0.50" in table and "—" in table
