"""perflab.labs.lab10: lab 10's checks and the CPU's estimate of peak memory (CPU only,
no wall-clock assertions except ratios the checks themselves compute)."""

import json

import numpy as np
import pytest
import torch

from perflab.gpt2.steps import Forward
from perflab.gpt2.model import GPT, config
from perflab.gpt2.rungs import RunResult, Rung
from perflab.gpt2.train import batches
from perflab.labs import lab10
from perflab.labs.exercises import ExerciseFailed, ExerciseNotDone

TINY = (("n_layer", 2), ("n_embd", 32), ("n_head", 2), ("block_size", 32))


def tokens(n=20_000, top=200):
    return np.random.default_rng(0).integers(0, top, n).astype(np.uint16)


def base(**kw):
    kw = {"batch": 8, **kw}
    return Rung("base", changes=TINY, seq_len=32, vocab=256, **kw)


def right(n, L, d, T):
    return 6 * n + 12 * L * d * T


def test_model_params_counts_on_meta():
    cfg = config("124M")
    assert lab10.model_params(cfg, non_embedding=False) == GPT(cfg).num_params(False)
    assert lab10.model_params(cfg) == lab10.model_params(cfg, False) - 1024 * 768
    with pytest.raises(TypeError, match="GPTConfig"):
        lab10.model_params("124M")


def test_flops_per_token_check():
    with pytest.raises(ExerciseNotDone, match="Exercise 1"):
        lab10.check_flops_per_token(None)
    with pytest.raises(ExerciseFailed, match="attention"):
        lab10.check_flops_per_token(lambda n, L, d, T: 6 * n)
    with pytest.raises(ExerciseFailed, match="forward only"):
        lab10.check_flops_per_token(lambda n, L, d, T: 2 * n + 4 * L * d * T)
    with pytest.raises(ExerciseFailed, match="124M"):
        lab10.check_flops_per_token(lambda n, L, d, T: 6 * n + 6 * L * d * T)
    out = lab10.check_flops_per_token(right)
    assert len(out) == 3


def test_static_memory_check():
    cfg = config("124M")
    n = lab10.model_params(cfg, non_embedding=False)
    parts = dict(lab10.ADAMW_FP32_BYTES)
    assert sum(parts.values()) == 16
    with pytest.raises(ExerciseNotDone, match="Exercise 2"):
        lab10.check_static_memory(None, None, cfg)
    with pytest.raises(ExerciseFailed, match="static bytes"):
        lab10.check_static_memory(parts, 8 * n, cfg)
    with pytest.raises(ExerciseFailed, match="adam_v"):
        lab10.check_static_memory({**parts, "adam_v": 2}, 14 * n, cfg)
    with pytest.raises(ExerciseFailed, match="keys"):
        lab10.check_static_memory({"weight": 4}, 16 * n, cfg)
    assert lab10.check_static_memory(parts, 16 * n, cfg) == 16 * n


def test_peak_estimate_counts_saved_activations():
    t = tokens()
    b = base()
    est = lab10.peak_estimate(b, t)
    n = sum(p.numel() for p in GPT(b.config()).parameters())
    assert est.static_bytes == 16 * n and est.recompute_bytes == 0
    # the logits (8 x 32 x 256 float32) are saved at least once
    assert est.saved_bytes >= 8 * 32 * 256 * 4
    # micro-batches: the saved bytes scale with the micro-batch
    half = lab10.peak_estimate(b.then("half", batch=4, accum=2), t)
    assert half.static_bytes == est.static_bytes
    assert half.saved_bytes == pytest.approx(est.saved_bytes / 2, rel=0.05)
    # checkpointing keeps block inputs and recomputes one block
    ck = lab10.peak_estimate(b.then("ck", checkpoint=True), t)
    assert ck.saved_bytes < est.saved_bytes and ck.recompute_bytes > 0
    assert ck.recompute_bytes <= est.saved_bytes
    # the optimizer in the backward keeps one gradient at a time
    ib = lab10.peak_estimate(b.then("ib", optimizer="in_backward"), t)
    assert 12 * n < ib.static_bytes < est.static_bytes
    assert ib.total == ib.static_bytes + ib.saved_bytes + ib.recompute_bytes
    # ... but not under accumulation: every gradient lives until the last micro-batch
    ib_acc = lab10.peak_estimate(b.then("ib", optimizer="in_backward", batch=4, accum=2), t)
    assert ib_acc.static_bytes == est.static_bytes
    with pytest.raises(TypeError, match="Rung"):
        lab10.peak_estimate("base", t)


