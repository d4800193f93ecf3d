"""perflab.memory (model, predict, measure, snapshots, allocator) on CPU: predictions against saved tensors, the techniques leave the training
unchanged, snapshots and traces, the fragmentation worker's plumbing."""

import json

import pytest
import torch
import torch.nn.functional as F

from perflab.memory import allocator, checkpointing, measure, predict, snapshots, steps
from perflab.memory.model import BlockStack, BlockStackConfig

CFG = BlockStackConfig(d_model=32, n_heads=4, n_layers=2, seq_len=16)
TOL = 1e-5


def _problem(batch=4, seed=0):
    torch.manual_seed(seed)
    model = BlockStack(CFG)
    x = torch.randn(batch, CFG.seq_len, CFG.d_model)
    y = torch.randn_like(x)
    return model, x, y


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def test_param_count_matches_the_module():
    model, _, _ = _problem()
    assert predict.param_count(CFG) == sum(p.numel() for p in model.parameters())


def test_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match="n_heads"):
        BlockStackConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers"):
        BlockStackConfig(n_layers=0)


def test_static_bytes_is_16_per_adam_parameter():
    s = predict.static_bytes(1000)
    assert s == {"params": 4000, "grads": 4000, "optimizer": 8000, "total": 16000}
    assert predict.static_bytes(10, {"params": 2, "grads": 2, "optimizer": 12})["total"] == 160
    with pytest.raises(ValueError, match="n_params"):
        predict.static_bytes(0)


def test_state_bytes_after_a_step_matches_the_prediction():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    steps.train_step(model, opt, x, y)
    counted = measure.state_bytes(model, opt)
    predicted = predict.static_bytes(predict.param_count(CFG))
    assert counted["params"] == predicted["params"] and counted["grads"] == predicted["grads"]
    # Adam's step counters are one float each on the CPU: 4 bytes per parameter tensor
    assert counted["optimizer"] - predicted["optimizer"] == 4 * len(list(model.parameters()))


def test_activation_formula_equals_the_saved_tensors():
    model, x, y = _problem()
    saved = measure.saved_bytes(lambda t: F.mse_loss(model(t), y), x,
                            exclude=list(model.parameters()) + [y])
    assert saved == predict.activation_bytes(CFG, 4)["total"]


def test_activation_bytes_validates():
    with pytest.raises(ValueError, match="batch"):
        predict.activation_bytes(CFG, 0)


def test_cpu_peak_of_the_forward_is_its_saved_tensors():
    model, x, y = _problem()
    peak, loss = measure.peak_bytes(lambda: F.mse_loss(model(x), y), "cpu")
    assert peak.source.startswith("profiler")
    predicted = predict.activation_bytes(CFG, 4)["total"]
    assert predicted <= peak.net <= 1.1 * predicted     # + the loss and small temporaries
    assert peak.peak >= peak.net
    assert isinstance(loss, torch.Tensor)


def test_peak_bytes_rejects_non_callables():
    with pytest.raises(TypeError):
        measure.peak_bytes(3, "cpu")


def test_accumulation_equals_the_full_batch_and_the_wrong_way_does_not():
    model, x, y = _problem(batch=8)
    full = steps.accumulate_gradients(model, x, y)
    g_full = _grads(model)
    acc = steps.accumulate_gradients(model, x, y, micro_batches=4)
    assert float(acc) == pytest.approx(float(full), rel=1e-6)
    assert measure.max_relative_difference(_grads(model), g_full) <= TOL
    for xs, ys in zip(x.chunk(4), y.chunk(4)):      # zero_grad inside the loop
        model.zero_grad(set_to_none=True)
        F.mse_loss(model(xs), ys).backward()
    assert measure.max_relative_difference(_grads(model), g_full) > 0.05
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    steps.accumulated_step(model, opt, x, y, micro_batches=2)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_checkpointing_keeps_less_and_leaves_gradients_equal():
    model, x, y = _problem()
    nets, grads = {}, {}
    for policy in checkpointing.POLICIES:
        forward = lambda t, p=policy: checkpointing.checkpointed(model, t, p)   # noqa: E731
        steps.accumulate_gradients(model, x, y, forward=forward)
        grads[policy] = _grads(model)
        model.zero_grad(set_to_none=True)
        nets[policy] = measure.peak_bytes(lambda: F.mse_loss(forward(x), y), "cpu")[0].net
    assert nets["full"] < nets["selective"] < nets["none"]
    for policy in ("full", "selective"):
        assert measure.max_relative_difference(grads[policy], grads["none"]) <= TOL


