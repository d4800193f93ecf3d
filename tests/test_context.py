"""perflab.internals.context: the CUDA context of a fresh process, and NVML's per-process
memory it reads."""

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch

from perflab.core import nvml
from perflab.internals import context


def test_without_a_gpu_there_is_no_context(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert context.cuda_context_bytes() is None


def test_the_context_is_the_child_s_own_memory_minus_its_allocator(monkeypatch):
    """Only the child's own NVML figure counts: not the GPU's used bytes, which include every
    other process (the executor's context in the 3 December run: N7 of the review)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        out = {"process_bytes": 600 * 2**20, "reserved_bytes": 2 * 2**20, "allocated_bytes": 512}
        return subprocess.CompletedProcess(cmd, 0, json.dumps(out) + "\n", "")

    monkeypatch.setattr(context.subprocess, "run", fake_run)
    got = context.cuda_context_bytes(0, cublas=True)
    assert got["context_bytes"] == 598 * 2**20
    assert seen["cmd"][-2:] == ["0", "1"]
    monkeypatch.setattr(context.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 0, json.dumps({"process_bytes": None, "reserved_bytes": 0}), ""))
    assert context.cuda_context_bytes() is None          # NVML cannot see the child
    monkeypatch.setattr(context.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "RuntimeError: no CUDA"))
    with pytest.raises(RuntimeError, match="no CUDA"):
        context.cuda_context_bytes()


@pytest.mark.parametrize("kwargs", [{"index": -1}, {"index": 1.5}, {"timeout_s": 0}])
def test_bad_arguments_name_themselves(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        context.cuda_context_bytes(**kwargs)


def test_process_memory_reads_the_process_s_own_row(monkeypatch):
    rows = [SimpleNamespace(pid=11, usedGpuMemory=100), SimpleNamespace(pid=22, usedGpuMemory=7)]
    monkeypatch.setattr(nvml, "handle", lambda index=0: object())
    monkeypatch.setattr(nvml, "_call", lambda name, *a: rows)
    assert nvml.process_memory_bytes(22) == 7
    assert nvml.process_memory_bytes(33) == 0             # no context on this GPU
    monkeypatch.setattr(nvml, "_call", lambda name, *a: None)
    assert nvml.process_memory_bytes(22) is None
