"""The CUDA caching allocator: how it rounds, what the driver sees, fragmentation, freeing.

:func:`allocator_rounding` (block and segment sizes of a request), :func:`driver_view` (what the
driver sees beside what PyTorch holds), :func:`freed_without_gc` (reference counting frees a tensor
at once; a reference cycle waits for the garbage collector), and the fragmentation experiment
(:func:`allocator_experiment`), run in a fresh process by :func:`run_allocator_experiment` because
``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA initializes
(``python -m perflab.memory.allocator fragmentation --cap-mib 2048`` prints its JSON).

Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from perflab.core import nvml
from perflab.core.validate import positive_int

__all__ = ["allocator_rounding", "driver_view", "freed_without_gc", "allocator_experiment",
           "run_allocator_experiment", "main"]


MiB = 2**20


def allocator_rounding(nbytes: int) -> dict[str, int]:
    """How the CUDA caching allocator serves a request of ``nbytes`` (its constants, PyTorch source
    ``c10/cuda/CUDACachingAllocator.cpp``; the CUDA semantics notes describe the same).

    * every block is a multiple of 512 bytes (``kMinBlockSize``);
    * requests up to 1 MiB come from the *small pool*, whose segments are 2 MiB;
    * larger requests come from the *large pool*: below 10 MiB from 20 MiB segments, from there on
      from a segment of their own, rounded up to a multiple of 2 MiB (10 MiB itself included).

    A segment is one ``cudaMalloc``; blocks are carved from it by splitting. Returns
    ``{"block": bytes counted as allocated, "segment": bytes reserved if a new segment is needed,
    "pool": 0 (small) or 1 (large)}`` for the default settings (no ``roundup_power2_divisions``,
    no expandable segments).

    Raises:
        ValueError: ``nbytes`` not a positive int.
    """
    positive_int("nbytes", nbytes)
    block = -(-nbytes // 512) * 512
    if block <= MiB:
        return {"block": block, "segment": 2 * MiB, "pool": 0}
    if block < 10 * MiB:
        return {"block": block, "segment": 20 * MiB, "pool": 1}
    return {"block": block, "segment": -(-block // (2 * MiB)) * 2 * MiB, "pool": 1}


def driver_view(device: torch.device | str) -> dict[str, int | None]:
    """What the driver sees beside what PyTorch holds, on a CUDA device (bytes).

    ``used`` is ``total - free`` from ``torch.cuda.mem_get_info``: device-wide, as in
    ``nvidia-smi``, so every process on the GPU counts there (a notebook's executor holds a
    context of its own). ``reserved`` and ``allocated`` are this process's caching allocator's.
    ``process`` is this process's own memory on the GPU from NVML's per-process table
    (:func:`perflab.core.nvml.process_memory_bytes`; None where NVML cannot see it, as in a
    container that hides process ids); then ``process_outside_allocator = process - reserved``
    is this process's CUDA context and what libraries allocate beside the caching allocator,
    and ``other_processes = used - process`` everything else on the card. Without the
    per-process figure both are None. ``outside_allocator = used - reserved`` is the old,
    device-wide figure (other processes included).

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"driver_view needs a CUDA device, got {dev}")
    free, total = torch.cuda.mem_get_info(dev)
    reserved = torch.cuda.memory_reserved(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    process = nvml.process_memory_bytes(os.getpid(), index)
    process = process or None              # 0: NVML did not list this process
    return {"total": total, "used": total - free, "reserved": reserved,
            "allocated": torch.cuda.memory_allocated(dev), "outside_allocator": total - free - reserved,
            "process": process,
            "process_outside_allocator": None if process is None else process - reserved,
            "other_processes": None if process is None else total - free - process}


def freed_without_gc(make: Callable[[], Any], attribute: Callable[[Any], torch.Tensor]) -> bool:
    """True when the tensor ``attribute(obj)`` of ``obj = make()`` is freed as soon as ``obj`` is deleted.

    Reference counting frees an object the moment its last reference goes; objects in a reference
    cycle wait for the cyclic garbage collector. The check runs with ``gc`` disabled, drops the
    last reference and looks at a weak reference to the tensor.
    """
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        obj = make()
        ref = weakref.ref(attribute(obj))
        del obj
        alive = ref() is not None
    finally:
        if was:
            gc.enable()
        gc.collect()
    return not alive


def allocator_experiment(cap_mib: int = 2048, big_mib: int = 1600, piece_mib: int = 100,
                         request_mib: int = 500, device: str = "cuda") -> dict:
    """Fragment the caching allocator under a memory cap, then ask for one large block.

    1. cap the process at ``cap_mib`` (``torch.cuda.set_per_process_memory_fraction``);
    2. allocate and free one ``big_mib`` tensor: the allocator keeps that segment (reserved);
    3. allocate ``big_mib // piece_mib`` tensors of ``piece_mib``: the cached segment is split;
    4. free every other piece: half the segment is free, in ``piece_mib`` holes;
    5. ask for ``request_mib`` (more than a hole, less than the free total).

    With the default allocator a segment can only be returned to the driver when all of it is
    free, so step 5 needs new memory beyond the cap: an out-of-memory error although enough is
    free. With ``expandable_segments:True`` the allocator unmaps the free pages of a segment and
    maps them again where they are needed. On a CPU the same pattern runs without a cap (there is
    no caching allocator): only the bookkeeping is exercised.

    Returns a JSON-ready dict: ``alloc_conf`` (the environment variable as read), ``oom`` (bool),
    ``error`` (first line of the message or None), and ``allocated_mib``/``reserved_mib`` before
    the request (``before``) and at the end (``after``) (None on a CPU).

    Raises:
        ValueError: sizes that are not positive or a pattern that does not fit under the cap.
    """
    for name, v in (("cap_mib", cap_mib), ("big_mib", big_mib), ("piece_mib", piece_mib),
                    ("request_mib", request_mib)):
        positive_int(name, v)
    if big_mib >= cap_mib or piece_mib > big_mib or request_mib <= piece_mib:
        raise ValueError("need piece_mib <= big_mib < cap_mib and request_mib > piece_mib")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is None:  # set_per_process_memory_fraction needs an index
        dev = torch.device("cuda", torch.cuda.current_device())

    def counters():
        if not cuda:
            return {"allocated_mib": None, "reserved_mib": None}
        return {"allocated_mib": torch.cuda.memory_allocated(dev) / MiB,
                "reserved_mib": torch.cuda.memory_reserved(dev) / MiB}

    mib = lambda n: torch.empty(n * MiB, dtype=torch.uint8, device=dev)  # noqa: E731
    if cuda:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(cap_mib * MiB / total, dev)
    big = mib(big_mib)
    del big
    pieces = [mib(piece_mib) for _ in range(big_mib // piece_mib)]
    for i in range(0, len(pieces), 2):
        pieces[i] = None
    before = counters()
    oom, error = False, None
    try:
        request = mib(request_mib)
        del request
    except torch.OutOfMemoryError as err:      # the outcome under study, reported, not hidden
        # other processes' ids and usage say nothing about this experiment (reader L3)
        oom, error = True, re.sub(r" Process \d+ has [\d.,]+ [KMGT]?i?B memory in use\.", "",
                                  str(err).splitlines()[0])
    after = counters()
    return {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "device": str(dev),
            "cap_mib": cap_mib, "big_mib": big_mib, "piece_mib": piece_mib, "request_mib": request_mib,
            "free_in_holes_mib": piece_mib * ((big_mib // piece_mib + 1) // 2),
            "oom": oom, "error": error, "before": before, "after": after}


def run_allocator_experiment(alloc_conf: str | None, device: str = "cuda", timeout_s: float = 120,
                             **sizes: int) -> dict:
    """Run :func:`allocator_experiment` in a fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF``
    set to ``alloc_conf`` (None: unset), and return its JSON result.

    The allocator reads the variable once, when CUDA initializes, so a notebook that already uses
    the GPU cannot change it for itself.

    Raises:
        RuntimeError: the child process failed (its stderr is in the message).
    """
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    args = [sys.executable, "-m", "perflab.memory.allocator", "fragmentation", "--device", device]
    for k, v in sizes.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"allocator experiment failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.memory.allocator")
    sub = parser.add_subparsers(dest="cmd", required=True)
    frag = sub.add_parser("fragmentation", help="the fragmentation experiment; prints JSON")
    frag.add_argument("--device", default="cuda")
    for name, default in (("cap-mib", 2048), ("big-mib", 1600), ("piece-mib", 100), ("request-mib", 500)):
        frag.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args(argv)
    result = allocator_experiment(args.cap_mib, args.big_mib, args.piece_mib, args.request_mib, args.device)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
