import importlib.util
import linecache
import os
import traceback
import warnings

import pytest
import torch

from perflab.internals import hostsync


def test_count_host_syncs_finds_each_kind_of_sync():
    x = torch.randn(16)

    def loop(t):
        t.sum().item()
        f"{t.sum():.2f}"
        if t.sum() > 0:
            pass
        t[t > 0]
        t.nonzero()
        t.tolist()
        t.to("cpu")
        torch.where(t > 0)
        return t

    _, counts = hostsync.count_host_syncs(loop, x)
    assert counts == {"item": 1, "__format__": 1, "__bool__": 1, "__getitem__": 1, "nonzero": 1,
                      "tolist": 1, "to": 1, "where": 1}


def test_count_host_syncs_ignores_calls_that_stay_on_the_device():
    x = torch.randn(16)
    idx = torch.tensor([0, 3, 5])

    def loop(t):
        y = t * 2 + 1
        y = torch.where(t > 0, y, 0)
        s = y.sum()
        y[1:4]
        y[idx]
        y.to(torch.float64)
        z = torch.empty(3)
        z[0] = s
        return z

    out, counts = hostsync.count_host_syncs(loop, x)
    assert sum(counts.values()) == 0 and out.shape == (3,)


def test_count_host_syncs_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        hostsync.count_host_syncs(None)


def test_sync_debug_warnings_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        hostsync.sync_debug_warnings(lambda: None)


def test_sync_debug_warnings_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("sync debug mode watches CUDA calls; this machine has no GPU")
    t = torch.randn(1024, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    _, found = hostsync.sync_debug_warnings(lambda: t.sum().item())
    assert len(found) >= 1 and "synchroniz" in found[0].message
    assert all(w.line == "_, found = hostsync.sync_debug_warnings(lambda: t.sum().item())"
               for w in found)
    _, none = hostsync.sync_debug_warnings(lambda: t * 2)
    assert none == []
    assert torch.cuda.get_sync_debug_mode() == before


def _fake(message, filename, lineno):
    return warnings.WarningMessage(UserWarning(message), UserWarning, filename, lineno)


def _user_file(tmp_path):
    path = tmp_path / "cell.py"
    path.write_text("x = 1\nloss.item()\nout[keep]\n")
    linecache.checkcache(str(path))
    return str(path)


def test_sync_warnings_from_drops_the_prototype_warning_of_set_sync_debug_mode(tmp_path):
    # what the H200 run recorded first: the mode's own warning, located in torch.cuda
    torch_cuda = os.path.join(os.path.dirname(torch.__file__), "cuda", "__init__.py")
    user = _user_file(tmp_path)
    records = [
        _fake("Synchronization debug mode is a prototype feature and does not yet detect "
              "all synchronizing operations", torch_cuda, 1333),
        _fake(hostsync.SYNC_WARNING_TEXT + " (Triggered internally at CUDAFunctions.cpp:1.)", user, 2),
        _fake("some other warning", user, 3),
    ]
    found = hostsync.sync_warnings_from(records)
    assert [(w.filename, w.lineno, w.line) for w in found] == [(user, 2, "loss.item()")]
    assert hostsync.SYNC_WARNING_TEXT in found[0].message


def test_sync_warnings_from_walks_out_of_torch_to_the_callers_line(tmp_path):
    user = _user_file(tmp_path)
    inside = os.path.join(os.path.dirname(torch.__file__), "_tensor.py")
    stack = [traceback.FrameSummary(user, 3, "train"),
             traceback.FrameSummary(inside, 10, "__format__")]
    found = hostsync.sync_warnings_from([(_fake(hostsync.SYNC_WARNING_TEXT, inside, 10), stack),
                                         (_fake(hostsync.SYNC_WARNING_TEXT, user, 2), [])])
    assert [(w.lineno, w.line) for w in found] == [(3, "out[keep]"), (2, "loss.item()")]
    assert hostsync.warnings_by_line(found + found[1:]) == [("loss.item()", 2), ("out[keep]", 1)]


def test_sync_warnings_from_rejects_other_records():
    with pytest.raises(TypeError, match="WarningMessage"):
        hostsync.sync_warnings_from(["called a synchronizing CUDA operation"])


def test_recorder_keeps_each_warning_with_the_stack_that_issued_it(tmp_path):
    # a module outside this file stands for PyTorch code that warns on the caller's behalf
    lib_dir = tmp_path / "fakelib"
    lib_dir.mkdir()
    (lib_dir / "fake_torch_op.py").write_text(
        "import warnings\n\n\ndef op(text):\n    warnings.warn(text, stacklevel=1)\n")
    spec = importlib.util.spec_from_file_location("fake_torch_op", lib_dir / "fake_torch_op.py")
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)

    def user_code():
        for _ in range(2):
            lib.op(hostsync.SYNC_WARNING_TEXT)
        lib.op("not a sync")
        return 7

    before = warnings.showwarning
    out, records = hostsync._record_with_stacks(user_code)
    assert out == 7 and len(records) == 3 and warnings.showwarning is before
    found = hostsync.sync_warnings_from(records, library_dirs=())
    assert [w.line for w in found] == ["warnings.warn(text, stacklevel=1)"] * 2
    found = hostsync.sync_warnings_from(records, library_dirs=(str(lib_dir),))
    assert [w.line for w in found] == ["lib.op(hostsync.SYNC_WARNING_TEXT)"] * 2
    assert found[0].filename == os.path.abspath(__file__)


def test_a_blocking_copy_to_the_gpu_counts_as_a_sync():
    """x.to(cuda) without non_blocking=True copies and waits (pinned or not): chapter 6's
    ladder synchronized through such copies in a rung named for having no sync."""
    x = torch.randn(4)
    assert hostsync._syncs("to", (x, torch.device("cuda")), {})
    assert hostsync._syncs("to", (x, "cuda:0"), {})
    assert hostsync._syncs("to", (x,), {"device": "cuda"})
    assert not hostsync._syncs("to", (x, "cuda"), {"non_blocking": True})
    assert not hostsync._syncs("to", (x, "cuda", True), {})          # to(device, non_blocking)
    assert not hostsync._syncs("to", (x, torch.float64), {})
    assert hostsync._syncs("cuda", (x,), {}) and not hostsync._syncs("cuda", (x,), {"non_blocking": True})
