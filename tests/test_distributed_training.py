"""perflab.distributed.training: formulas, the trace summary, and real gloo launches on 2 and 3 CPU processes.

Every launch carries its own timeout (the launcher kills torchrun's whole session), so no test
can hang; sizes are tiny and each world size is one launch that batches all the tasks.
"""

import statistics
from collections import Counter

import pytest

from perflab.distributed import torchrun, training
from perflab.core.device import gpu_count

pytestmark = pytest.mark.skipif(gpu_count() >= 2, reason="checks the CPU (gloo) path")

TINY = {"width": 16, "depth": 2, "batch": 4, "warmup": 1, "iters": 1}


def test_bus_factor_follows_nccl_tests():
    assert training.bus_factor("all_reduce", 2) == 1.0
    assert training.bus_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert training.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert training.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert training.bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError, match="op"):
        training.bus_factor("gather", 2)
    with pytest.raises(ValueError, match="world_size"):
        training.bus_factor("all_reduce", 1)


def test_static_bytes_formula_is_zeros_table():
    p = 1000
    assert training.static_bytes_formula(p, 4, "ddp") == 16_000
    assert training.static_bytes_formula(p, 4, "zero1") == 8_000 + 2_000
    assert training.static_bytes_formula(p, 4, "fsdp") == 4_000
    with pytest.raises(ValueError, match="strategy"):
        training.static_bytes_formula(p, 2, "zero3")


def test_overlap_from_trace_gpu_and_cpu():
    gpu = {"traceEvents": [
        {"cat": "kernel", "name": "gemm", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32", "ts": 50, "dur": 100},
        {"cat": "kernel", "name": "gemm", "ts": 120, "dur": 10},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},
    ]}
    s = training.overlap_from_trace(gpu)
    assert s["source"] == "gpu kernels"
    assert s["comm_s"] == pytest.approx(100e-6)
    assert s["overlap_s"] == pytest.approx(60e-6)
    assert s["overlap_fraction"] == pytest.approx(0.6)
    cpu = {"traceEvents": [
        {"cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "ts": 10, "dur": 10},
        {"cat": "user_annotation", "name": "gloo:all_reduce", "ts": 15, "dur": 20},
    ]}
    s = training.overlap_from_trace(cpu)
    assert s["source"] == "cpu ops" and s["overlap_fraction"] == pytest.approx(0.25)
    assert training.overlap_from_trace({"traceEvents": []})["overlap_fraction"] is None
    with pytest.raises(ValueError, match="traceEvents"):
        training.overlap_from_trace({})


def test_interleaved_rounds_rotate_the_order_so_a_drift_reaches_every_step_alike():
    # three equally fast steps on a machine that slows down by 2 % with every call (GPUs
    # heating toward their power limit): the true ratio of any two steps is 1
    calls = []

    def heating(step):
        calls.append(step())
        return 1.0 + 0.02 * (len(calls) - 1)

    names = ["single", "manual", "ddp"]
    steps = {n: (lambda n=n: n) for n in names}
    times, orders = training.interleaved_rounds(steps, heating, rounds=6)
    assert orders[:3] == [names, ["manual", "ddp", "single"], ["ddp", "single", "manual"]]
    assert orders[3:] == orders[:3] and calls == [n for o in orders for n in o]
    assert all(len(times[n]) == 6 for n in names)
    # each step ran twice in each position of a round
    for n in names:
        assert Counter(o.index(n) for o in orders) == {0: 2, 1: 2, 2: 2}
    interleaved = statistics.median(times["single"]) / statistics.median(times["ddp"])
    # the same 18 calls one step after the other, DDP last, read DDP 19 % slow
    k = iter(range(18))
    one_after_another = {n: [1.0 + 0.02 * next(k) for _ in range(6)] for n in names}
    sequential = (statistics.median(one_after_another["single"])
                  / statistics.median(one_after_another["ddp"]))
    assert sequential < 0.85
    assert abs(interleaved - 1) < 0.02


def test_interleaved_rounds_reject_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        training.interleaved_rounds({}, lambda fn: 1.0, 3)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="rounds"):
            training.interleaved_rounds({"a": lambda: None}, lambda fn: 1.0, bad)


