"""The GPU as a performance engineer sees it: its structure, its clocks, its math units, its waves.

* :func:`properties` reads what the chip is (SMs, warps, caches, memory bus) through torch; how
  it is running right now (clocks, power, PCIe link, NVLinks) is :func:`perflab.core.nvml.readings`.
  Nothing here sets clocks, power limits or modes.
* :func:`matmul_rates` measures matrix-multiply FLOP/s per number format (FP32 on the CUDA
  cores; TF32, bf16, fp16 and fp8 on the tensor cores; one :func:`perflab.machine.roofline.matmul_rate`
  each). (The CUDA cores' elementwise rate is chapter 1's fused ``x * 2`` kernel,
  :func:`perflab.machine.sweep.sweep_repeat`.)
* :func:`tile_count` and :func:`wave_count` count a matrix product's output tiles and the waves
  they take on the SMs (wave quantization); :func:`wave_groups` groups a batch sweep's calls by
  the kernel the profiler says ran (its tile in :func:`kernel_tile`) and fits each group's
  staircase of rounds. (The L2-against-HBM probe is taught on chapter 2's page and exported to
  :mod:`perflab.machine.replay`.)
* :func:`burst_and_sustained` times one matrix product briefly after a rest and for seconds back
  to back, each under :class:`perflab.core.telemetry.Telemetry`: the burst and the sustained rate.

Units: bytes, Hz, watts, FLOP/s, seconds.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from perflab.core.device import has_gpu
from perflab.core.fits import fit_line
from perflab.core.rounds import Spread
from perflab.core.telemetry import Telemetry
from perflab.core.timing import Stopwatch, event_timer, synchronize
from perflab.core.validate import integers, positive, positive_int
from perflab.machine.roofline import matmul_rate

__all__ = [
    "BurstSustained",
    "WaveGroup",
    "available_matmul_kinds",
    "burst_and_sustained",
    "dram_bandwidth_from_clock",
    "kernel_tile",
    "matmul_rates",
    "properties",
    "tile_count",
    "wave_count",
    "wave_groups",
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
    """The :data:`perflab.core.formats.FORMATS` keys worth measuring on ``device``.

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
    """:func:`perflab.machine.roofline.matmul_rate` for each format key: returns ``(rates, errors)``.

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


def tile_count(m: int, n: int, tile_m: int = 128, tile_n: int = 128) -> int:
    """Output tiles of an ``m x n`` product cut into ``tile_m x tile_n`` tiles: ``ceil(m/tile_m) * ceil(n/tile_n)``.

    A partly filled edge tile costs a whole tile: that is *tile quantization*.

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("m", m), ("n", n), ("tile_m", tile_m), ("tile_n", tile_n)):
        positive_int(name, v)
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def wave_count(tiles: int, sms: int, tiles_per_sm: int = 1) -> int:
    """Waves needed to run ``tiles`` thread blocks on ``sms`` SMs holding ``tiles_per_sm`` each at once.

    ``ceil(tiles / (sms * tiles_per_sm))``: one tile past a multiple of the machine's width costs a
    whole extra wave (*wave quantization*; NVIDIA's "Matrix Multiplication Background" guide).

    Raises:
        ValueError: a non-positive argument.
    """
    for name, v in (("tiles", tiles), ("sms", sms), ("tiles_per_sm", tiles_per_sm)):
        positive_int(name, v)
    return math.ceil(tiles / (sms * tiles_per_sm))


# ---------------------------------------------------------------------------------------------
# Waves: which kernel ran, with which tile, in how many rounds
# ---------------------------------------------------------------------------------------------

_TILE = re.compile(r"(?:_|tilesize)(\d+)x(\d+)")


def kernel_tile(name: str) -> tuple[int, int] | None:
    """The output tile a matrix-product kernel's name carries, ``(tile_m, tile_n)``, or None.

    cuBLAS names its kernels after their tiles: ``nvjet_tst_128x96_64x4_...`` (Hopper's
    ``nvjet`` kernels), ``sm90_xmma_gemm_..._tilesize128x128x64_...``, CUTLASS's
    ``..._128x256_64x3_...``: the first pair of sizes of at least 32 is the output tile.
    """
    for a, b in _TILE.findall(name):
        if int(a) >= 32 and int(b) >= 32:
            return int(a), int(b)
    return None


