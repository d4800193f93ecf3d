"""The CUDA context, measured in a process that holds nothing else.

A process that uses a GPU carries a **CUDA context**: the driver's memory for the process
outside PyTorch's caching allocator (the code of every kernel module loaded, per-SM stacks and
local memory, queues). Measured inside a notebook it is muddled: the notebook's kernel has
allocated and freed tensors, loaded cuBLAS and more, and the GPU's ``used`` bytes count every
other process too (the reference run's executor holds a context of its own). So
:func:`cuda_context_bytes` starts a fresh Python process that initializes CUDA, runs one tiny
kernel (and, with ``cublas=True``, one matrix product), and reads **its own** memory on the GPU
from NVML's per-process table minus what its allocator reserved: the context alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch

from perflab.core.validate import integer, positive

__all__ = ["cuda_context_bytes"]

_CHILD = r"""
import json, os, sys
import torch
from perflab.core import nvml
index = int(sys.argv[1]); cublas = sys.argv[2] == "1"
torch.cuda.init()
x = torch.ones(1, device=f"cuda:{index}")
(x * 2).sum().item()
if cublas:
    a = torch.ones(64, 64, device=f"cuda:{index}")
    (a @ a).sum().item()
torch.cuda.synchronize(index)
own = nvml.process_memory_bytes(os.getpid(), index)
print(json.dumps({"process_bytes": own,
                  "reserved_bytes": torch.cuda.memory_reserved(index),
                  "allocated_bytes": torch.cuda.memory_allocated(index)}))
"""


def cuda_context_bytes(index: int = 0, cublas: bool = False,
                       timeout_s: float = 120.0) -> dict[str, Any] | None:
    """The CUDA context of a fresh process on GPU ``index``, in bytes.

    Args:
        index: the GPU (>= 0).
        cublas: also run a matrix product first (cuBLAS's workspace and kernels join the
            process's memory: what a training process carries).
        timeout_s: seconds the child may take (> 0).

    Returns:
        ``{"context_bytes": process bytes minus reserved, "process_bytes": NVML's figure for
        the child, "reserved_bytes", "allocated_bytes": its allocator's}``, or None without a
        GPU, or where NVML cannot see the child's memory (a container hiding process ids).

    Raises:
        ValueError: a negative ``index`` or a non-positive ``timeout_s``.
        RuntimeError: the child process failed (its error is in the message).
    """
    integer("index", index, 0)
    positive("timeout_s", timeout_s)
    if not torch.cuda.is_available():
        return None
    r = subprocess.run([sys.executable, "-c", _CHILD, str(index), "1" if cublas else "0"],
                       capture_output=True, text=True, timeout=timeout_s,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if r.returncode != 0:
        raise RuntimeError(f"the CUDA-context child failed: {r.stderr.strip()[-500:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if not got.get("process_bytes"):
        return None
    got["context_bytes"] = got["process_bytes"] - got["reserved_bytes"]
    return got
