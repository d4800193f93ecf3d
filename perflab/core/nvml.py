"""The one reader of NVIDIA's management library (NVML): how a GPU is running right now.

Every module that wants a clock, a power draw, a temperature, a throttle reason, the PCIe link or
NVLink state reads it here (:func:`readings`), so there is one set of units (Hz, watts, degrees
Celsius) and one table of clock-event reasons. Nothing here *sets* anything (clocks, power
limits, modes). Without nvidia-ml-py, a driver or a GPU every function returns None: callers say
in one sentence what they could not read.

Source: NVIDIA Management Library (NVML) API reference, "Device Queries" and "Clocks Event
Reasons" (``nvmlDeviceGetCurrentClocksEventReasons``, formerly ``...ThrottleReasons``).
"""

from __future__ import annotations

import functools
from typing import Any

from perflab.core.validate import number

__all__ = ["CLOCK_EVENT_REASONS", "POWER_INSTANT_FIELD", "clock_settings", "device_count",
           "driver_version", "handle", "max_sm_clock_hz", "memory_used_bytes", "nvlinks",
           "readings", "utilization_pct"]

#: ``NVML_FI_DEV_POWER_INSTANT``: the board's instantaneous power draw in milliwatts, a field of
#: ``nvmlDeviceGetFieldValues`` (drivers of 2023 on). ``nvmlDeviceGetPowerUsage`` is not
#: instantaneous on Ampere (GA100 aside) and newer GPUs: there it returns the power averaged over
#: the last second (NVML API reference, ``nvmlDeviceGetPowerUsage``), so a reading taken during a
#: 0.1 s benchmark mostly reports the second before it.
POWER_INSTANT_FIELD = 186

#: Bits of ``nvmlDeviceGetCurrentClocksEventReasons``: why the SM clock is below its maximum now.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}


def _pynvml():
    # optional: nvidia-ml-py is the `gpu` extra; a CPU machine has no NVML to read
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@functools.lru_cache(maxsize=None)
def handle(index: int = 0):
    """An NVML device handle for GPU ``index``, or None when nvidia-ml-py, the driver or the GPU
    is missing. The handle is for reading only.

    Raises:
        ValueError: ``index`` is negative.
    """
    number("index", index, minimum=0)
    pynvml = _pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:  # no driver, no such device: both mean "cannot read"
        return None


def _hz(mhz: float | None) -> float | None:
    """NVML's megahertz as hertz (None stays None)."""
    return None if mhz is None else mhz * 1e6


def _watts(milliwatts: float | None) -> float | None:
    """NVML's milliwatts as watts (None stays None)."""
    return None if milliwatts is None else milliwatts / 1e3


