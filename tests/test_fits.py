"""perflab.core.fits: the one fixed-cost + linear fit."""

import pytest

from perflab.core.fits import fit_line


def test_an_exact_line_is_recovered_plain_and_relative():
    x = [1, 10, 100, 1000]
    y = [2e-6 + 3e-9 * v for v in x]
    for relative in (False, True):
        fit = fit_line(x, y, relative=relative)
        assert fit.fixed == pytest.approx(2e-6) and fit.slope == pytest.approx(3e-9)
        assert fit.rms_relative < 1e-9 and fit.points == 4 and fit(10) == pytest.approx(y[1])


def test_relative_weights_let_small_points_set_the_intercept():
    x = [1, 2, 1e6, 2e6]
    y = [1e-6, 1e-6, 1.0, 2.0 * 1.05]      # the largest point is 5 % off the line
    plain, rel = fit_line(x, y), fit_line(x, y, relative=True)
    assert abs(rel.fixed - 1e-6) < abs(plain.fixed - 1e-6)


@pytest.mark.parametrize("x, y, kw, word", [([1], [1], {}, "two distinct"), ([1, 1], [1, 2], {}, "two distinct"),
                                            ([1, 2], [1], {}, "same length"),
                                            ([1, 2], [1, 0], {"relative": True}, "y > 0"),
                                            ([1, 2], [1, float("nan")], {}, "finite")])
def test_bad_input_names_the_problem(x, y, kw, word):
    with pytest.raises(ValueError, match=word):
        fit_line(x, y, **kw)
