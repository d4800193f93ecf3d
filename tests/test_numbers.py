"""perflab.record.numbers: numbers as a person writes them (CONTRIBUTING.md, "Numbers"): fmt,
and sig, nbytes, fmt_small, power10, format_spec (the book's glue:text formats through it)."""

import math
import re

import numpy as np
import pytest
import torch

from perflab.record.numbers import BAD_SHAPES, fmt, fmt_small, format_spec, nbytes, power10, sig

BAD = [re.compile(rx) for rx in BAD_SHAPES.values()]


@pytest.mark.parametrize("value, unit, kwargs, text", [
    (1.42e9, "B", {}, "1.42 GB"),
    (2.2e9, "iB", {}, "2.05 GiB"),
    (734_577_152, "iB", {}, "701 MiB"),
    (2.05e3 * 2**20, "iB", {}, "2 GiB"),              # the issue's "2.05e+03 MiB"
    (512, "iB", {}, "512 B"),
    (2**30, "iB", {}, "1 GiB"),                          # not "1024 MiB": the written mantissa decides
    (1023.6, "iB", {}, "1 KiB"),
    (0, "B", {}, "0 B"),
    (3.9e12, "B/s", {}, "3.9 TB/s"),
    (989.5e12, "FLOP/s", {"sig": 4}, "989.5 TFLOP/s"),
    (1.83e9, "Hz", {}, "1.83 GHz"),
    (0.0123, "s", {}, "12.3 ms"),
    (4.5e-7, "s", {}, "450 ns"),
    (95, "s", {}, "1.58 min"),
    (7200, "s", {}, "2 h"),
    (510_525, "tokens/s", {}, "511k tokens/s"),
    (2_873_375, "tokens", {}, "2.87M tokens"),
    (0.003, "%", {"signed": True}, "+0.3 %"),
    (0.0, "%", {"signed": True}, "0 %"),
    (-0.021, "%", {"signed": True}, "-2.1 %"),
    (0.94, "%", {}, "94 %"),
    (3.1e-8, "%", {}, "<0.0001 %"),
    (-3.1e-8, "x", {}, ">-0.0001x"),
    (0.00123, "x", {}, "0.0012x"),
    (4.2e-9, "FLOP/s", {}, "4.2 nFLOP/s"),
    (0, "s", {}, "0 s"),
    (2.345, "x", {}, "2.35x"),
    (1234.5, "", {}, "1.23k"),
    (999.7, "B", {}, "1 kB"),
    (np.float64(1.5e9), "B", {}, "1.5 GB"),
    (torch.tensor(2.5e-3), "s", {}, "2.5 ms"),
])
def test_fmt_writes_numbers_as_a_person_would(value, unit, kwargs, text):
    assert fmt(value, unit, **kwargs) == text


@pytest.mark.parametrize("value", [0.0, 1e-30, 3.3e-9, 0.5, 1.0, 7.77, 123.456, 5.105e5, 2.05e3 * 2**20,
                                   734_577_152, 1e13, 9.999e11, -4.2e-4])
@pytest.mark.parametrize("unit", ["", "B", "iB", "s", "%", "x", "tokens/s", "FLOP/s"])
def test_fmt_never_writes_a_shape_the_book_rejects(value, unit):
    text = fmt(value, unit, signed=True)
    assert not any(rx.search(text) for rx in BAD), text
    assert "e+" not in text and "e-" not in text, text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", None, True])
def test_fmt_refuses_what_is_not_a_finite_number(bad):
    with pytest.raises(ValueError, match="finite real number"):
        fmt(bad, "B")


@pytest.mark.parametrize("text", ["+0.00 %", "0.0e+00 of difference", "2.05e+03 MiB", "734,577,152 bytes",
                                  "5.105e+05 tokens/s", "3.1415926 ms", "1/1.32e+03 of the matrix rate",
                                  "losses agree within 1.2e-05.", "a ratio of 3.1415926.", "1/1.32e+03."])
def test_the_bad_shapes_catch_the_issue_s_examples(text):
    assert any(rx.search(text) for rx in BAD), text


@pytest.mark.parametrize("text", ["1.42 GB", "+0.3 %", "510k tokens/s", "arXiv:1604.06174", "v2.11.0",
                                  "2026-12-01", "driver 580.159.04", "1e-3 tolerance",
                                  "https://x.org/a/1e+05", "1/1,320 of the matrix rate",
                                  "torch 2.11.0.", "see arXiv:1604.06174."])
def test_the_bad_shapes_leave_what_a_person_writes(text):
    assert not any(rx.search(text) for rx in BAD), text


def test_fmt_refuses_a_bad_sig():
    with pytest.raises(ValueError, match="sig"):
        fmt(1.0, "B", sig=0)


def test_sig_and_nbytes_never_write_exponents_or_long_byte_counts():
    assert sig(1234.5) == "1,230" and sig(0.012345) == "0.0123" and sig(0) == "0"
    assert sig(999.7) == "1,000" and sig(12.345, unit="ms") == "12.3 ms"
    assert nbytes(1_612_316_672) == "1.50 GiB" and nbytes(32 * 2**20) == "32.0 MiB"
    assert nbytes(512) == "512 B" and nbytes(-6.03 * 2**20) == "-6.03 MiB"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            sig(bad)


