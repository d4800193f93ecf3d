"""Memory snapshots: the caching allocator's history of a step, recorded, saved, read and named.

:func:`record_snapshot` records a CUDA snapshot (the pickle pytorch.org/memory_viz opens);
:func:`cpu_memory_trace` gives the profiler's CPU memory events the same layout, so
:func:`allocation_timeline`, :func:`largest_allocation`, :func:`phase_bounds` (between the
:func:`mark` allocations) and :func:`live_at_peak` read both alike. Units: bytes, milliseconds.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any, Callable

import torch

from perflab.core.validate import positive_int
from perflab.memory.measure import _chrome_trace, _cpu_memory_events
from perflab.memory.model import BlockStackConfig

__all__ = ["record_snapshot", "save_snapshot_config", "load_snapshot_config", "save_snapshot",
           "load_snapshot", "cpu_memory_trace", "allocation_timeline", "largest_allocation",
           "name_allocation", "MARK_BYTES", "mark", "phase_bounds", "live_at_peak", "peak_blocks",
           "count_rises"]


def record_snapshot(fn: Callable[[], Any], path: str | os.PathLike | None = None,
                    max_entries: int = 20000, max_frames: int | None = 12) -> dict:
    """Record the CUDA caching allocator's history while ``fn()`` runs; return (and save) the snapshot.

    Wraps ``torch.cuda.memory._record_memory_history(enabled="all", context="alloc",
    stacks="python", max_entries=...)`` and ``torch.cuda.memory._snapshot()``; the pickle written to
    ``path`` is what https://pytorch.org/memory_viz opens (``_dump_snapshot`` writes the same).
    Recording stops afterwards, also when ``fn`` raises. Each recorded stack is cut to its
    ``max_frames`` innermost frames (None: keep all), which keeps the file small.

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("record_snapshot needs CUDA: the caching allocator keeps the history")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    if max_frames is not None:
        _trim_frames(snap, max_frames)
    if path is not None:
        save_snapshot(snap, path)
    return snap


def _trim_frames(snapshot: dict, max_frames: int) -> None:
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = e["frames"][:max_frames]
    for seg in snapshot.get("segments", []):
        for blk in seg.get("blocks", []):
            if "frames" in blk:
                blk["frames"] = blk["frames"][:max_frames]
            for h in blk.get("history", []):
                if "frames" in h:
                    h["frames"] = h["frames"][:max_frames]


def save_snapshot_config(cfg: BlockStackConfig, batch: int, path: str | os.PathLike) -> Path:
    """Write ``{"config": ..., "batch": ...}`` beside a snapshot (``<path>.json``), so a reader of
    the snapshot can name its allocations with :func:`block_tensor_bytes`."""
    side = Path(str(path) + ".json")
    side.write_text(json.dumps({"config": cfg.__dict__, "batch": positive_int("batch", batch)}))
    return side


def load_snapshot_config(path: str | os.PathLike) -> tuple[BlockStackConfig, int]:
    """The (config, batch) that :func:`save_snapshot_config` wrote beside the snapshot at ``path``.

    Raises:
        FileNotFoundError: no ``<path>.json``.
    """
    data = json.loads(Path(str(path) + ".json").read_text())
    return BlockStackConfig(**data["config"]), int(data["batch"])


