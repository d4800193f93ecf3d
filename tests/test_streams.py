import gc

import pytest

import perflab.core.timing as timing
from perflab.internals import overhead, streams


def test_stream_costs_splits_a_stream_into_host_time_and_wait_and_counts_collections(monkeypatch):
    """A fake clock: each call advances it 2 s; the wait (synchronize) advances it 3 s, once
    per stream and burst; every call runs a garbage collection."""
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def fake_sync(device=None):
        now[0] += 3.0

    monkeypatch.setattr(streams, "synchronize", fake_sync)
    monkeypatch.setattr(overhead, "synchronize", fake_sync)

    def fn():
        now[0] += 2.0
        gc.collect(0)

    out = streams.stream_costs(fn, "cpu", calls=4, rounds=8, burst=2)
    assert list(out) == ["stream", "burst", "host", "collections"]
    assert all(s.n == 8 for s in out.values())
    assert out["host"].median == pytest.approx(2.0)              # 4 calls of 2 s, before the wait
    assert out["stream"].median == pytest.approx(2.0 + 3.0 / 4)   # the wait, over 4 calls
    assert out["burst"].median == pytest.approx(2.0)
    assert out["collections"].median >= 4                        # one per call, at least


def test_stream_costs_rejects_bad_arguments():
    for kwargs, word in (({"calls": 0}, "calls"), ({"rounds": 0}, "rounds"), ({"burst": 0}, "burst")):
        with pytest.raises(ValueError, match=word):
            streams.stream_costs(lambda: None, "cpu", **kwargs)
