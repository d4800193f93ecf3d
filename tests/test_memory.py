"""perflab.memory.training on CPU: predictions against saved tensors, the techniques leave the training
unchanged, snapshots and traces, the fragmentation worker's plumbing."""

import json

import pytest
import torch
import torch.nn.functional as F

from perflab.memory import training as mem

CFG = mem.BlockStackConfig(d_model=32, n_heads=4, n_layers=2, seq_len=16)
TOL = 1e-5


def _problem(batch=4, seed=0):
    torch.manual_seed(seed)
    model = mem.BlockStack(CFG)
    x = torch.randn(batch, CFG.seq_len, CFG.d_model)
    y = torch.randn_like(x)
    return model, x, y


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def test_param_count_matches_the_module():
    model, _, _ = _problem()
    assert mem.param_count(CFG) == sum(p.numel() for p in model.parameters())


def test_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match="n_heads"):
        mem.BlockStackConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers"):
        mem.BlockStackConfig(n_layers=0)
    with pytest.raises(ValueError, match="checkpoint"):
        mem.BlockStack(CFG, checkpoint="sometimes")


def test_static_bytes_is_16_per_adam_parameter():
    s = mem.static_bytes(1000)
    assert s == {"params": 4000, "grads": 4000, "optimizer": 8000, "total": 16000}
    assert mem.static_bytes(10, {"params": 2, "grads": 2, "optimizer": 12})["total"] == 160
    with pytest.raises(ValueError, match="n_params"):
        mem.static_bytes(0)


def test_state_bytes_after_a_step_matches_the_prediction():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    mem.train_step(model, opt, x, y)
    counted = mem.state_bytes(model, opt)
    predicted = mem.static_bytes(mem.param_count(CFG))
    assert counted["params"] == predicted["params"] and counted["grads"] == predicted["grads"]
    # Adam's step counters are one float each on the CPU: 4 bytes per parameter tensor
    assert counted["optimizer"] - predicted["optimizer"] == 4 * len(list(model.parameters()))


def test_activation_formula_equals_the_saved_tensors():
    model, x, y = _problem()
    saved = mem.saved_bytes(lambda t: F.mse_loss(model(t), y), x,
                            exclude=list(model.parameters()) + [y])
    assert saved == mem.activation_bytes(CFG, 4)["total"]


def test_activation_bytes_validates():
    with pytest.raises(ValueError, match="batch"):
        mem.activation_bytes(CFG, 0)


def test_cpu_peak_of_the_forward_is_its_saved_tensors():
    model, x, y = _problem()
    peak, loss = mem.peak_bytes(lambda: F.mse_loss(model(x), y), "cpu")
    assert peak.source.startswith("profiler")
    predicted = mem.activation_bytes(CFG, 4)["total"]
    assert predicted <= peak.net <= 1.1 * predicted     # + the loss and small temporaries
    assert peak.peak >= peak.net
    assert isinstance(loss, torch.Tensor)


def test_peak_bytes_rejects_non_callables():
    with pytest.raises(TypeError):
        mem.peak_bytes(3, "cpu")


def test_checkpointing_keeps_less_and_leaves_gradients_equal():
    model, x, y = _problem()
    nets, grads = {}, {}
    for mode in mem.BlockStack.MODES:
        model.checkpoint = mode
        mem.train_step(model, None, x, y)
        grads[mode] = _grads(model)
        model.zero_grad(set_to_none=True)
        nets[mode] = mem.peak_bytes(lambda: F.mse_loss(model(x), y), "cpu")[0].net
    assert nets["full"] < nets["selective"] < nets["none"]
    for mode in ("full", "selective"):
        assert mem.max_relative_difference(grads[mode], grads["none"]) <= TOL


def test_accumulation_equals_the_full_batch_and_the_wrong_way_does_not():
    model, x, y = _problem(batch=8)
    full = mem.train_step(model, None, x, y)
    g_full = _grads(model)
    acc = mem.train_step(model, None, x, y, micro_batches=4)
    assert acc == pytest.approx(full, rel=1e-6)
    assert mem.max_relative_difference(_grads(model), g_full) <= TOL
    for xs, ys in zip(x.chunk(4), y.chunk(4)):      # zero_grad inside the loop
        model.zero_grad(set_to_none=True)
        F.mse_loss(model(xs), ys).backward()
    assert mem.max_relative_difference(_grads(model), g_full) > 0.05
    with pytest.raises(ValueError, match="micro_batches"):
        mem.train_step(model, None, x, y, micro_batches=3)


def test_save_on_cpu_leaves_gradients_equal():
    model, x, y = _problem()
    mem.train_step(model, None, x, y)
    ref = _grads(model)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.save_on_cpu(pin_memory=False):
        loss = F.mse_loss(model(x), y)
    loss.backward()
    assert mem.max_relative_difference(_grads(model), ref) <= TOL


