"""perflab.record.formatting: numbers as a person writes them, tables in one call."""

import pytest

from perflab.record import formatting as fm


def test_sig_and_nbytes_never_write_exponents_or_long_byte_counts():
    assert fm.sig(1234.5) == "1,230" and fm.sig(0.012345) == "0.0123" and fm.sig(0) == "0"
    assert fm.sig(999.7) == "1,000" and fm.sig(12.345, unit="ms") == "12.3 ms"
    assert fm.nbytes(1_612_316_672) == "1.50 GiB" and fm.nbytes(32 * 2**20) == "32.0 MiB"
    assert fm.nbytes(512) == "512 B" and fm.nbytes(-6.03 * 2**20) == "-6.03 MiB"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            fm.sig(bad)


def test_markdown_table_checks_its_shape():
    assert fm.markdown(["a", "b"], [[1, 2]]) == "| a | b |\n|:---|---:|\n| 1 | 2 |"
    with pytest.raises(ValueError, match="row 0"):
        fm.markdown(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="align"):
        fm.markdown(["a"], [[1]], align="c")


def test_small_writes_tiny_numbers_with_a_power_of_ten():
    assert fm.small(4.5e-7) == "4.5 × 10⁻⁷" and fm.small(-1.04e-5) == "-1.0 × 10⁻⁵"
    assert fm.small(9.96e-6) == "1.0 × 10⁻⁵"                 # rounding up moves the exponent
    assert fm.small(0.0123) == "0.012" and fm.small(0) == "0" and fm.small(0.18) == "0.18"
    with pytest.raises(ValueError):
        fm.small(float("nan"))


def test_power10_writes_any_size_with_a_power_of_ten():
    assert fm.power10(3.15e23) == "3.15 × 10²³"
    assert fm.power10(3.4028e38, 2) == "3.4 × 10³⁸"
    assert fm.power10(1.1755e-38) == "1.18 × 10⁻³⁸"
    assert fm.power10(2**-23) == "1.19 × 10⁻⁷" and fm.power10(1e6) == "1 × 10⁶"
    assert fm.power10(-65504.0) == "-6.55 × 10⁴" and fm.power10(0) == "0"
    assert fm.power10(9.996e9) == "1 × 10¹⁰"              # rounding up moves the exponent
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            fm.power10(bad)
    with pytest.raises(ValueError):
        fm.power10(1.0, 0)
