"""tests/background.py: the session's heavy work, two jobs at a time, ahead of its tests."""

import subprocess
import sys
import threading
import time

import pytest

import background


class Counter:
    """How many jobs run at once, and in what order they started."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.started = []
        self.finished = set()
        self.beside = {}            # key -> the keys running when it started

    def job(self, key, seconds=0.05):
        def fn():
            with self.lock:
                self.beside[key] = [k for k in self.started if k not in self.finished]
                self.now += 1
                self.most = max(self.most, self.now)
                self.started.append(key)
            time.sleep(seconds)
            with self.lock:
                self.now -= 1
                self.finished.add(key)
            return key
        return fn


@pytest.fixture
def counter():
    return Counter()


def test_jobs_run_two_at_a_time_in_queue_order_and_hand_back_values_and_errors(counter):
    pool = background.Pool(2)
    for k in range(6):
        pool.submit(f"j{k}", counter.job(f"j{k}"))

    def broken():
        raise ValueError("broken job")
    pool.submit("broken", broken)
    pool.start()
    try:
        assert [pool.result(f"j{k}").value for k in range(6)] == [f"j{k}" for k in range(6)]
        assert isinstance(pool.result("broken").error, ValueError)
        assert pool.result("nobody queued this") is None
    finally:
        pool.close()
    assert counter.most == 2
    assert counter.started == [f"j{k}" for k in range(6)]


def test_a_job_waits_for_the_jobs_it_comes_after(counter):
    pool = background.Pool(2)
    pool.submit("first", counter.job("first", 0.3))
    pool.submit("second", counter.job("second"), after=("first",))
    pool.start()
    try:
        pool.result("second")
    finally:
        pool.close()
    assert counter.started == ["first", "second"] and counter.beside["second"] == []


def test_long_jobs_start_first_longest_first_but_after_the_jobs_they_follow(counter):
    pool = background.Pool(1)
    pool.submit("gate", counter.job("gate"))
    pool.submit("short", counter.job("short"))
    pool.submit("long", counter.job("long"), priority=100)
    pool.submit("longest", counter.job("longest"), after=("gate",), priority=600)
    pool.start()
    try:
        pool.settle()                   # waits for every job without asking for one
    finally:
        pool.close()
    # "longest" waits for "gate": "long" starts first; then, of the rest, "gate" (queued first),
    # and once it is done "longest" goes before "short"
    assert counter.started == ["long", "gate", "longest", "short"], counter.started
    assert background.expected_seconds(f"lab {background.ROOT / 'labs' / '09_advanced.md'}") >= 200
    assert background.expected_seconds(f"execute {background.ROOT / 'book' / '02_hardware.md'}") == 0
    assert background.expected_seconds("ceilings") == 0


def test_light_jobs_run_on_a_worker_of_their_own_beside_the_slots(counter):
    """Two slots busy with long jobs, the light ones still start at once, one after another, and
    an alone job waits for them as for any other."""
    pool = background.Pool(2)
    for k in range(2):
        pool.submit(f"cpu{k}", counter.job(f"cpu{k}", 1.5))
    pool.submit("light0", counter.job("light0", 0.1), light=True)
    pool.submit("light1", counter.job("light1", 0.1), light=True, after=("light0",))
    pool.submit("alone", counter.job("alone"), alone=True)
    with pytest.raises(ValueError, match="cannot be alone"):
        pool.submit("both", counter.job("both"), alone=True, light=True)
    pool.start()
    try:
        pool.result("light1")
        assert "light0" not in counter.beside["light1"]       # one light job at a time
        assert counter.finished >= {"light0", "light1"}
        assert not {"cpu0", "cpu1"} <= counter.finished      # done while both slots still ran
        pool.result("alone")
    finally:
        pool.close()
    assert counter.beside["alone"] == [] and counter.most == 3


def test_an_alone_job_starts_only_when_asked_and_with_nothing_beside_it(counter):
    pool = background.Pool(2)
    pool.submit("alone", counter.job("alone"), alone=True)
    for k in range(4):
        pool.submit(f"j{k}", counter.job(f"j{k}", 0.2))
    pool.start()
    try:
        time.sleep(0.1)
        assert "alone" not in counter.started          # not started ahead
        job = pool.result("alone")                     # asked: the running jobs drain first
        assert job.value == "alone"
        assert counter.beside["alone"] == []
        for k in range(4):
            pool.result(f"j{k}")
    finally:
        pool.close()
    assert all("alone" not in beside for beside in counter.beside.values())


def test_settling_waits_for_every_job_that_runs_beside_others_and_starts_no_alone_one(counter):
    pool = background.Pool(2)
    pool.submit("alone", counter.job("alone"), alone=True)
    pool.submit("after alone", counter.job("after alone"), after=("alone",))
    for k in range(3):
        pool.submit(f"j{k}", counter.job(f"j{k}", 0.2))
    pool.start()
    try:
        pool.settle()
        assert all(pool.jobs[f"j{k}"].state == "done" for k in range(3))
        assert "alone" not in counter.started and "after alone" not in counter.started
        assert pool.result("alone").value == "alone"
        assert counter.beside["alone"] == []           # nothing left to drain
    finally:
        pool.close()


def _started(counter, jobs, seconds):
    """A two-slot pool running ``jobs`` jobs of ``seconds`` each, caught just after its start."""
    pool = background.Pool(2)
    for k in range(jobs):
        pool.submit(f"j{k}", counter.job(f"j{k}", seconds))
    pool.start()
    time.sleep(0.05)
    return pool


def test_a_narrow_block_waits_until_at_most_its_jobs_run_and_starts_no_more(counter):
    pool = _started(counter, jobs=6, seconds=0.1)
    try:
        with pool.narrow(1):
            assert counter.now <= 1
            time.sleep(0.5)
            assert counter.most == 2                   # before the block
            inside = counter.started[2:]
            assert inside and all(counter.beside[k] == [] for k in inside)   # one at a time
        for k in range(6):
            pool.result(f"j{k}")
    finally:
        pool.close()
    assert len(counter.started) == 6


def _first_process(pool, name: str, within_s: float):
    """The first process job ``name`` started, once it has started one (``within_s`` at most)."""
    deadline = time.monotonic() + within_s
    while not pool.jobs[name].procs and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool.jobs[name].procs[0]


def test_closing_the_pool_kills_a_running_process_and_drops_the_queue():
    pool = background.Pool(1)
    pool.submit("sleeper", lambda: pool.run([sys.executable, "-c", "import time; time.sleep(60)"], 120))
    pool.submit("never", lambda: "ran")
    pool.start()
    proc = _first_process(pool, "sleeper", within_s=30)
    t0 = time.monotonic()
    pool.close()
    assert proc.poll() is not None and time.monotonic() - t0 < 30
    assert pool.jobs["never"].state == "queued"


def test_a_quiet_block_starts_no_job_and_waits_for_the_running_ones(counter):
    pool = _started(counter, jobs=4, seconds=0.2)
    try:
        with pool.quiet():
            assert counter.now == 0
            started = list(counter.started)
            time.sleep(0.3)
            assert counter.started == started            # nothing started meanwhile
        for k in range(4):
            pool.result(f"j{k}")
    finally:
        pool.close()
    assert len(counter.started) == 4


# A process that prints, starts a grandchild holding its stdout and stderr, and exits at once: the
# shape of the 6 December hang (a build or a download whose worker outlived it).
_LEAVES_A_GRANDCHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("parent out"); print("parent err", file=sys.stderr)
"""