@dataclass(frozen=True)
class WaveGroup:
    """The calls of a batch sweep that ran one kernel, with the staircase fitted to them.

    Attributes:
        kernel: the kernel's name (the longest kernel of each call).
        tile: its output tile ``(tile_m, tile_n)`` from the name (None if the name has none).
        ctas: thread blocks that run at once: the kernel's grid, at most one per SM.
        batches: the batch counts ``b`` that ran it, increasing.
        rounds: for each, ``ceil(b * tiles per product / ctas)``: how many times each running
            block takes a new tile (a wave of a plain grid, a loop turn of a persistent one).
        seconds: for each, the device time of one call (a Spread over the repeats).
        round_s: the fitted time per round (a Spread: one fit per repeat), None when the group
            spans a single round count.
        fixed_s: the fitted intercept (median over the repeats), None likewise.
        staircase_rms, linear_rms: RMS relative residuals of ``t = a + s * rounds`` and of the
            straight line ``t = a + c * b`` (median over the repeats; None likewise).
    """

    kernel: str
    tile: tuple[int, int] | None
    ctas: int
    batches: tuple[int, ...]
    rounds: tuple[int, ...]
    seconds: tuple[Spread, ...]
    round_s: Spread | None
    fixed_s: float | None
    staircase_rms: float | None
    linear_rms: float | None

    def predict(self, rounds: int) -> float | None:
        """The fitted staircase's time for ``rounds`` rounds (seconds), None without a fit."""
        if self.round_s is None or self.fixed_s is None:
            return None
        return self.fixed_s + self.round_s.median * rounds


def wave_groups(calls: Sequence[Sequence], batches: Sequence[int], m: int, n: int,
                sms: int) -> list[WaveGroup]:
    """Group a batch sweep's calls by the kernel that ran, and fit each group's staircase.

    Args:
        calls: for each repeat of the sweep, for each batch count, the kernels the call ran
            (:class:`perflab.profiling.trace.KernelRecord`: name, grid, duration); a call's
            time is the sum of its kernels' durations, its kernel the longest of them.
        batches: the batch counts ``b``, in the order of each repeat's calls.
        m, n: each product's output is ``m x n``.
        sms: the GPU's SMs.

    Returns:
        One :class:`WaveGroup` per kernel, the group with the most batch counts first.

    Raises:
        ValueError: no repeat, repeats of different lengths, a call with no kernel, or
            a non-positive size.
    """
    for label, v in (("m", m), ("n", n), ("sms", sms)):
        positive_int(label, v)
    batches = list(batches)
    integers("batches", batches)
    if not calls or any(len(rep) != len(batches) for rep in calls):
        raise ValueError("calls must hold, for each repeat, one entry per batch count")
    per_b: dict[int, list] = {}
    for rep in calls:
        for b, kernels in zip(batches, rep):
            if not kernels:
                raise ValueError(f"the call with b = {b} ran no kernel")
            main = max(kernels, key=lambda k: k.duration_us)
            total = sum(k.duration_us * k.launches for k in kernels) * 1e-6
            per_b.setdefault(b, []).append((main, total))
    groups: dict[str, list[int]] = {}
    for b in batches:
        names = [main.name for main, _ in per_b[b]]
        groups.setdefault(max(set(names), key=names.count), []).append(b)
    out = []
    for name, bs in groups.items():
        bs = sorted(set(bs))
        main = per_b[bs[0]][0][0]
        tile = kernel_tile(name)
        grid = math.prod(main.grid) if main.grid else sms
        ctas = max(1, min(grid, sms))
        per_product = tile_count(m, n, *tile) if tile else 1
        rounds = tuple(math.ceil(b * per_product / ctas) for b in bs)
        reps = len(calls)
        times = [[per_b[b][r][1] for b in bs] for r in range(reps)]
        seconds = tuple(Spread(tuple(times[r][i] for r in range(reps))) for i in range(len(bs)))
        round_s = fixed = stair = line = None
        if len(set(rounds)) >= 2 and len(bs) >= 3:
            fits = [fit_line(rounds, times[r], relative=True) for r in range(reps)]
            lines = [fit_line(bs, times[r], relative=True) for r in range(reps)]
            round_s = Spread(tuple(f.slope for f in fits))
            fixed = statistics.median(f.fixed for f in fits)
            stair = statistics.median(f.rms_relative for f in fits)
            line = statistics.median(f.rms_relative for f in lines)
        out.append(WaveGroup(name, tile, ctas, tuple(bs), rounds, seconds, round_s, fixed,
                             stair, line))
    out.sort(key=lambda g: -len(g.batches))
    return out