def save_snapshot(snapshot: dict, path: str | os.PathLike) -> Path:
    """Write a snapshot as a pickle (the format of ``_dump_snapshot`` and pytorch.org/memory_viz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return path


def load_snapshot(path: str | os.PathLike) -> dict:
    """Read a snapshot pickle written by :func:`save_snapshot` or ``_dump_snapshot``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds no ``device_traces``.
    """
    with open(path, "rb") as f:
        snap = pickle.load(f)  # noqa: S301 -- our own snapshot files, as memory_viz reads them
    if not isinstance(snap, dict) or "device_traces" not in snap:
        raise ValueError(f"{path} is not a memory snapshot (no 'device_traces')")
    return snap


def _innermost_ops(events: list[dict]) -> Callable[[dict], str]:
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: e["ts"])

    def name(mem: dict) -> str:
        best, best_dur = "(outside any operator)", math.inf
        for op in ops:
            if op["ts"] > mem["ts"]:
                break
            if op["ts"] <= mem["ts"] <= op["ts"] + op.get("dur", 0) and op.get("dur", 0) < best_dur:
                best, best_dur = op["name"], op.get("dur", 0)
        return best

    return name


def cpu_memory_trace(fn: Callable[[], Any]) -> dict:
    """A memory trace of ``fn()`` on the CPU, in the layout of a CUDA snapshot's ``device_traces``.

    The profiler's memory events become ``{"action": "alloc" | "free_completed", "addr", "size",
    "time_us", "frames": [{"name": <innermost operator>, "filename": "", "line": 0}]}``, so
    :func:`allocation_timeline` and :func:`largest_allocation` read both alike. Returns
    ``{"segments": [], "device_traces": [events], "source": "cpu profiler"}``.
    """
    events, _ = _chrome_trace(fn)
    name = _innermost_ops(events)
    trace = []
    for e in _cpu_memory_events(events):
        nbytes = int(e["args"]["Bytes"])
        trace.append({"action": "alloc" if nbytes > 0 else "free_completed", "addr": e["args"].get("Addr", 0),
                      "size": abs(nbytes), "time_us": e["ts"],
                      "frames": [{"name": name(e), "filename": "", "line": 0}]})
    return {"segments": [], "device_traces": [trace], "source": "cpu profiler"}


def _trace(snapshot: dict, device_index: int) -> list[dict]:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device_index >= len(traces):
        raise ValueError(f"the snapshot has no trace for device {device_index}")
    return traces[device_index]


def allocation_timeline(snapshot: dict, device_index: int = 0) -> tuple[list[float], list[int]]:
    """Allocated bytes after each allocation or free in a snapshot's trace.

    Returns ``(times, allocated)``: times in milliseconds from the first event (event index when
    the trace has no ``time_us``), allocated bytes counted from the start of recording (memory
    allocated before recording began is not in the trace, so the curve starts at 0).

    Raises:
        ValueError: the snapshot has no trace for ``device_index``.
    """
    trace = [e for e in _trace(snapshot, device_index) if e.get("action") in ("alloc", "free_completed")]
    times, levels, level = [], [], 0
    t0 = trace[0].get("time_us", 0) if trace else 0
    for i, e in enumerate(trace):
        level += e["size"] if e["action"] == "alloc" else -e["size"]
        times.append((e["time_us"] - t0) / 1e3 if "time_us" in e else float(i))
        levels.append(level)
    return times, levels


def count_rises(levels: list[int] | list[float], low: float = 0.25, high: float = 0.75) -> int:
    """How many times ``levels`` climbs from its low part to its high part: the teeth of a curve.

    Each level is placed between the curve's minimum (0) and maximum (1); a rise is counted when
    the curve reaches ``high`` after it was at or below ``low`` (or since its start), so a wobble
    that stays between the two marks counts once. On an :func:`allocation_timeline` of a training
    step it counts the forwards whose activations rise and fall: one per micro-batch.

    Raises:
        ValueError: ``levels`` empty, or not ``0 <= low < high <= 1``.
    """
    if len(levels) == 0:
        raise ValueError("levels must hold at least one value")
    if not 0 <= low < high <= 1:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low!r}, high={high!r}")
    lo, hi = min(levels), max(levels)
    if hi == lo:
        return 0
    count, armed = 0, True
    for v in levels:
        x = (v - lo) / (hi - lo)
        if armed and x >= high:
            count, armed = count + 1, False
        elif x <= low:
            armed = True
    return count


def largest_allocation(snapshot: dict, device_index: int = 0) -> dict:
    """The largest single allocation in a snapshot's trace: ``{"size", "index", "frames"}``.

    ``size`` in bytes (on CUDA, rounded up to the allocator's block size), ``index`` its position
    in the trace, ``frames`` the stack recorded with it (innermost first).

    Raises:
        ValueError: no trace for ``device_index``, or no allocation in it.
    """
    allocs = [(e["size"], i, e) for i, e in enumerate(_trace(snapshot, device_index)) if e.get("action") == "alloc"]
    if not allocs:
        raise ValueError("the snapshot's trace holds no allocation")
    size, index, event = max(allocs, key=lambda t: (t[0], -t[1]))
    return {"size": int(size), "index": index, "frames": event.get("frames", [])}


def name_allocation(size: int, candidates: dict[str, int], rtol: float = 0.01) -> str | None:
    """The candidate whose size is within ``rtol`` of ``size`` (allocator rounding), or None."""
    for name, nbytes in sorted(candidates.items(), key=lambda kv: abs(kv[1] - size)):
        if abs(nbytes - size) <= rtol * nbytes:
            return name
    return None


#: bytes of the marker tensor :func:`mark` allocates (7 x 512: a size no tensor of the chapter's
#: models has, and a multiple of the CUDA allocator's 512-byte block, so it is not rounded)
MARK_BYTES = 3584


def mark(device: torch.device | str) -> None:
    """Allocate and free a ``MARK_BYTES`` tensor on ``device``: a marker in a memory trace.

    Called between the phases of a recorded step, it leaves an allocation of a size nothing else
    has in the snapshot (or the CPU profiler's trace); :func:`phase_bounds` finds the markers.
    """
    torch.empty(MARK_BYTES, dtype=torch.uint8, device=device)


def phase_bounds(snapshot: dict, device_index: int = 0) -> list[float]:
    """Times (ms, on :func:`allocation_timeline`'s clock) of the :func:`mark` allocations in a
    snapshot's trace, in order.

    Raises:
        ValueError: no trace for ``device_index``, or no marker in it.
    """
    trace = [e for e in _trace(snapshot, device_index) if e.get("action") in ("alloc", "free_completed")]
    t0 = trace[0].get("time_us", 0) if trace else 0
    found = [(e["time_us"] - t0) / 1e3 if "time_us" in e else float(i)
             for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == MARK_BYTES]
    if not found:
        raise ValueError(f"no marker allocation of {MARK_BYTES} bytes in the trace")
    return found


def live_at_peak(snapshot: dict, since_ms: float, device_index: int = 0) -> list[int]:
    """Sizes (bytes, largest first) of the blocks allocated after ``since_ms`` that are still
    allocated at the highest point of :func:`allocation_timeline` after it: what a phase added to
    reach its peak (pass the phase's start, e.g. from :func:`phase_bounds`).

    Raises:
        ValueError: no trace for ``device_index``, or no event after ``since_ms``.
    """
    return [b["size"] for b in peak_blocks(snapshot, since_ms, device_index)]


def peak_blocks(snapshot: dict, since_ms: float, device_index: int = 0) -> list[dict]:
    """The blocks of :func:`live_at_peak` with their lives: ``[{"size": bytes, "alloc_ms",
    "free_ms": when each was freed (None if never, within the trace), "peak_ms": the peak's
    time}]``, largest first (equal sizes: the earlier allocation first). Times on
    :func:`allocation_timeline`'s clock (ms from the first event).

    A block freed a few microseconds after it was allocated is a temporary of the operator
    running at the peak; one that outlives the peak by milliseconds is a tensor the step keeps
    for a while (a gradient in flight).

    Raises:
        ValueError: no trace for ``device_index``, or no event after ``since_ms``.
    """
    trace = [e for e in _trace(snapshot, device_index) if e.get("action") in ("alloc", "free_completed")]
    times, levels = allocation_timeline(snapshot, device_index)
    after = [i for i, t in enumerate(times) if t >= since_ms]
    if not after:
        raise ValueError(f"no event after {since_ms} ms")
    peak = max(after, key=lambda i: (levels[i], -i))
    live: dict[Any, dict] = {}
    for i in range(after[0], peak + 1):
        e = trace[i]
        key = e.get("addr", id(e))
        if e["action"] == "alloc":
            live[key] = {"size": e["size"], "alloc_ms": times[i], "free_ms": None,
                         "peak_ms": times[peak]}
        else:
            live.pop(key, None)
    for i in range(peak + 1, len(trace)):
        e = trace[i]
        block = live.get(e.get("addr", id(e)))
        if e["action"] == "free_completed" and block is not None and block["free_ms"] is None:
            block["free_ms"] = times[i]
    return sorted(live.values(), key=lambda b: (-b["size"], b["alloc_ms"]))