def test_fmt_small_writes_tiny_numbers_with_a_power_of_ten():
    assert fmt_small(4.5e-7) == "4.5 × 10⁻⁷" and fmt_small(-1.04e-5) == "-1.0 × 10⁻⁵"
    assert fmt_small(9.96e-6) == "1.0 × 10⁻⁵"                 # rounding up moves the exponent
    assert fmt_small(0.0123) == "0.012" and fmt_small(0) == "0" and fmt_small(0.18) == "0.18"
    with pytest.raises(ValueError):
        fmt_small(float("nan"))


def test_power10_writes_any_size_with_a_power_of_ten():
    assert power10(3.15e23) == "3.15 × 10²³"
    assert power10(3.4028e38, 2) == "3.4 × 10³⁸"
    assert power10(1.1755e-38) == "1.18 × 10⁻³⁸"
    assert power10(2**-23) == "1.19 × 10⁻⁷" and power10(1e6) == "1 × 10⁶"
    assert power10(-65504.0) == "-6.55 × 10⁴" and power10(0) == "0"
    assert power10(9.996e9) == "1 × 10¹⁰"              # rounding up moves the exponent
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            power10(bad)
    with pytest.raises(ValueError):
        power10(1.0, 0)


@pytest.mark.parametrize("value, spec, text", [
    (1320.4, ".3g", "1,320"),                 # Python: 1.32e+03 (chapter 1's "1/1.32e+03")
    (2.05e3, ".3g", "2,050"),                 # Python: 2.05e+03
    (5.105e5, ",.4g", "510,500"),             # Python: 5.105e+05
    (1000, ".3g", "1,000"),                   # an int through a float spec, as Python does
    (1.32e-5, ".2g", "1.3 × 10⁻⁵"),
    (1.32e-5, "", "1.32 × 10⁻⁵"),             # a bare float's repr: 1.32e-05
    (0.0123, ".2e", "0.0123"),
    (3.15e23, ".3e", "3.15 × 10²³"),
    (0.0, ".1e", "0"),                        # Python: 0.0e+00
    (0.0, "+.2%", "0%"),                      # Python: +0.00%
    (-0.0, ".1%", "0%"),
    (4.2e3, "+.2g", "+4,200"),
    (-4.5e3, "+.2g", "-4,500"),
    (1e20, ".3g", "1 × 10²⁰"),
    # what Python writes without an exponent is Python's
    (989.4, ".3g", "989"), (12.5, ".3g", "12.5"), (0.127, ".1%", "12.7%"), (0.003, "+.1%", "+0.3%"),
    (1234.5, ",.0f", "1,234"), (1234.0, "", "1234.0"), (3, "d", "3"), (7, ".3g", "7"),
    ("text", "s", "text"), ("1.32e+03", "", "1.32e+03"), (True, "", "True"),
])
def test_format_spec_writes_python_s_formats_as_a_person_would(value, spec, text):
    assert format_spec(value, spec) == text


@pytest.mark.parametrize("value", [0.0, 1e-30, 3.3e-9, 4.2e-4, 0.5, 7.77, 1320.4, 5.105e5, 2.05e3 * 2**20,
                                   734_577_152.0, 1e13, 9.999e11, 6.02e23, -1.32e3])
@pytest.mark.parametrize("spec", ["", ".3g", ".2g", ",.4g", "g", ".1e", ".3E", "+.2g", ".2%", "+.2%", ".0%", "n"])
def test_format_spec_never_writes_a_shape_the_book_rejects(value, spec):
    text = format_spec(value, spec)
    assert not any(rx.search(t) for rx in BAD for t in (text, f"1/{text}")), text
    assert not re.search(r"\d[eE][+-]?\d", text), text


def test_format_spec_raises_what_format_raises():
    with pytest.raises(ValueError):
        format_spec(1.5, ".3q")


@pytest.mark.parametrize("value, spec, text", [
    (3.1415926, ".7f", "3.1416"),             # more decimals than a measurement has
    (4.2e-4, "", "4.2 × 10⁻⁴"),               # Python: 0.00042
    (1.23e-3, ".3g", "1.23 × 10⁻³"),          # Python: 0.00123
    (2e-7, ".6f", "2 × 10⁻⁷"),                # four decimals would read 0.0000
    (0.1234567, ".5%", "12.3457%"),
])
def test_format_spec_keeps_to_four_decimals(value, spec, text):
    assert format_spec(value, spec) == text


def test_fmt_range_says_one_value_when_the_ends_agree_and_never_a_dash_after_a_minus():
    """Reader review M2: "336 ms–336 ms", "1.00–1.00x" and "-215 µs–-19 µs" on the pages."""
    from perflab.record.numbers import fmt_range

    assert fmt_range(0.336, 0.349, "s") == "336 ms–349 ms"
    assert fmt_range(0.3361, 0.3362, "s") == "336 ms"
    assert fmt_range(1.0004, 1.0011, write=lambda r: f"{r:.2f}x") == "1.00x"
    assert fmt_range(0.95, 1.10, write=lambda r: f"{r:.2f}x") == "0.95x–1.10x"
    assert fmt_range(-215e-6, 19e-6, "s").replace("−", "-") == "-215 µs to +19 µs"
    for bad in [(1.0, 0.5), (float("nan"), 1.0), (True, 1.0)]:
        with pytest.raises(ValueError):
            fmt_range(*bad)