def _call(name: str, *args):
    """Call the NVML getter ``name``; None when this nvidia-ml-py lacks it or the driver cannot
    answer (not supported, no permission)."""
    pynvml = _pynvml()
    fn = getattr(pynvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def reasons(mask: int | None) -> list[str] | None:
    """Names (from :data:`CLOCK_EVENT_REASONS`) of the bits set in a clock-event mask."""
    return None if mask is None else [text for bit, text in CLOCK_EVENT_REASONS.items() if mask & bit]


def readings(index: int = 0, links: bool = True) -> dict[str, Any] | None:
    """How GPU ``index`` is running now; None when NVML is unavailable.

    Returns a dict (each value None when the driver does not answer that query):
    ``sm_clock_hz``/``sm_clock_max_hz``, ``mem_clock_hz``/``mem_clock_max_hz`` (Hz),
    ``memory_bus_width_bits``, ``power_w`` (watts, ``nvmlDeviceGetPowerUsage``: averaged over
    the last second on Ampere and newer GPUs, GA100 aside), ``power_instant_w`` (watts, the
    instantaneous field :data:`POWER_INSTANT_FIELD`, None where the driver lacks it),
    ``power_limit_w`` (watts; the enforced limit),
    ``temperature_c``, ``pstate`` (performance state, 0 = fastest), ``utilization_pct`` (percent
    of the last sample period in which any kernel ran), ``clock_event_reasons`` (names from
    :data:`CLOCK_EVENT_REASONS`, e.g. ``["idle"]``), and with ``links=True`` the PCIe link
    (``pcie_gen``, ``pcie_width``, ``pcie_gen_max``, ``pcie_width_max``) and ``nvlinks_active``.
    ``links=False`` skips the link queries (about 20 calls) for samplers that poll often.

    Raises:
        ValueError: ``index`` is negative.
    """
    h = handle(index)
    if h is None:
        return None
    pynvml = _pynvml()
    util = _call("nvmlDeviceGetUtilizationRates", h)
    mask = _call("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = _call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    out = {
        "sm_clock_hz": _hz(_call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)),
        "sm_clock_max_hz": _hz(_call("nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_SM)),
        "mem_clock_hz": _hz(_call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)),
        "mem_clock_max_hz": _hz(_call("nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_MEM)),
        "memory_bus_width_bits": _call("nvmlDeviceGetMemoryBusWidth", h),
        "power_w": _watts(_call("nvmlDeviceGetPowerUsage", h)),
        "power_instant_w": _watts(_field(h, POWER_INSTANT_FIELD)),
        "power_limit_w": _watts(_call("nvmlDeviceGetEnforcedPowerLimit", h)),
        "temperature_c": _call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU),
        "pstate": _call("nvmlDeviceGetPerformanceState", h),
        "utilization_pct": util.gpu if util is not None else None,
        "clock_event_reasons": reasons(mask),
    }
    if links:
        states = [_call("nvmlDeviceGetNvLinkState", h, link)
                  for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))]
        enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
        out.update(
            pcie_gen=_call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_width=_call("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_gen_max=_call("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width_max=_call("nvmlDeviceGetMaxPcieLinkWidth", h),
            nvlinks_active=(sum(1 for s in states if s == enabled)
                            if any(s is not None for s in states) else None),
        )
    return out


#: ``nvmlDeviceGetNvLinkRemoteDeviceType``: what the other end of a link is.
NVLINK_REMOTE = {0: "GPU", 1: "IBM NPU", 2: "NVSwitch"}


def _field(h, field_id: int | None, scope: int = 0):
    """One NVML field value (``nvmlDeviceGetFieldValues``) as a Python number, or None when this
    nvidia-ml-py lacks the field or the driver does not answer it."""
    pynvml = _pynvml()
    if field_id is None:
        return None
    values = _call("nvmlDeviceGetFieldValues", h, [(field_id, scope)])
    if not values or values[0].nvmlReturn != getattr(pynvml, "NVML_SUCCESS", 0):
        return None
    kind = {getattr(pynvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
            getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
            getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
            getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
            getattr(pynvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
            getattr(pynvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal"}.get(values[0].valueType)
    return None if kind is None else getattr(values[0].value, kind)


def nvlinks(index: int = 0) -> list[dict[str, Any]] | None:
    """The NVLink links of GPU ``index`` as the driver reports them; None when NVML is unavailable.

    One dict per link whose state the driver answers (links ``0 .. NVML_NVLINK_MAX_LINKS - 1``):
    ``link`` (its number), ``active`` (bool: ``nvmlDeviceGetNvLinkState``), ``speed_Bps`` (its
    data rate in one direction, bytes/s, from the field ``NVML_FI_DEV_NVLINK_GET_SPEED``, which
    NVML gives in MB/s, else the common speed of the active links; None when not answered) and
    ``remote`` (what the other end is: ``"GPU"``, ``"NVSwitch"``, ... from
    :data:`NVLINK_REMOTE`; None when not answered). An empty list: the driver answers no link's
    state, as on a GPU without NVLink, or on a virtual machine given one GPU of a board whose
    links it does not expose.

    Raises:
        ValueError: ``index`` is negative.
    """
    h = handle(index)
    if h is None:
        return None
    pynvml = _pynvml()
    enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
    common = _field(h, getattr(pynvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None))
    links = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _call("nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            continue
        mbps = _field(h, getattr(pynvml, "NVML_FI_DEV_NVLINK_GET_SPEED", None), link) or common
        remote = _call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        links.append({"link": link, "active": state == enabled,
                      "speed_Bps": mbps * 1e6 if mbps else None,
                      "remote": NVLINK_REMOTE.get(remote) if remote is not None else None})
    return links


def clock_settings(index: int = 0) -> dict[str, Any] | None:
    """How GPU ``index``'s clocks are set up (read only; nothing here changes them); None
    without NVML. Each value None when the driver does not answer.

    Returns ``sm_clock_max_hz`` (the chip's maximum), ``app_sm_clock_hz`` (the application
    clock target: the clock a kernel runs at unless power or heat lower it, set by
    ``nvidia-smi -ac``), ``default_app_sm_clock_hz`` (its default), ``supported_sm_clocks_hz``
    (the SM clocks the driver can lock to at the maximum memory clock, highest first; the
    values ``nvidia-smi -lgc`` accepts), ``compute_mode`` (``"default"``,
    ``"exclusive process"``, ``"prohibited"``: whether other processes may use the GPU) and
    ``processes`` (compute processes on the GPU now, this one included).

    Raises:
        ValueError: ``index`` is negative.
    """
    h = handle(index)
    if h is None:
        return None
    pynvml = _pynvml()
    mem_max = _call("nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_MEM)
    supported = (_call("nvmlDeviceGetSupportedGraphicsClocks", h, mem_max)
                 if mem_max is not None else None)
    mode = _call("nvmlDeviceGetComputeMode", h)
    procs = _call("nvmlDeviceGetComputeRunningProcesses", h)
    return {
        "sm_clock_max_hz": _hz(_call("nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_SM)),
        "app_sm_clock_hz": _hz(_call("nvmlDeviceGetApplicationsClock", h, pynvml.NVML_CLOCK_SM)),
        "default_app_sm_clock_hz": _hz(_call("nvmlDeviceGetDefaultApplicationsClock", h,
                                            pynvml.NVML_CLOCK_SM)),
        "supported_sm_clocks_hz": (sorted((c * 1e6 for c in supported), reverse=True)
                                   if supported else None),
        "compute_mode": {0: "default", 1: "exclusive thread", 2: "prohibited",
                         3: "exclusive process"}.get(mode) if mode is not None else None,
        "processes": len(procs) if procs is not None else None,
    }


def utilization_pct(index: int = 0) -> int | None:
    """NVML's ``gpu`` utilization of GPU ``index`` in percent, or None when NVML cannot say."""
    h = handle(index)
    util = None if h is None else _call("nvmlDeviceGetUtilizationRates", h)
    return None if util is None else util.gpu


def memory_used_bytes(index: int = 0) -> int | None:
    """Bytes of GPU ``index``'s memory in use by every process (``nvmlDeviceGetMemoryInfo``'s
    ``used``, what ``nvidia-smi`` shows), or None when NVML cannot say. Unlike
    ``torch.cuda.memory_allocated`` it sees other processes (a notebook's kernel, torchrun's
    workers) and the CUDA context itself."""
    h = handle(index)
    info = None if h is None else _call("nvmlDeviceGetMemoryInfo", h)
    return None if info is None else int(info.used)


def device_count() -> int:
    """Number of GPUs NVML sees (0 without nvidia-ml-py, a driver or a GPU). It ignores
    ``CUDA_VISIBLE_DEVICES``, which only torch's numbering follows."""
    if _pynvml() is None or handle(0) is None:
        return 0
    return _call("nvmlDeviceGetCount") or 0


def max_sm_clock_hz(index: int = 0) -> float | None:
    """The GPU's maximum SM clock in Hz; None when NVML cannot answer."""
    h = handle(index)
    if h is None:
        return None
    mhz = _call("nvmlDeviceGetMaxClockInfo", h, _pynvml().NVML_CLOCK_SM)
    return None if mhz is None else mhz * 1e6


def driver_version() -> str | None:
    """The NVIDIA driver's version string, or None without NVML."""
    if handle(0) is None:
        return None
    version = _call("nvmlSystemGetDriverVersion")
    return version.decode() if isinstance(version, bytes) else version


def uuid(index: int = 0) -> str | None:
    """GPU ``index``'s UUID (``"GPU-…"``, ``nvmlDeviceGetUUID``): the one name that tells two
    GPUs of the same product apart; None without NVML."""
    h = handle(index)
    if h is None:
        return None
    value = _call("nvmlDeviceGetUUID", h)
    return value.decode() if isinstance(value, bytes) else value


def process_memory_bytes(pid: int, index: int = 0) -> int | None:
    """Bytes of GPU ``index``'s memory that process ``pid`` uses (its CUDA context plus what its
    allocators reserved: ``nvmlDeviceGetComputeRunningProcesses``' ``usedGpuMemory``), 0 when
    the process has no context on the GPU, None when NVML cannot say (no NVML, or a container
    that hides other processes' ids)."""
    h = handle(index)
    procs = None if h is None else _call("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return None
    for p in procs:
        if getattr(p, "pid", None) == pid:
            used = getattr(p, "usedGpuMemory", None)
            return None if used is None else int(used)
    return 0