def test_save_on_cpu_leaves_gradients_equal():
    model, x, y = _problem()
    steps.accumulate_gradients(model, x, y)
    ref = _grads(model)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.save_on_cpu(pin_memory=False):
        loss = F.mse_loss(model(x), y)
    loss.backward()
    assert measure.max_relative_difference(_grads(model), ref) <= TOL


def test_optimizer_in_backward_makes_the_same_update_and_frees_gradients():
    plain, x, y = _problem()
    fused, _, _ = _problem()
    init = [p.detach().clone() for p in plain.parameters()]
    opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    steps.train_step(plain, opt, x, y)
    hooks = steps.optimizer_in_backward(fused, lambda ps: torch.optim.Adam(ps, lr=1e-3))
    F.mse_loss(fused(x), y).backward()
    assert all(p.grad is None for p in fused.parameters())
    upd = lambda m: [p.detach() - q for p, q in zip(m.parameters(), init)]  # noqa: E731
    assert measure.max_relative_difference(upd(fused), upd(plain)) <= TOL
    assert len(hooks) == len(init)


def test_measure_phases_on_cpu():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    steps.train_step(model, opt, x, y)
    fwd, bwd, step = measure.measure_phases(model, opt, x, y, "cpu")
    assert (fwd.phase, bwd.phase, step.phase) == ("forward", "backward", "step")
    assert fwd.net > 0 and bwd.net < 0
    assert step.net == 0     # Adam updates in place once its state exists


def test_max_relative_difference_validates():
    a = [torch.ones(2)]
    assert measure.max_relative_difference(a, [torch.ones(2) * 2]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="tensors"):
        measure.max_relative_difference(a, a + a)
    with pytest.raises(ValueError, match="shapes"):
        measure.max_relative_difference(a, [torch.ones(3)])
    with pytest.raises(ValueError, match="None"):
        measure.max_relative_difference([None], a)


def test_allocator_rounding():
    MiB = 2**20
    assert allocator.allocator_rounding(1) == {"block": 512, "segment": 2 * MiB, "pool": 0}
    assert allocator.allocator_rounding(MiB)["pool"] == 0
    assert allocator.allocator_rounding(MiB + 1) == {"block": MiB + 512, "segment": 20 * MiB, "pool": 1}
    assert allocator.allocator_rounding(10 * MiB)["segment"] == 10 * MiB
    assert allocator.allocator_rounding(30 * MiB + 1)["segment"] == 32 * MiB
    with pytest.raises(ValueError):
        allocator.allocator_rounding(0)


def test_cpu_trace_snapshot_roundtrip_and_largest_allocation(tmp_path):
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    steps.train_step(model, opt, x, y)
    snap = snapshots.cpu_memory_trace(lambda: steps.train_step(model, opt, x, y))
    path = snapshots.save_snapshot(snap, tmp_path / "s.pickle")
    snapshots.save_snapshot_config(CFG, 4, path)
    again = snapshots.load_snapshot(path)
    assert snapshots.load_snapshot_config(path) == (CFG, 4)
    times, levels = snapshots.allocation_timeline(again)
    assert len(times) == len(levels) > 10 and max(levels) > 0
    big = snapshots.largest_allocation(again)
    sizes = predict.block_tensor_bytes(CFG, 4)
    assert big["size"] == max(sizes.values())
    assert snapshots.name_allocation(big["size"], sizes) == "MLP hidden"
    assert big["frames"][0]["name"].startswith("aten::")