def test_pick_for_follows_the_workers_backend(monkeypatch):
    monkeypatch.delenv("PERFLAB_FORCE_CPU_SIZES", raising=False)
    assert training.pick_for("gloo", 1, 2) == 1 and training.pick_for("nccl", 1, 2) == 2
    monkeypatch.setenv("PERFLAB_FORCE_CPU_SIZES", "1")
    assert training.pick_for("nccl", 1, 2) == 1
    with pytest.raises(ValueError, match="backend"):
        training.pick_for("mpi", 1, 2)


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown task"):
        training.launch([{"name": "nope"}], nproc=2, backend="gloo")
    with pytest.raises(ValueError, match="nnodes"):
        training.launch([], nproc=2, nnodes=3, backend="gloo")
    with pytest.raises(ValueError, match="MIN:MAX"):
        training.launch([], nproc=1, nnodes="2:1", backend="gloo")
    with pytest.raises(ValueError, match="nccl"):
        training.launch([], nproc=gpu_count() + 1, backend="nccl")
    with pytest.raises(ValueError, match="source"):
        training.source_of(len)
    assert 0 < torchrun.free_port() < 65536


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch per world size 2 and 3; each starts by dying once and resuming (max_restarts=1),
    then runs every chapter task; world 3 loads the checkpoint world 2 saved (a reshard onto a
    world size that does not divide the first). Three ranks are already more processes than a
    2-core CI machine has cores; a world of 4 added 11 s of 39 (locally) and nothing 3 lacks."""
    out = {}
    root = tmp_path_factory.mktemp("dcp")
    for n in (2, 3):
        tasks = [
            {"name": "train_ckpt", "args": {"steps": 4, "every": 2, "fail_at": 3}},
            {"name": "collectives"},
            {"name": "sweep", "args": {"sizes": [4096, 65536], "max_iters": 3,
                                       "ops": ["all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast", "all_to_all"]}},
            {"name": "manual_vs_ddp", "args": dict(TINY, check_steps=2, rounds=3)},
            {"name": "buckets", "args": dict(TINY, bucket_mbs=[0.001, 1])},
            {"name": "buckets", "key": "block_buckets", "args": {
                "bucket_mbs": [0.001, 1], "batch": 2, "blocks": [1, 32, 8], "iters": 1}},
            {"name": "overlap", "args": {"width": 16, "depth": 2, "batch": 4, "bucket_mb": 0.001, "steps": 2}},
            {"name": "no_sync", "args": {"accum": 3}},
            {"name": "sharding", "args": dict(TINY, strategies=["ddp", "zero1", "fsdp"])},
            {"name": "dcp_save", "args": {"path": str(root / f"w{n}")}},
        ]
        if n > 2:
            tasks.append({"name": "dcp_load", "args": {"path": str(root / f"w{n - 1}")}})
        out[n] = training.launch(tasks, nproc=n, backend="gloo", max_restarts=1, timeout_s=150, pg_timeout_s=30)
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_task_on_world_size(runs, n):
    ranks = runs[n]
    assert [r["rank"] for r in ranks] == list(range(n))
    assert all(r["world_size"] == n and r["restart_count"] == 1 for r in ranks)
    res = [r["results"] for r in ranks]
    # failure and restart: the job resumed from the checkpoint of step 2, as if never interrupted
    for r in res:
        assert r["train_ckpt"]["resumed_from"] == 2 and len(r["train_ckpt"]["losses"]) == 2
        assert r["train_ckpt"]["vs_single"] < 1e-12
    # collective semantics: rank r holds [10r, 10r+1, ...]
    m = len(res[0]["collectives"]["all_reduce"]["input"])
    total = [sum(10 * r + i for r in range(n)) for i in range(m)]
    for r, rr in enumerate(res):
        c = rr["collectives"]
        assert c["broadcast"]["output"] == list(map(float, range(m)))
        assert c["all_reduce"]["output"] == total
        assert c["reduce_scatter"]["output"] == total[r * (m // n):(r + 1) * (m // n)]
        assert c["all_gather"]["output"] == [10.0 * q + i for q in range(n) for i in range(m)]
        assert c["all_to_all"]["output"] == [10.0 * q + r * (m // n) + i for q in range(n) for i in range(m // n)]
        assert (c["reduce"]["output"] == total) if r == 0 else c["reduce"]["output"] is None
    sweep = res[0]["sweep"]
    assert set(sweep) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
    for op, points in sweep.items():
        for p in points:
            assert p["busbw"] == pytest.approx(p["algbw"] * training.bus_factor(op, n))
    # manual data parallelism = DDP, exactly in float64
    mv = res[0]["manual_vs_ddp"]
    assert mv["max_param_diff"] < 1e-12
    assert all(mv[k] > 0 for k in ("single_s", "manual_s", "ddp_s", "allreduce_s"))
    # the three steps were timed in three interleaved rounds, each reported as its median
    assert mv["round_orders"] == [["single", "manual", "ddp"], ["manual", "ddp", "single"],
                                  ["ddp", "single", "manual"]]
    for k in ("single", "manual", "ddp"):
        assert len(mv[k + "_rounds_s"]) == 3
        assert mv[k + "_s"] == statistics.median(mv[k + "_rounds_s"])
    assert set(res[0]["buckets"]["step_s"]) == {"0.001", "1.0"}
    ov = res[0]["overlap"]
    assert ov["comm_s"] > 0 and 0 <= ov["overlap_fraction"] <= 1
    # no_sync: equal gradients on every rank, equal to one process on all micro-batches
    assert res[0]["no_sync"]["rank_spread"] == 0.0
    assert res[0]["no_sync"]["vs_single"] < 1e-12
    # sharding: counted bytes per rank follow the ZeRO formulas
    sh = res[0]["sharding"]
    p = sh["params"]
    for name, formula in (("ddp", "ddp"), ("zero1", "zero1"), ("fsdp", "fsdp")):
        counted = sum(r["sharding"]["strategies"][name]["static_bytes"] for r in res) / n
        assert counted == pytest.approx(training.static_bytes_formula(p, n, formula), rel=0.02), name
        assert sh["strategies"][name]["released_bytes"] is None  # CUDA allocator only
    assert res[0]["dcp_save"]["files"]
    if n > 2:
        assert res[0]["dcp_load"]["max_diff"] == 0.0
        # the weight (32 x 32) was saved in n-1 shards and is now split n ways: 32/n rows, rounded up
        assert res[0]["dcp_load"]["shards"]["0.0.weight"][0] == -(-32 // n)


def test_two_nodes_on_one_machine():
    ranks = training.launch([{"name": "collectives"}, {"name": "no_sync", "args": {"accum": 2}}],
                            nproc=1, nnodes=2, backend="gloo", timeout_s=120, pg_timeout_s=30)
    assert sorted((r["node"], r["local_rank"]) for r in ranks) == [(0, 0), (1, 0)]
    assert ranks[1]["results"]["collectives"]["all_reduce"]["output"] == [10.0, 12.0, 14.0, 16.0]
    assert ranks[0]["results"]["no_sync"]["vs_single"] < 1e-12


def test_a_hung_rank_ends_in_the_process_group_timeout():
    f = training.expect_failure([{"name": "hang", "args": {"sleep_s": 300, "timeout_s": 2}}], nproc=2,
                                backend="gloo", timeout_s=90)
    assert "Timed out" in f.message or "timed out" in f.message
    assert "torchrun timed out" not in f.message     # the ranks' 2 s timeout ended it, not the launcher
    assert "timed out" in f.first_error.lower() and "torch.distributed.run" not in f.first_error
    # the job ended after the 2 s timeout (a timeout never fires early), counted from the
    # moment a rank started to wait
    assert f.after_wait_s >= 2
    # the waiting rank ran with the fail-fast settings, NCCL's heartbeat monitor off among them
    assert f.rank_env == training.FAIL_FAST_ENV
    assert f.rank_env["TORCH_NCCL_ENABLE_MONITORING"] == "0"


NCCL_TIMEOUT_OUTPUT = """\
perflab-hang-wait-starts 0 1700000000.250
[rank0]:[E1130 23:46:25.123456 2629 ProcessGroupNCCL.cpp:685] [PG ID 1 PG GUID 1 Rank 0] \
Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, \
Timeout(ms)=10000) ran for 10087 milliseconds before timing out.
[rank0]:[E1130 23:46:25.123999 2629 ProcessGroupNCCL.cpp:2110] [PG ID 1 PG GUID 1 Rank 0] \
To avoid data inconsistency, we are taking the entire process down.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 1 PG GUID 1 Rank 0] Process group watchdog thread terminated with exception
W1130 23:46:26.000000 2620 torch/distributed/elastic/multiprocessing/api.py:900] Sending \
process 2630 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -6 (pid: 2629)
"""


def test_an_nccl_timeout_is_reported_by_the_ranks_own_watchdog_line():
    from perflab.distributed.torchrun import _failure

    err = _failure("torchrun exited with status 1", ["python", "-m", "torch.distributed.run"],
                   NCCL_TIMEOUT_OUTPUT)
    f = training.Failure(11.0, str(err), err.output)
    assert f.first_error.startswith("[rank0]:[PG ID 1 PG GUID 1 Rank 0] Watchdog caught")
    assert "ran for 10087 milliseconds" in f.first_error
    errors = str(err).split("--- worker errors ---\n")[1].split("\n--- last")[0].splitlines()
    assert errors[1] == "terminate called after throwing an instance of 'c10::DistBackendError'"
    assert not any("ChildFailedError" in e or "SIGTERM" in e for e in errors)
    assert training._wait_start(NCCL_TIMEOUT_OUTPUT + "perflab-hang-wait-starts 1 1700000001\n") \
        == 1700000000.25
    assert training._wait_start("no marker") is None


def test_the_ranks_environment_line_is_read_and_never_taken_for_the_error():
    from perflab.distributed.torchrun import _failure

    out = ('[rank1]:perflab-hang-env {"TORCH_NCCL_ENABLE_MONITORING": "0", '
           '"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"}\n'
           "[rank1]: the collective hit its timeout after 3 s\n")
    err = _failure("torchrun exited with status 1", ["torchrun"], out)
    f = training.Failure(4.0, str(err), out)
    assert f.first_error == "[rank1]: the collective hit its timeout after 3 s"
    assert training._rank_env(out) == {"TORCH_NCCL_ENABLE_MONITORING": "0",
                                       "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"}
    assert training._rank_env("no marker") is None


def test_a_failing_job_runs_with_the_fail_fast_environment(monkeypatch):
    from perflab.distributed.torchrun import LaunchError

    seen = {}

    def fake_launch(tasks, env=None, **kw):
        seen.update(env)
        raise LaunchError("torchrun exited with status 1: x", "perflab-hang-wait-starts 0 1.0\n")

    monkeypatch.setattr(training, "launch", fake_launch)
    f = training.expect_failure([{"name": "hang"}], env={"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"})
    assert seen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert seen["TORCH_NCCL_ENABLE_MONITORING"] == "0"   # no heartbeat monitor's wait
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"   # the caller's env wins
    assert f.after_wait_s > 0 and f.output.startswith("perflab-hang")


def test_the_launcher_kills_a_job_that_outlives_its_timeout():
    f = training.expect_failure([{"name": "hang", "args": {"sleep_s": 300}}], nproc=2, backend="gloo",
                                pg_timeout_s=300, timeout_s=10)
    assert "torchrun timed out after 10 s" in f.message


def test_expect_failure_refuses_a_job_that_succeeds(monkeypatch):
    monkeypatch.setattr(training, "launch", lambda tasks, **kw: [])
    with pytest.raises(RuntimeError, match="expected to fail"):
        training.expect_failure([{"name": "collectives"}], nproc=2)


def test_settled_reading_waits_until_the_reading_stops_changing():
    # memory_allocated as the watchdog releases stashed tensors: 300, 200, then 100 for good
    values = iter([300, 200, 100, 100, 100, 100])
    prepared, slept = [], []
    got = training.settled_reading(lambda: next(values), lambda: prepared.append(1),
                                   repeats=3, interval_s=0.5, sleep=slept.append)
    assert got == 100 and len(prepared) == 5 and slept == [0.5] * 4


def test_settled_reading_gives_up_after_its_timeout():
    counter = iter(range(1000))
    slept = []
    got = training.settled_reading(lambda: next(counter), repeats=2, interval_s=1.0, timeout_s=3.0,
                                   sleep=slept.append)
    assert got == 3 and slept == [1.0] * 3
    with pytest.raises(ValueError, match="repeats"):
        training.settled_reading(lambda: 0, repeats=0)


def test_bucket_counts_come_from_ddp(runs):
    """A stack of GPT-2 blocks: a cap below the large tensors gives several buckets, never more
    than the tensors (DDP never splits one), a cap above them all one bucket; the counts are
    DDP's own and the buckets hold every gradient byte."""
    for n in (2, 3):
        bk = runs[n][0]["results"]["block_buckets"]
        tensors = 12                              # one block: 2 norms x2, 4 linears x2
        assert 1 < bk["buckets"]["0.001"] <= tensors and bk["buckets"]["1.0"] == 1
        assert sum(bk["bucket_bytes"]["0.001"]) == sum(bk["bucket_bytes"]["1.0"]) == bk["grad_bytes"]


def test_an_elastic_job_resumes_on_the_ranks_it_has(runs, tmp_path):
    """--nnodes=1:2 with one node: the job starts on one rank after the rendezvous's last call,
    and loads bit-exactly the sharded checkpoint three ranks saved."""
    saved = runs[3][0]["results"]["dcp_save"]["path"]
    out = training.launch([{"name": "dcp_load", "args": {"path": saved}}], nproc=1, nnodes="1:2",
                          backend="gloo", timeout_s=150, pg_timeout_s=30)
    assert [r["world_size"] for r in out] == [1]
    assert out[0]["results"]["dcp_load"]["max_diff"] == 0.0