def test_optimizer_in_backward_makes_the_same_update_and_frees_gradients():
    plain, x, y = _problem()
    fused, _, _ = _problem()
    init = [p.detach().clone() for p in plain.parameters()]
    opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    mem.train_step(plain, opt, x, y)
    hooks = mem.optimizer_in_backward(fused, lambda ps: torch.optim.Adam(ps, lr=1e-3))
    F.mse_loss(fused(x), y).backward()
    assert all(p.grad is None for p in fused.parameters())
    upd = lambda m: [p.detach() - q for p, q in zip(m.parameters(), init)]  # noqa: E731
    assert mem.max_relative_difference(upd(fused), upd(plain)) <= TOL
    assert len(hooks) == len(init)


def test_measure_phases_on_cpu():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    mem.train_step(model, opt, x, y)
    fwd, bwd, step = mem.measure_phases(model, opt, x, y, "cpu")
    assert (fwd.phase, bwd.phase, step.phase) == ("forward", "backward", "step")
    assert fwd.net > 0 and bwd.net < 0
    assert step.net == 0     # Adam updates in place once its state exists


def test_max_relative_difference_validates():
    a = [torch.ones(2)]
    assert mem.max_relative_difference(a, [torch.ones(2) * 2]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="tensors"):
        mem.max_relative_difference(a, a + a)
    with pytest.raises(ValueError, match="shapes"):
        mem.max_relative_difference(a, [torch.ones(3)])
    with pytest.raises(ValueError, match="None"):
        mem.max_relative_difference([None], a)


def test_allocator_rounding():
    MiB = 2**20
    assert mem.allocator_rounding(1) == {"block": 512, "segment": 2 * MiB, "pool": 0}
    assert mem.allocator_rounding(MiB)["pool"] == 0
    assert mem.allocator_rounding(MiB + 1) == {"block": MiB + 512, "segment": 20 * MiB, "pool": 1}
    assert mem.allocator_rounding(10 * MiB)["segment"] == 10 * MiB
    assert mem.allocator_rounding(30 * MiB + 1)["segment"] == 32 * MiB
    with pytest.raises(ValueError):
        mem.allocator_rounding(0)


def test_cpu_trace_snapshot_roundtrip_and_largest_allocation(tmp_path):
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    mem.train_step(model, opt, x, y)
    snap = mem.cpu_memory_trace(lambda: mem.train_step(model, opt, x, y))
    path = mem.save_snapshot(snap, tmp_path / "s.pickle")
    mem.save_snapshot_config(CFG, 4, path)
    again = mem.load_snapshot(path)
    assert mem.load_snapshot_config(path) == (CFG, 4)
    times, levels = mem.allocation_timeline(again)
    assert len(times) == len(levels) > 10 and max(levels) > 0
    big = mem.largest_allocation(again)
    sizes = mem.block_tensor_bytes(CFG, 4)
    assert big["size"] == max(sizes.values())
    assert mem.name_allocation(big["size"], sizes) == "MLP hidden"
    assert big["frames"][0]["name"].startswith("aten::")


def test_snapshot_readers_validate(tmp_path):
    bad = tmp_path / "bad.pickle"
    mem.save_snapshot({"segments": []}, bad)
    with pytest.raises(ValueError, match="device_traces"):
        mem.load_snapshot(bad)
    with pytest.raises(ValueError, match="no allocation"):
        mem.largest_allocation({"device_traces": [[]]})
    with pytest.raises(ValueError, match="device 1"):
        mem.allocation_timeline({"device_traces": [[]]}, 1)


def test_largest_allocation_on_a_cuda_shaped_snapshot():
    trace = [{"action": "alloc", "addr": 1, "size": 512, "frames": []},
             {"action": "alloc", "addr": 2, "size": 4096, "frames": [{"name": "f"}]},
             {"action": "free_requested", "addr": 2, "size": 4096},
             {"action": "free_completed", "addr": 2, "size": 4096},
             {"action": "alloc", "addr": 3, "size": 1024, "frames": []}]
    snap = {"segments": [], "device_traces": [trace]}
    assert mem.largest_allocation(snap) == {"size": 4096, "index": 1, "frames": [{"name": "f"}]}
    assert mem.allocation_timeline(snap)[1] == [512, 4608, 512, 1536]


def test_cuda_only_helpers_say_so():
    with pytest.raises(ValueError, match="CUDA"):
        mem.driver_view("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            mem.record_snapshot(lambda: None)


def test_freed_without_gc_sees_a_cycle():
    class Cycle:
        def __init__(self):
            self.t = torch.empty(10)
            self.me = self

    class Plain:
        def __init__(self):
            self.t = torch.empty(10)

    assert not mem.freed_without_gc(Cycle, lambda o: o.t)
    assert mem.freed_without_gc(Plain, lambda o: o.t)


def test_allocator_experiment_on_cpu_and_in_a_subprocess():
    small = dict(cap_mib=64, big_mib=32, piece_mib=4, request_mib=8)
    direct = mem.allocator_experiment(device="cpu", **small)
    assert direct["oom"] is False and direct["before"]["reserved_mib"] is None
    assert direct["free_in_holes_mib"] == 16
    child = mem.run_allocator_experiment("expandable_segments:True", device="cpu", **small)
    assert child["alloc_conf"] == "expandable_segments:True"
    assert json.loads(json.dumps(child)) == child
    with pytest.raises(ValueError):
        mem.allocator_experiment(cap_mib=10, big_mib=20, device="cpu")


def test_warm_up_runs_on_cpu():
    mem.warm_up("cpu")
