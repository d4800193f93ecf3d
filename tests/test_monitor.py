"""perflab.core.sampler: reading machine state (no GPU here: the GPU paths must say so clearly)."""

import pytest

from perflab.core import sampler as monitor
from perflab.core.device import has_gpu


def test_cpu_state_reads_cores_and_load():
    state = monitor.cpu_state()
    assert state["cores"] >= 1
    assert state["governor"] is None or isinstance(state["governor"], str)
    assert state["cur_mhz"] is None or all(f > 0 for f in state["cur_mhz"])


def test_machine_state_has_both_parts():
    state = monitor.machine_state()
    assert set(state) == {"gpu", "cpu"}
    if not has_gpu():
        assert state["gpu"] is None
    with pytest.raises(ValueError, match="index"):
        monitor.machine_state(-1)


@pytest.mark.skipif(has_gpu(), reason="checks the message on a machine without NVML")
def test_utilization_sampler_needs_nvml():
    with pytest.raises(RuntimeError, match="NVML"):
        with monitor.UtilizationSampler():
            pass


def test_utilization_sampler_arguments_and_values():
    with pytest.raises(ValueError, match="interval_s"):
        monitor.UtilizationSampler(interval_s=0)
    sampler = monitor.UtilizationSampler()
    sampler.samples.extend([(0.0, 90), (0.5, 95), (1.2, 40), (1.5, 60)])
    assert sampler.values(skip_s=1.0) == [40, 60]
    assert sampler.median_pct == 50
    empty = monitor.UtilizationSampler()
    with pytest.raises(ValueError, match="readings"):
        empty.median_pct