def test_snapshot_readers_validate(tmp_path):
    bad = tmp_path / "bad.pickle"
    snapshots.save_snapshot({"segments": []}, bad)
    with pytest.raises(ValueError, match="device_traces"):
        snapshots.load_snapshot(bad)
    with pytest.raises(ValueError, match="no allocation"):
        snapshots.largest_allocation({"device_traces": [[]]})
    with pytest.raises(ValueError, match="device 1"):
        snapshots.allocation_timeline({"device_traces": [[]]}, 1)


def test_largest_allocation_on_a_cuda_shaped_snapshot():
    trace = [{"action": "alloc", "addr": 1, "size": 512, "frames": []},
             {"action": "alloc", "addr": 2, "size": 4096, "frames": [{"name": "f"}]},
             {"action": "free_requested", "addr": 2, "size": 4096},
             {"action": "free_completed", "addr": 2, "size": 4096},
             {"action": "alloc", "addr": 3, "size": 1024, "frames": []}]
    snap = {"segments": [], "device_traces": [trace]}
    assert snapshots.largest_allocation(snap) == {"size": 4096, "index": 1, "frames": [{"name": "f"}]}
    assert snapshots.allocation_timeline(snap)[1] == [512, 4608, 512, 1536]


def test_cuda_only_helpers_say_so():
    with pytest.raises(ValueError, match="CUDA"):
        allocator.driver_view("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            snapshots.record_snapshot(lambda: None)


def test_freed_without_gc_sees_a_cycle():
    class Cycle:
        def __init__(self):
            self.t = torch.empty(10)
            self.me = self

    class Plain:
        def __init__(self):
            self.t = torch.empty(10)

    assert not allocator.freed_without_gc(Cycle, lambda o: o.t)
    assert allocator.freed_without_gc(Plain, lambda o: o.t)


def test_allocator_experiment_on_cpu_and_in_a_subprocess():
    small = dict(cap_mib=64, big_mib=32, piece_mib=4, request_mib=8)
    direct = allocator.allocator_experiment(device="cpu", **small)
    assert direct["oom"] is False and direct["before"]["reserved_mib"] is None
    assert direct["free_in_holes_mib"] == 16
    child = allocator.run_allocator_experiment("expandable_segments:True", device="cpu", **small)
    assert child["alloc_conf"] == "expandable_segments:True"
    assert json.loads(json.dumps(child)) == child
    with pytest.raises(ValueError):
        allocator.allocator_experiment(cap_mib=10, big_mib=20, device="cpu")


def test_warm_up_takes_one_training_step_of_a_block_stack_on_the_device(monkeypatch):
    seen = []
    real = steps.train_step
    monkeypatch.setattr(measure, "train_step", lambda model, opt, x, y: seen.append(
        (type(model).__name__, x.device.type, type(opt).__name__)) or real(model, opt, x, y))
    measure.warm_up("cpu")
    assert seen == [("BlockStack", "cpu", "Adam")]


def test_gradient_tolerance_rejects_the_plausible_wrong_accumulations():
    """The tolerance comes from a measured rounding spread (the batch permuted) and still
    rejects a gradient of a quarter of the batch and one not divided by the micro-batches."""
    model, x, y = _problem(batch=8)

    def grads(pieces, divide=True, clear_inside=False):
        model.zero_grad(set_to_none=True)
        for xs, ys in zip(x.chunk(pieces), y.chunk(pieces)):
            if clear_inside:
                model.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(xs), ys)
            (loss / pieces if divide else loss).backward()
        return _grads(model)

    full = grads(1)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    F.mse_loss(model(x[perm]), y[perm]).backward()
    tol = measure.gradient_tolerance(measure.max_relative_difference(_grads(model), full))
    assert tol < 1e-3
    assert measure.max_relative_difference(grads(4), full) <= tol
    assert measure.max_relative_difference(grads(4, divide=False), full) > 100 * tol
    assert measure.max_relative_difference(grads(4, clear_inside=True), full) > 100 * tol
    assert measure.gradient_tolerance(0.0) == 100 * torch.finfo(torch.float32).eps
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="spread"):
            measure.gradient_tolerance(bad)