def test_a_job_returns_when_its_process_exits_though_a_grandchild_holds_its_output():
    pool = background.Pool(1)
    pool.submit("leaves", lambda: pool.run([sys.executable, "-c", _LEAVES_A_GRANDCHILD], 120))
    pool.start()
    t0 = time.monotonic()
    job = pool.result("leaves")
    took = time.monotonic() - t0
    pool.close()
    assert job.error is None, job.error
    assert job.value.returncode == 0
    assert job.value.stdout == "parent out\n" and job.value.stderr == "parent err\n"
    assert took < 30                # not the grandchild's 60 s


def test_a_job_past_its_timeout_is_killed_with_its_output_so_far():
    pool = background.Pool(1)
    code = "import sys, time; print('begun', flush=True); time.sleep(60)"
    pool.submit("slow", lambda: pool.run([sys.executable, "-c", code], 3))
    pool.start()
    job = pool.result("slow")
    pool.close()
    assert isinstance(job.error, background.subprocess.TimeoutExpired)
    assert job.error.output == "begun\n"
    assert job.procs[0].poll() is not None


_BURNS = ("import subprocess, sys, time\n"
          "t = time.process_time()\n"
          "while time.process_time() - t < 0.6:\n"
          "    pass\n"
          "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
          "while time.process_time() - t < 0.6:\\n    pass'])\n")


