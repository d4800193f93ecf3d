"""perflab.core.nvml: the one NVML reader (no GPU here: every reading must be None, not an error)."""

import pytest

from perflab.core import device, nvml


@pytest.mark.skipif(device.has_gpu(), reason="checks the behaviour without a GPU")
def test_without_nvml_every_reading_is_none():
    assert nvml.readings() is None and nvml.utilization_pct() is None
    assert nvml.max_sm_clock_hz() is None and nvml.driver_version() is None


def test_reasons_names_each_set_bit_from_one_table():
    assert nvml.reasons(None) is None
    assert nvml.reasons(0x1 | 0x4) == ["idle", "software power cap"]
    with pytest.raises(ValueError, match="index"):
        nvml.readings(-1)


def test_cpuinfo_is_read_in_one_place():
    blocks = device.cpuinfo()
    assert isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)
    if blocks:
        assert device.cpu_name() == blocks[0].get("model name", device.cpu_name())


class _FakeNVML:
    """The few pynvml names nvml.nvlinks reads, for a board whose GPU has links 0-3: 0-2 active
    at 26,562 MB/s to an NVSwitch, 3 inactive; links 4 and up not answered."""

    NVML_FEATURE_ENABLED, NVML_NVLINK_MAX_LINKS, NVML_SUCCESS = 1, 18, 0
    NVML_FI_DEV_NVLINK_GET_SPEED, NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 164, 91
    NVML_VALUE_TYPE_UNSIGNED_INT = 1

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link > 3:
            raise self.NVMLError("not supported")
        return 0 if link == 3 else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 2

    def nvmlDeviceGetFieldValues(self, h, fields):
        from types import SimpleNamespace

        (field, scope), = fields
        speed = 26562 if field == 164 and scope < 3 else 0
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=speed))]


def test_nvlinks_lists_the_links_the_driver_answers(monkeypatch):
    fake = _FakeNVML()
    monkeypatch.setattr(nvml, "_pynvml", lambda: fake)
    monkeypatch.setattr(nvml, "handle", lambda index=0: "h")
    links = nvml.nvlinks(0)
    assert [link["link"] for link in links] == [0, 1, 2, 3]
    assert [link["active"] for link in links] == [True, True, True, False]
    assert links[0]["speed_Bps"] == 26562e6 and links[3]["speed_Bps"] is None
    assert {link["remote"] for link in links} == {"NVSwitch"}
    # a driver that answers no link (one GPU of a board passed to a VM): an empty list
    monkeypatch.setattr(fake, "nvmlDeviceGetNvLinkState",
                        lambda h, link: (_ for _ in ()).throw(fake.NVMLError("not supported")))
    assert nvml.nvlinks(0) == []


@pytest.mark.skipif(device.has_gpu(), reason="checks the behaviour without a GPU")
def test_nvlinks_without_nvml_is_none():
    assert nvml.nvlinks() is None