def test_markers_split_a_trace_into_phases():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        snapshots.mark("cpu")
        loss = F.mse_loss(model(x), y)
        snapshots.mark("cpu")
        loss.backward()
        snapshots.mark("cpu")
        opt.step()
        snapshots.mark("cpu")

    step()
    snap = snapshots.cpu_memory_trace(step)
    bounds = snapshots.phase_bounds(snap)
    assert len(bounds) == 4 and bounds == sorted(bounds)
    added = snapshots.live_at_peak(snap, bounds[1])          # what the backward pass holds
    assert added and added == sorted(added, reverse=True)
    with pytest.raises(ValueError, match="marker"):
        snapshots.phase_bounds({"device_traces": [[{"action": "alloc", "size": 8, "addr": 1}]]})


def test_live_at_peak_on_a_cuda_shaped_trace():
    ev = lambda a, addr, size, t: {"action": a, "addr": addr, "size": size, "time_us": t}  # noqa
    trace = [ev("alloc", 1, 100, 0), ev("alloc", 2, 50, 1000), ev("alloc", 3, 30, 2000),
             ev("free_completed", 2, 50, 3000), ev("alloc", 4, 10, 4000)]
    snap = {"device_traces": [trace]}
    assert snapshots.live_at_peak(snap, 0.5) == [50, 30]     # the peak is at 2 ms: 180 bytes


def test_memory_timeline_names_the_categories_on_cpu():
    model, x, y = _problem()
    opt = torch.optim.Adam(model.parameters())
    step = lambda: steps.train_step(model, opt, x, y)   # noqa: E731
    step()
    times, by_cat = measure.memory_timeline(step, "cpu")
    assert times == sorted(times) and {"PARAMETER", "GRADIENT", "ACTIVATION"} <= set(by_cat)
    assert all(len(v) == len(times) for v in by_cat.values())
    assert max(by_cat["ACTIVATION"]) > 0


def test_copy_profile_needs_a_gpu():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            measure.copy_profile(lambda: None)


def test_peak_blocks_say_when_each_block_at_the_peak_was_freed():
    ev = lambda a, addr, size, t: {"action": a, "addr": addr, "size": size, "time_us": t}  # noqa
    trace = [ev("alloc", 1, 100, 0), ev("alloc", 2, 50, 1000), ev("alloc", 3, 50, 2000),
             ev("free_completed", 3, 50, 2020), ev("free_completed", 2, 50, 3000),
             ev("alloc", 4, 10, 4000)]
    blocks = snapshots.peak_blocks({"device_traces": [trace]}, 0.5)
    # the peak is at 2 ms (200 bytes); block 3 lived 20 us, block 2 until 3 ms
    assert [(b["size"], b["alloc_ms"], b["free_ms"]) for b in blocks] == [(50, 1.0, 3.0),
                                                                          (50, 2.0, 2.02)]
    assert all(b["peak_ms"] == 2.0 for b in blocks)
    with pytest.raises(ValueError, match="no event"):
        snapshots.peak_blocks({"device_traces": [trace]}, 10.0)


def test_packed_bytes_counts_every_saved_reference():
    """save_on_cpu copies every pack call: the softmax output (saved by softmax and by @ v)
    twice, the parameters the products save, the input and the target."""
    model, x, y = _problem()
    got = measure.packed_bytes(lambda t: F.mse_loss(model(t), y), x)
    act = predict.activation_bytes(CFG, 4)
    twice = CFG.n_layers * act["attention_scores_per_layer"]
    assert got["every"] - got["distinct"] == twice
    # every save: distinct activations, the scores once more, the weights (no Linear bias is
    # saved), the input x and the target y
    biases = CFG.n_layers * 9 * CFG.d_model * 4
    params = 4 * predict.param_count(CFG) - biases
    assert got["every"] == act["total"] + twice + params + x.nbytes + y.nbytes
    assert got["calls"] > 0
    with pytest.raises(TypeError):
        measure.packed_bytes(42)


