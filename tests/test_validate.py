"""perflab.core.validate: every rule accepts what it allows and names the argument it refuses."""

import math
import re

import numpy as np
import pytest

from perflab.core.validate import integer, integers, number, one_of, positive, positive_int


def test_positive_int_accepts_counts_and_refuses_the_rest():
    assert positive_int("steps", 3) == 3
    for bad in (0, -1, 2.0, True, None, "3"):
        with pytest.raises(ValueError, match=r"^steps must be a positive integer, got "):
            positive_int("steps", bad)


def test_integer_bounds_and_multiples():
    assert integer("n", 32, 16, multiple_of=16) == 32
    assert integer("seed", 0, 0, 2**32 - 1) == 0
    assert integer("width", 32, 1, 32) == 32
    with pytest.raises(ValueError, match="n must be an integer >= 16 and a multiple of 16, got 24"):
        integer("n", 24, 16, multiple_of=16)
    with pytest.raises(ValueError, match="width must be an integer from 1 to 32, got 33"):
        integer("width", 33, 1, 32)
    with pytest.raises(ValueError, match=r"shape\[0\] must be an integer >= 0, got -1"):
        integer("shape[0]", -1, 0)


def test_integers_needs_a_non_empty_sequence_of_good_items():
    assert integers("sizes", (8, 16), 8, multiple_of=8) == [8, 16]
    for bad in ([], [8, 12], [8, True], None, [0]):
        with pytest.raises(ValueError, match="sizes must be a non-empty sequence of"):
            integers("sizes", bad, 8, multiple_of=8)


def test_positive_refuses_zero_negative_non_finite_and_non_numbers():
    assert positive("block_s", 1) == 1.0 and isinstance(positive("block_s", 1), float)
    for bad in (0, -1e-9, math.inf, math.nan, None, True, "1"):
        with pytest.raises(ValueError, match=r"^block_s must be a positive finite number, got "):
            positive("block_s", bad)


def test_number_checks_finite_reals_against_inclusive_and_exclusive_bounds():
    assert number("x", 0, minimum=0) == 0.0 and number("x", np.float32(0.5), above=0, maximum=1) == 0.5
    assert number("x", np.int64(3), minimum=1) == 3.0 and number("x", -7.5) == -7.5
    for bad, kwargs, rule in [(-1e-9, dict(minimum=0), ">= 0"), (0, dict(above=0), "> 0"),
                              (1.5, dict(above=0, maximum=1), "> 0 and <= 1"), (1, dict(below=1), "< 1"),
                              (float("nan"), {}, "finite number, got nan"), (True, {}, "True"),
                              ("1", dict(minimum=0), "'1'"), (None, {}, "None")]:
        with pytest.raises(ValueError, match=re.escape(rule)) as err:
            number("tolerance", bad, **kwargs)
        assert str(err.value).startswith("tolerance must be a finite number")


def test_one_of_names_the_choices():
    assert one_of("mode", "bf16", ("fp32", "bf16")) == "bf16"
    with pytest.raises(ValueError, match=r"^what must be one of 'decode', 'pipeline', got 'x'$"):
        one_of("what", "x", ("decode", "pipeline"))