# ---------------------------------------------------------------------------------------------
# Burst and sustained rates
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BurstSustained:
    """One matrix product timed briefly after a rest (burst) and for seconds back to back.

    Attributes:
        flops: FLOPs of one product (``2 n^3``).
        burst_s, sustained_s: median seconds of one product in each measurement.
        burst, sustained: the :class:`perflab.core.telemetry.TelemetrySummary` of each.
        sustained_window_s: how long the products ran back to back.
    """

    flops: float
    burst_s: float
    sustained_s: float
    burst: object
    sustained: object
    sustained_window_s: float

    @property
    def burst_rate(self) -> float:
        """FLOP/s of the burst."""
        return self.flops / self.burst_s

    @property
    def sustained_rate(self) -> float:
        """FLOP/s sustained (the last half of the window)."""
        return self.flops / self.sustained_s


def burst_and_sustained(
    device: torch.device | str,
    n: int,
    dtype: torch.dtype = torch.bfloat16,
    burst_reps: int = 30,
    sustained_s: float = 3.0,
    rest_s: float = 1.0,
) -> BurstSustained:
    """Time an ``n x n @ n x n`` product as a short burst and sustained for ``sustained_s``.

    After ``rest_s`` seconds idle (the board cools below its power limit), ``burst_reps``
    products are timed with CUDA events after 2 warm-up calls: some tens of milliseconds of
    work (30 bf16 8192^3 products, about 40 ms on an H200), short enough to run before the power
    controller lowers the clock and long enough for the sampler, which reads NVML every few
    milliseconds, to read the clock at least three times inside them (a 10-product burst of 14
    ms held no reading at all). Then products run back to back for
    ``sustained_s`` seconds in chunks of 20 event-timed calls; the sustained time is the median
    over the chunks of the window's second half, when the clock has settled. Each part runs
    under a :class:`perflab.core.telemetry.Telemetry` sampler, whose summaries say at which SM clock,
    power and throttle reasons. Nothing here changes a clock or a limit. On a CPU the same runs
    with ``time.perf_counter`` (for tests).

    Raises:
        ValueError: a non-positive ``n``, ``burst_reps`` or ``sustained_s``, or a negative
            ``rest_s``.
    """
    for name, v in (("n", n), ("burst_reps", burst_reps)):
        positive_int(name, v)
    positive("sustained_s", sustained_s)
    if rest_s < 0:
        raise ValueError(f"rest_s must be >= 0, got {rest_s}")
    dev = torch.device(device)
    index = (dev.index or 0) if dev.type == "cuda" else 0
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    fn = lambda: a @ b  # noqa: E731
    fn()
    synchronize(dev)
    time.sleep(rest_s)
    with Telemetry(index=index, interval_s=0.005) as tel_burst:
        burst = event_timer(fn, dev, warmup=2, reps=burst_reps).median_s
    chunks = []
    with Telemetry(index=index) as tel_sus:
        clock = Stopwatch().start()
        while clock.elapsed() < sustained_s or len(chunks) < 2:
            chunks.append((clock.elapsed(), event_timer(fn, dev, warmup=0, reps=20)))
        window = clock.elapsed()
    late = [t for start, t in chunks if start >= window / 2] or [chunks[-1][1]]
    samples = sorted(x for t in late for x in t.samples_s)
    sustained = samples[len(samples) // 2]
    return BurstSustained(2.0 * n**3, burst, sustained, tel_burst.summary(), tel_sus.summary(),
                          window)
