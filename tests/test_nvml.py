"""perflab.core.nvml: the one NVML reader (no GPU here: every reading must be None, not an error)."""

import pytest

from perflab.core import device as hardware, nvml


@pytest.mark.skipif(hardware.has_gpu(), reason="checks the behaviour without a GPU")
def test_without_nvml_every_reading_is_none():
    assert nvml.readings() is None and nvml.utilization_pct() is None
    assert nvml.max_sm_clock_hz() is None and nvml.driver_version() is None


def test_reasons_names_each_set_bit_from_one_table():
    assert nvml.reasons(None) is None
    assert nvml.reasons(0x1 | 0x4) == ["idle", "software power cap"]
    with pytest.raises(ValueError, match="index"):
        nvml.readings(-1)


def test_cpuinfo_is_read_in_one_place():
    blocks = hardware.cpuinfo()
    assert isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)
    if blocks:
        assert hardware.cpu_name() == blocks[0].get("model name", hardware.cpu_name())