def test_peak_estimate_matches_a_direct_count():
    """The hooks count what autograd really saves: compare with summing unique storages of a
    plain forward's saved tensors through the same hooks, independently written."""
    b = base(batch=2)
    model = GPT(b.config())
    x, y = next(batches(tokens(), 2, 32))
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in ptrs:
            seen[s.data_ptr()] = s.nbytes()
        return t

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        Forward(model, b)(x, y)
    assert lab10.peak_estimate(b, tokens()).saved_bytes == sum(seen.values())


def test_speedrun_check_accepts_faster_rejects_same(monkeypatch):
    """The check's logic on given rates (no wall-clock in a unit test): tokens/s is set by the
    rung's batch, the MFU by the ceiling; the lab's run proves it on measured numbers."""
    t = tokens()
    b = base(batch=2)

    def fake_train(rung, tokens, steps, device, warmup=1):
        return RunResult(rung={"name": rung.name}, tokens_per_s=1000.0 * rung.batch,
                         step_s=1.0, flops_per_token=1e6, peak_bytes=None, losses=[1.0],
                         compile_s=0.0, telemetry="", clock_fraction=None, params=1)
    monkeypatch.setattr(lab10, "train", fake_train)
    with pytest.raises(ExerciseNotDone, match="Exercise 3"):
        lab10.check_speedrun(b, None, t, "cpu", 1e12, 0.01, 1.5)
    with pytest.raises(ExerciseFailed, match="another model"):
        lab10.check_speedrun(b, b.then("x", seq_len=16), t, "cpu", 1e12, 1e-9, 1.0, trials=1)
    with pytest.raises(ValueError, match="positive"):
        lab10.check_speedrun(b, b, t, "cpu", 0, 0.1, 1.5)


def test_speedrun_check_alternates_trials_and_takes_the_median_trial_ratio(monkeypatch):
    """Training is faked (tokens/s chosen per trial): the verdict and the arithmetic of the
    trials are tested, not this machine's speed, which lab 10's own run measures."""
    b, mine = base(batch=2), base(batch=2).then("mine", batch=4)
    order, rates = [], {"base": iter([100.0, 120.0, 90.0]), "mine": iter([300.0, 200.0, 310.0])}

    def fake_train(rung, tokens, steps, device, warmup=1):
        who = "base" if rung is b else "mine"
        order.append(who)
        tps = next(rates[who])
        return type("Run", (), {"tokens_per_s": tps, "mfu": lambda self, c, tps=tps: tps / c})()

    monkeypatch.setattr(lab10, "train", fake_train)
    got = lab10.check_speedrun(b, mine, tokens(), "cpu", 1000.0, 0.2, 2.5, trials=3)
    assert order == ["base", "mine"] * 3                   # alternated: both see the same load
    assert got["speedup"] == pytest.approx(3.0)   # the median of the trials' ratios
    assert got["ratios"] == pytest.approx([3.0, 200 / 120, 310 / 90])
    assert got["fraction"] == pytest.approx(0.31)          # MFU of mine's fastest trial
    rates.update(base=iter([100.0] * 3), mine=iter([200.0] * 3))
    with pytest.raises(ExerciseFailed, match="speedup is below .*2.00x the baseline .*target "
                       "2.50x.*baseline 100 tokens/s, yours 200 tokens/s"):
        lab10.check_speedrun(b, mine, tokens(), "cpu", 1000.0, 0.1, 2.5, trials=3)
    rates.update(base=iter([100.0] * 3), mine=iter([300.0] * 3))
    # a failed MFU says the speedup too: the student sees both gaps at once
    with pytest.raises(ExerciseFailed, match="MFU is below .*0.300 of your matmul ceiling "
                       r"\(target 0.500\); 3.00x the baseline"):
        lab10.check_speedrun(b, mine, tokens(), "cpu", 1000.0, 0.5, 2.5, trials=3)