def test_backward_peak_bytes_parts():
    cfg = BlockStackConfig(d_model=256, n_heads=8, n_layers=2, seq_len=256)
    got = predict.backward_peak_bytes(cfg, 4)
    # chapter 7's snapshot stack: three 8 MiB score tensors, 9 h^2 floats of weight gradients,
    # minus the MLP's 10 sbh saved floats (1 MiB each)
    assert got == {"scores": 3 * 8 * 2**20, "weight_grads": 9 * 256 * 256 * 4,
                   "freed_mlp": 10 * 2**20, "total": 24 * 2**20 + 9 * 256 * 256 * 4 - 10 * 2**20}
    with pytest.raises(ValueError, match="batch"):
        predict.backward_peak_bytes(cfg, 0)


def test_driver_view_attributes_memory_to_this_process(monkeypatch):
    """NVML's per-process figure splits the device-wide 'used': this process's context (its
    memory outside the allocator) and the other processes' memory."""
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (137 * GiB, 140 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: GiB // 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(allocator.nvml, "process_memory_bytes", lambda pid, index=0: GiB + 2**29)
    view = allocator.driver_view("cuda")
    assert view["used"] == 3 * GiB and view["outside_allocator"] == 2 * GiB
    assert view["process"] == GiB + 2**29
    assert view["process_outside_allocator"] == 2**29
    assert view["other_processes"] == 3 * GiB - GiB - 2**29
    monkeypatch.setattr(allocator.nvml, "process_memory_bytes", lambda pid, index=0: None)
    view = allocator.driver_view("cuda:0")
    assert view["process"] is None and view["other_processes"] is None


def _micro_batch_trace(micro_batches, act=1000, n_act=5, grads=300):
    """A fake CUDA trace of one accumulation step: each micro-batch allocates ``n_act``
    activations and frees them in its backward (with a small wobble); the optimizer's
    temporaries at the end are smaller than a micro-batch's activations."""
    trace, addr = [], 0
    for _ in range(micro_batches):
        held = []
        for _ in range(n_act):
            addr += 1
            held.append(addr)
            trace.append({"action": "alloc", "addr": addr, "size": act})
        for a in held:
            trace.append({"action": "free_completed", "addr": a, "size": act})
            addr += 1                       # a backward temporary: a wobble on the way down
            trace.append({"action": "alloc", "addr": addr, "size": act // 10})
            trace.append({"action": "free_completed", "addr": addr, "size": act // 10})
    trace.append({"action": "alloc", "addr": addr + 1, "size": grads})
    trace.append({"action": "free_completed", "addr": addr + 1, "size": grads})
    return {"segments": [], "device_traces": [trace]}


@pytest.mark.parametrize("micro_batches", [1, 3, 8])
def test_count_rises_counts_one_tooth_per_micro_batch(micro_batches):
    _, levels = snapshots.allocation_timeline(_micro_batch_trace(micro_batches))
    assert snapshots.count_rises(levels) == micro_batches


def test_count_rises_sees_a_cut_snapshot_and_ignores_wobbles():
    _, levels = snapshots.allocation_timeline(_micro_batch_trace(8))
    # the last 40 % of the events: a snapshot cut by max_entries shows fewer teeth
    assert snapshots.count_rises(levels[int(0.6 * len(levels)):]) < 8
    # a curve that wobbles in its middle without reaching the high mark again: one rise
    assert snapshots.count_rises([0, 10, 6, 9, 6, 10, 0]) == 1
    assert snapshots.count_rises([0, 10, 0, 10, 0]) == 2
    assert snapshots.count_rises([5, 5, 5]) == 0
    with pytest.raises(ValueError, match="levels"):
        snapshots.count_rises([])
    with pytest.raises(ValueError, match="low"):
        snapshots.count_rises([0, 1], low=0.8, high=0.5)
