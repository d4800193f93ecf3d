import pytest
import torch

from perflab import sync as S


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

    _, counts = S.count_host_syncs(loop, x)
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

    out, counts = S.count_host_syncs(loop, x)
    assert sum(counts.values()) == 0 and out.shape == (3,)


def test_count_host_syncs_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        S.count_host_syncs(None)


def test_sync_debug_warnings_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only error path is what is tested here")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        S.sync_debug_warnings(lambda: None)


def test_sync_debug_warnings_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("sync debug mode watches CUDA calls; this machine has no GPU")
    t = torch.randn(1024, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    _, found = S.sync_debug_warnings(lambda: t.sum().item())
    assert len(found) >= 1 and "synchroniz" in found[0].message
    _, none = S.sync_debug_warnings(lambda: t * 2)
    assert none == []
    assert torch.cuda.get_sync_debug_mode() == before