def test_memory_cut_check():
    t = tokens()
    b = base()
    with pytest.raises(ExerciseNotDone, match="Exercise 4"):
        lab10.check_memory_cut(b, None, t, "cpu", 0.5)
    with pytest.raises(ExerciseFailed, match="global batch"):
        lab10.check_memory_cut(b, b.then("half", batch=4), t, "cpu", 0.5)
    with pytest.raises(ExerciseFailed, match="precision"):
        lab10.check_memory_cut(b, b.then("p", precision="bf16"), t, "cpu", 0.5)
    with pytest.raises(ExerciseFailed, match="another model"):
        lab10.check_memory_cut(b, b.then("m", changes=TINY[:1]), t, "cpu", 0.5)
    with pytest.raises(ExerciseFailed, match="target is at most"):
        lab10.check_memory_cut(b, b.then("ib", optimizer="in_backward"), t, "cpu", 0.5,
                               steps=1)
    with pytest.raises(ValueError, match="max_ratio"):
        lab10.check_memory_cut(b, b, t, "cpu", 1.5)
    with pytest.raises(ValueError, match="grad_rtol"):
        lab10.check_memory_cut(b, b, t, "cpu", 0.5, grad_rtol=0)
    lean = b.then("lean", batch=2, accum=4, checkpoint=True)
    got = lab10.check_memory_cut(b, lean, t, "cpu", 0.6, steps=1)
    assert got["ratio"] < 0.6 and got["worst"] < 1e-4 and "estimated" in got["what"]
    assert got["grad_gap"] < 1e-4                  # the same gradient up to rounding


def test_memory_cut_check_rejects_other_arithmetic():
    # FP8 products save memory and keep the first steps' losses within 1e-5 (AdamW's first
    # updates are about lr whatever the gradient), but its gradient is ~3 % off: the loss
    # branch alone passed it; the gradient branch must not
    b = base()
    wrong = b.then("fp8", fp8=True)
    with pytest.raises(ExerciseFailed, match="first gradient differs"):
        lab10.check_memory_cut(b, wrong, tokens(), "cpu", 0.99, steps=1)


def test_reference_ladder_reads_every_glued_form():
    rows = [{"name": "baseline", "tokens_per_s": 44500.0, "mfu": 0.038},
            {"name": "fused AdamW", "tokens_per_s": 512000, "mfu": 0.44}]
    want = [{**r, "tokens_per_s": float(r["tokens_per_s"])} for r in rows]
    assert lab10.reference_ladder(rows) == want
    assert lab10.reference_ladder(json.dumps(rows)) == want
    assert lab10.reference_ladder(repr(rows)) == want
    assert lab10.reference_ladder(json.dumps(json.dumps(rows))) == want
    assert lab10.reference_ladder(None) == []
    assert lab10.reference_ladder("[not a ladder") == []
    assert lab10.reference_ladder([{"name": "x"}]) == []
    # chapter 10 now glues the field by the ceiling it is against
    renamed = [{"name": r["name"], "tokens_per_s": r["tokens_per_s"],
                "mfu_bf16_ceiling": r["mfu"]} for r in rows]
    assert lab10.reference_ladder(renamed) == want


def test_reference_fraction(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"ceilings": {"matmul_bf16": {"value": 700e12}}}))
    flops = GPT(config("124M")).flops_per_token(1024)
    assert lab10.reference_fraction(512_000, path=p) == pytest.approx(512_000 * flops / 700e12)
    assert lab10.reference_fraction(None, path=p) is None
    assert lab10.reference_fraction(1.0, path=tmp_path / "missing.json") is None
    assert lab10.reference_fraction(1.0, ceiling="matmul_fp8", path=p) is None


def test_reference_ceilings_path_is_the_ceilings_modules():
    from perflab.machine import ceilings
    assert lab10._REFERENCE_CEILINGS == ceilings.REFERENCE_PATH
