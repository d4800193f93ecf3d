"""The GPU as a performance engineer sees it: its structure, its clocks, its math units, its waves.

* :func:`properties` reads what the chip is (SMs, warps, caches, memory bus) through torch; how
  it is running right now (clocks, power, PCIe link, NVLinks) is :func:`perflab.nvml.readings`.
  Nothing here sets clocks, power limits or modes.
* :func:`matmul_rates` measures matrix-multiply FLOP/s per number format (FP32 on the CUDA
  cores; TF32, bf16, fp16 and fp8 on the tensor cores; one :func:`perflab.roofline.matmul_rate`
  each) and :func:`elementwise_rate` the CUDA-core rate of a fused elementwise kernel, so the
  two kinds of math unit can be compared.
* :func:`tile_count`, :func:`wave_count` and :func:`wave_sweep` show how a matrix product's grid of
  output tiles maps onto the SMs in *waves*, and why run time grows in steps (wave quantization).

Units: bytes, Hz, watts, FLOP/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from .fits import fit_line
from .hardware import has_gpu
from .progress import progress as show_progress
from .roofline import SweepPoint, matmul_rate, sweep_repeat
from .timing import event_timer

__all__ = [
    "WaveFit",
    "available_matmul_kinds",
    "dram_bandwidth_from_clock",
    "elementwise_rate",
    "fit_waves",
    "matmul_rates",
    "properties",
    "tile_count",
    "wave_count",
    "wave_sweep",
]


def _need_gpu(what: str) -> None:
    if not has_gpu():
        raise RuntimeError(f"{what} needs a CUDA GPU; this machine has none")


def properties(index: int = 0) -> dict:
    """Structural facts of GPU ``index`` from ``torch.cuda.get_device_properties`` (read-only).

    Returns a dict: ``name``, ``compute_capability`` (e.g. ``"9.0"``), ``sm_count``, ``warp_size``
    (threads per warp), ``max_threads_per_sm``, ``max_warps_per_sm``, ``regs_per_sm`` (32-bit
    registers), ``shared_memory_per_sm`` (bytes), ``l2_bytes``, ``memory_bytes``. A field the
    installed torch does not expose is None.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: ``index`` names a GPU this machine does not have.
    """
    _need_gpu("properties()")
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"index={index} but this machine has {torch.cuda.device_count()} GPU(s)")
    p = torch.cuda.get_device_properties(index)
    get = lambda name: getattr(p, name, None)  # noqa: E731
    warp = get("warp_size") or 32  # 32 on every NVIDIA GPU so far (CUDA C++ Programming Guide)
    threads = get("max_threads_per_multi_processor")
    return {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "warp_size": warp,
        "max_threads_per_sm": threads,
        "max_warps_per_sm": threads // warp if threads else None,
        "regs_per_sm": get("regs_per_multiprocessor"),
        "shared_memory_per_sm": get("shared_memory_per_multiprocessor"),
        "l2_bytes": get("L2_cache_size"),
        "memory_bytes": p.total_memory,
    }


def dram_bandwidth_from_clock(bus_width_bits: int, mem_clock_hz: float, transfers_per_clock: int = 2) -> float:
    """Peak DRAM bandwidth in bytes/s: ``bus width / 8 x transfers per clock x memory clock``.

    HBM and GDDR move data on both clock edges (double data rate), hence the default 2. With the
    H100 SXM's 5120-bit bus and NVML's 2619 MHz memory clock this gives the datasheet's 3.35 TB/s.

    Raises:
        ValueError: a non-positive argument.
    """
    if bus_width_bits <= 0 or mem_clock_hz <= 0 or transfers_per_clock <= 0:
        raise ValueError(f"all arguments must be > 0, got bus_width_bits={bus_width_bits}, "
                         f"mem_clock_hz={mem_clock_hz}, transfers_per_clock={transfers_per_clock}")
    return bus_width_bits / 8 * transfers_per_clock * mem_clock_hz


def available_matmul_kinds(device: torch.device | str) -> list[str]:
    """The :data:`perflab.formats.FORMATS` keys worth measuring on ``device``.

    CPU: fp32 and bf16. CUDA: fp32, tf32, bf16, fp16, and fp8 where the chip has fp8 tensor cores
    (compute capability 8.9 or newer) and torch has ``float8_e4m3fn``.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return ["fp32", "bf16"]
    kinds = ["fp32", "tf32", "bf16", "fp16"]
    props = torch.cuda.get_device_properties(dev)
    if (props.major, props.minor) >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
        kinds.append("fp8")
    return kinds