def test_the_job_log_gives_each_job_the_cpu_seconds_of_its_processes(tmp_path, monkeypatch):
    """A job's CPU seconds (its process and the child it waited for), in the log's fifth column:
    wall time on a loaded machine says little of a job's own work."""
    log = tmp_path / "jobs.tsv"
    monkeypatch.setattr(background, "_JOBLOG", str(log))
    pool = background.Pool(1)
    pool.submit("burns", lambda: pool.run([sys.executable, "-c", _BURNS], 120))
    pool.submit("sleeps", lambda: pool.run([sys.executable, "-c", "import time; time.sleep(60)"], 1))
    pool.start()
    try:
        burns, sleeps = pool.result("burns"), pool.result("sleeps")
    finally:
        pool.close()
    assert burns.value.returncode == 0 and 1.2 <= burns.cpu < 30
    assert isinstance(sleeps.error, subprocess.TimeoutExpired) and sleeps.cpu < 1
    rows = {line.split("\t")[0]: line.rstrip("\n").split("\t") for line in log.read_text().splitlines()}
    assert float(rows["burns"][4]) == pytest.approx(burns.cpu, abs=0.05)


# A script as the forker runs it: main(argv) in a child of tests/forker.py (tests/background.py,
# Pool.run_script): prints to both streams, burns CPU, sleeps, returns its first argument.
_SCRIPT = """
import os, sys, time
def main(argv):
    print("out", os.environ.get("PERFLAB_FORK_PROBE"), flush=True)
    print("err", file=sys.stderr)
    t = time.process_time()
    while time.process_time() - t < float(argv[1]):
        pass
    time.sleep(float(argv[2]))
    return int(argv[0])
"""


@pytest.mark.skipif(not background.FORK or not background._no_gpu(), reason="jobs are not forked here")
def test_a_script_job_is_forked_and_hands_back_what_a_fresh_process_would(tmp_path, monkeypatch):
    """The output, exit status, CPU seconds and environment of ``python SCRIPT ARGV`` (the
    pool's, not what a test set later), and a job past its timeout killed with its output."""
    script = tmp_path / "forked_probe.py"
    script.write_text(_SCRIPT)
    monkeypatch.setenv("PERFLAB_FORK_PROBE", "pool")
    pool = background.Pool(1)
    monkeypatch.setenv("PERFLAB_FORK_PROBE", "test")
    pool.submit("ok", lambda: pool.run_script(script, ["3", "0.6", "0"], 120))
    pool.submit("slow", lambda: pool.run_script(script, ["0", "0", "60"], 3))
    pool.start()
    try:
        ok, slow = pool.result("ok"), pool.result("slow")
    finally:
        pool.close()
    assert ok.error is None, ok.error
    assert isinstance(ok.procs[0], background._Child)          # forked, not a fresh process
    assert ok.value.args == [sys.executable, str(script), "3", "0.6", "0"]
    assert ok.value.returncode == 3
    assert ok.value.stdout == "out pool\n" and ok.value.stderr == "err\n"
    assert 0.6 <= ok.cpu < 30
    assert isinstance(slow.error, subprocess.TimeoutExpired) and slow.error.output == "out pool\n"
    assert slow.procs[0].poll() is not None
    assert len(pool.forkers) == 1 and pool.forkers[0].proc.poll() is not None   # ended by close


@pytest.mark.skipif(not background.FORK or not background._no_gpu(), reason="jobs are not forked here")
def test_closing_the_pool_kills_a_running_forked_job(tmp_path):
    script = tmp_path / "forked_sleeper.py"
    script.write_text(_SCRIPT)
    pool = background.Pool(1)
    pool.submit("sleeper", lambda: pool.run_script(script, ["0", "0", "60"], 120))
    pool.start()
    child = _first_process(pool, "sleeper", within_s=60)
    t0 = time.monotonic()
    pool.close()
    assert child.poll() is not None and time.monotonic() - t0 < 30
    assert pool.forkers[0].proc.poll() is not None