def matmul_rates(device: torch.device | str, n: int, kinds: Iterable[str] | None = None) -> tuple[dict, dict]:
    """:func:`perflab.roofline.matmul_rate` for each format key: returns ``(rates, errors)``.

    ``rates`` maps kind -> FLOP/s. An fp8 product that fails (no fp8 kernel in this build, an
    unsupported layout) does not stop the others: ``errors["fp8"]`` holds ``"<ErrorClass>:
    <first line of the message>"`` for the caller to print. Failures of any other kind raise.
    Default ``kinds``: :func:`available_matmul_kinds`.
    """
    kinds = list(kinds) if kinds is not None else available_matmul_kinds(device)
    rates, errors = {}, {}
    for kind in kinds:
        if kind == "fp8":
            try:
                rates[kind] = matmul_rate(device, n, kind)
            except Exception as err:  # reported to the caller, never swallowed
                errors[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        else:
            rates[kind] = matmul_rate(device, n, kind)
    return rates, errors


def elementwise_rate(device: torch.device | str, numel: int, repeat: int) -> SweepPoint:
    """The fused ``x*2``-repeated kernel of chapter 1 at one ``repeat``: a :class:`perflab.roofline.SweepPoint`.

    With ``repeat`` far right of the ridge point the kernel is compute-bound, so its
    ``flops_per_s`` is the elementwise (CUDA-core, non-FMA) FP32 rate; ``kernels`` is the number
    of kernels per call (1 = fused). Compiled with ``torch.compile`` (a few seconds).

    Raises:
        ValueError: ``numel`` or ``repeat`` not a positive integer.
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be a positive integer, got {numel!r}")
    x = torch.randn(numel, device=device)
    return sweep_repeat(x, [repeat])[0]


def tile_count(m: int, n: int, tile_m: int = 128, tile_n: int = 128) -> int:
    """Output tiles of an ``m x n`` product cut into ``tile_m x tile_n`` tiles: ``ceil(m/tile_m) * ceil(n/tile_n)``.

    A partly filled edge tile costs a whole tile: that is *tile quantization*.

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("m", m), ("n", n), ("tile_m", tile_m), ("tile_n", tile_n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def wave_count(tiles: int, sms: int, tiles_per_sm: int = 1) -> int:
    """Waves needed to run ``tiles`` thread blocks on ``sms`` SMs holding ``tiles_per_sm`` each at once.

    ``ceil(tiles / (sms * tiles_per_sm))``: one tile past a multiple of the machine's width costs a
    whole extra wave (*wave quantization*; NVIDIA's "Matrix Multiplication Background" guide).

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("tiles", tiles), ("sms", sms), ("tiles_per_sm", tiles_per_sm)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return math.ceil(tiles / (sms * tiles_per_sm))


def wave_sweep(
    device: torch.device | str,
    m: int,
    k: int,
    ns: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = False,
) -> list[tuple[int, float]]:
    """Time ``A[m,k] @ B[k,n]`` for each ``n`` in ``ns``: ``[(n, seconds)]``.

    Each point is the median of 20 CUDA-event timings with the L2 flushed before each
    (:func:`perflab.timing.event_timer`); 20 short products take milliseconds, so a sweep of a
    hundred sizes takes about a second.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: empty ``ns`` or a non-positive size.
    """
    _need_gpu("wave_sweep")
    ns = list(ns)
    if not ns or min(ns) < 1 or m < 1 or k < 1:
        raise ValueError(f"m, k and every n must be positive, got m={m}, k={k}, ns={ns[:3]}...")
    dev = torch.device(device)
    a = torch.randn(m, k, device=dev).to(dtype)
    b_full = torch.randn(k, max(ns), device=dev).to(dtype)
    iterator = show_progress(ns, "wave sweep", progress)
    out = []
    for n in iterator:
        b = b_full[:, :n].contiguous()
        out.append((n, event_timer(lambda: a @ b, dev, warmup=5, reps=20, flush=True).median_s))
    return out


@dataclass(frozen=True)
class WaveFit:
    """How well a staircase (time proportional to waves) explains a wave sweep, against a line.

    Attributes:
        tile: ``(tile_m, tile_n)`` of the best staircase.
        staircase_rms: RMS relative residual of ``t = a + b * waves(n)``.
        linear_rms: RMS relative residual of ``t = a + b * n`` (no quantization).
        seconds_per_wave: the fitted ``b`` of the staircase.
    """

    tile: tuple[int, int]
    staircase_rms: float
    linear_rms: float
    seconds_per_wave: float


def fit_waves(
    points: Sequence[tuple[int, float]],
    m: int,
    sms: int,
    tiles: Sequence[tuple[int, int]] = ((128, 128), (128, 256), (256, 128), (64, 128)),
) -> WaveFit:
    """Fit a wave sweep's times with a staircase for each candidate tile shape and with a line.

    For each ``(tile_m, tile_n)`` the model is ``t = a + b * wave_count(tile_count(m, n, tile_m,
    tile_n), sms)``, fitted by least squares; the tile with the smallest RMS relative residual
    wins (:func:`perflab.fits.fit_line`). A staircase residual well below the line's means wave quantization shapes the times;
    similar residuals mean the library's choices (other tile shapes, split-K, stream-K) smooth it.

    Raises:
        ValueError: fewer than 4 points, a non-positive time, or an empty ``tiles``.
    """
    if len(points) < 4:
        raise ValueError(f"need at least 4 points, got {len(points)}")
    if not tiles:
        raise ValueError("tiles must not be empty")
    ns = [n for n, _ in points]
    ts = [t for _, t in points]
    if min(ts) <= 0:
        raise ValueError("every time must be > 0 seconds")
    linear_rms = fit_line(ns, ts).rms_relative
    best = None
    for tm, tn in tiles:
        waves = [wave_count(tile_count(m, n, tm, tn), sms) for n in ns]
        if len(set(waves)) < 2:
            continue
        fit = fit_line(waves, ts)
        rms, slope = fit.rms_relative, fit.slope
        if best is None or rms < best[1]:
            best = ((tm, tn), rms, slope)
    if best is None:
        raise ValueError("the sweep spans a single wave for every tile shape: widen the range of n")
    return WaveFit(best[0], best[1], linear_rms, best[2])
