"""Test helper: a session's heavy, independent work started ahead of the tests that read it, two
pieces at a time (CI has two cores).

Executing a chapter, running a lab in its kernel, building the book: each is a process of its
own, whose result one or more tests read. Run in test order, one at a time, they leave the second
core idle while the test process waits for them. Here they are queued when the session starts
(:func:`start`, from tests/conftest.py, in the order of the first test that reads each) and run
by :data:`SLOTS` worker threads, each job a subprocess; a test asks for its job's result
(:func:`result`) and waits for it, or finds it done. The test asserts on the result exactly as it
would on a run it made itself: what a test checks does not change, only when the work is done.

* Each job writes into its own folder (a ``tmp_path_factory`` folder per job): no scratch folder
  is shared, and what two jobs share (Inductor's cache, the ceilings file) is written by the
  first job alone (``after``).
* A job marked ``alone`` is not started ahead: it runs when its test asks for it, once the running
  jobs have finished, with nothing beside it: the pages whose checks or predictions time the
  CPU against itself and failed beside another job and ``stress-ng --cpu 2`` (chapters 3.1
  and 8, ``tests/test_chapters.py``; labs 5, 8 and 10, ``tests/lab_runs.py``). A test marked
  ``@pytest.mark.alone`` likewise runs with no job beside it (:func:`quiet`).
* A test run that selects a job's tests only (``pytest -k 05_``) queues only that job; a test
  that asks for a job nobody queued (the session was not started here, or ``SLOTS`` is 0) gets
  ``None`` from :func:`result` and does the work itself, as before.
* When the session ends early (``-x``, Ctrl-C), queued jobs are dropped and running ones killed
  (their process groups), so no process outlives the session.
* A page's execution (``scripts/execute.py``) and a lab's run (``tests/lab_runs.py``) are forked
  from a process that imported the script once (:meth:`Pool.run_script`, tests/forker.py): the
  same ``main(argv)`` in a process of its own, without the ~3 CPU-s of torch, matplotlib and
  jupytext imports a fresh one paid before its page's kernel started (38 such jobs a session).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

# Two workers (CI's two cores); PERFLAB_TEST_SLOTS=0 runs every job in its test instead. Until
# 6 December a job read its process's output through pipes, and a fresh-clone run hung when a
# grandchild outlived its parent holding them: jobs now write to files and wait for the process
# itself (Pool.run; tests/test_background.py reproduces the hang).
SLOTS = int(os.environ.get("PERFLAB_TEST_SLOTS", "2"))


@dataclass
class Job:
    key: str
    fn: Callable[[], Any]
    alone: bool = False                 # runs only when asked for, with nothing beside it
    light: bool = False                 # mostly waits: runs on a worker of its own, beside the slots
    after: tuple[str, ...] = ()         # keys of jobs that must finish first
    priority: float = 0                 # higher starts sooner, among jobs not asked for
    state: str = "queued"               # queued, running, done
    asked: bool = False                 # a test waits for it
    value: Any = None
    error: BaseException | None = None
    procs: list = field(default_factory=list)
    cpu: float | None = None            # CPU seconds of its processes run by Pool.run (the job log)


class Pool:
    """Jobs run by ``slots`` worker threads in queue order (asked-for jobs first, then those of
    higher ``priority``)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.jobs: dict[str, Job] = {}
        self.queue: list[Job] = []
        self.cond = threading.Condition()
        self.closed = False
        self.paused = 0                 # tests running that need the machine to themselves
        self.limits: list[int] = []     # blocks running that allow fewer jobs at once (narrow)
        self.threads = [threading.Thread(target=self._work, name=f"background-{i}", daemon=True)
                        for i in range(slots)]
        # one more worker for light jobs (their own queue order), which take no slot
        self.threads.append(threading.Thread(target=self._work, args=(True,), name="background-light",
                                             daemon=True))
        self.local = threading.local()
        # the environment every job's process gets (unless its job passes one): this process's
        # when the session starts, not when the job does. A test may change os.environ while it
        # runs (monkeypatch.setenv; scripts/execute.py run in the test process points
        # $PERFLAB_CEILINGS at the committed reference file where it sees a GPU, and a test fakes
        # one): a job started meanwhile would otherwise inherit what the test set
        self.env = dict(os.environ)
        self.forkers: list[Forker] = []     # each worker's, started by its first script job

    def submit(self, key: str, fn: Callable[[], Any], alone: bool = False, after: tuple[str, ...] = (),
               priority: float = 0, light: bool = False) -> None:
        with self.cond:
            if key in self.jobs:
                raise ValueError(f"job {key!r} submitted twice")
            if light and alone:
                raise ValueError(f"job {key!r}: a light job runs beside others, it cannot be alone")
            job = Job(key, fn, alone=alone, after=tuple(a for a in after if a in self.jobs), priority=priority,
                      light=light)
            self.jobs[key] = job
            self.queue.append(job)
            self.cond.notify_all()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state == "running"]

    def _next(self, light: bool = False) -> Job | None:
        """The job a free worker may start now (lock held), or None: for a slot's worker one not
        light, while fewer than ``slots`` such run; for the light worker (``light``) a light one.
        An alone job runs with nothing beside it, light jobs included."""
        running = self._running()
        if any(j.alone for j in running):
            return None
        if light:
            if any(j.light for j in running):
                return None
        elif sum(not j.light for j in running) >= min(self.limits, default=self.slots):
            return None
        # asked-for jobs first, then by priority (LONG_JOBS), then queue order
        for job in sorted(self.queue, key=lambda j: (not j.asked, -j.priority)):
            if job.light != light:
                continue
            if any(self.jobs[a].state != "done" for a in job.after):
                continue
            if self.paused and not job.asked:      # a quiet test runs: only what it waits for
                continue
            if job.alone:
                if job.asked and not running:
                    return job
                if job.asked:
                    return None          # let the running jobs drain; start nothing beside it
                continue
            return job
        return None

    def _work(self, light: bool = False) -> None:
        while True:
            with self.cond:
                while not self.closed and (job := self._next(light)) is None:
                    self.cond.wait()
                if self.closed:
                    return
                self.queue.remove(job)
                job.state = "running"
            self.local.job = job
            began = time.monotonic()
            try:
                job.value = job.fn()
            except BaseException as e:  # noqa: BLE001 - handed to the test that asks
                job.error = e
            finally:
                self.local.job = None
                _log(job, began)
                with self.cond:
                    job.state = "done"
                    self.cond.notify_all()

    def _ask(self, job: Job) -> None:
        """Mark ``job`` and the jobs it comes after as waited for (lock held)."""
        job.asked = True
        for key in job.after:
            if not self.jobs[key].asked:
                self._ask(self.jobs[key])

    def result(self, key: str) -> Job | None:
        """Wait for job ``key`` (asking for it moves it ahead of the queue); None if not queued."""
        with self.cond:
            job = self.jobs.get(key)
            if job is None:
                return None
            self._ask(job)
            self.cond.notify_all()
            while job.state != "done":
                if self.closed:
                    return None
                self.cond.wait()
        return job

    def settle(self) -> None:
        """Wait until the jobs that run beside others are done (those marked alone may be left:
        each runs when asked, and now none waits for a running job to drain first)."""
        def open_(j: Job) -> bool:
            return j.state != "done" and not j.alone and not any(self.jobs[a].alone for a in j.after)

        with self.cond:
            while not self.closed and any(open_(j) for j in self.jobs.values()):
                self.cond.wait()

    @contextlib.contextmanager
    def narrow(self, slots: int):
        """At most ``slots`` jobs (light ones aside) run while the block does: it waits until no
        more run, and starts no other meanwhile."""
        with self.cond:
            self.limits.append(slots)
            while sum(not j.light for j in self._running()) > slots and not self.closed:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.limits.remove(slots)
                self.cond.notify_all()

    @contextlib.contextmanager
    def quiet(self):
        """Start no job, and wait for the running ones to finish, while the block runs."""
        with self.cond:
            self.paused += 1
            while self._running() and not self.closed:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.paused -= 1
                self.cond.notify_all()

    def _adopt(self, proc: subprocess.Popen | _Child):
        """Give ``proc`` to this worker's job (closing the pool kills it), and kill it now if
        the pool has closed meanwhile; returns the job (None outside a job)."""
        job = getattr(self.local, "job", None)
        if job is not None:
            job.procs.append(proc)
        with self.cond:
            closed = self.closed
        if closed:
            _kill(proc)
        return job

    def run(self, cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True)`` for a job: in a process group
        of its own, killed when the pool closes.

        The output goes to two unnamed files, not pipes, and the job waits for its process, not
        for end-of-file: a grandchild that outlives the process (a Jupyter kernel, a build's
        worker) and inherited the output would otherwise keep a pipe open, and the worker would
        wait on it for ever (the hang of 6 December). Once the process has exited, what is left
        of its process group is killed."""
        kwargs.setdefault("env", self.env)
        with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
            proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, start_new_session=True, **kwargs)
            job = self._adopt(proc)
            try:
                cpu = _wait(proc, timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _killpg(proc.pid)           # the group's leftovers (or, on timeout, all of it)
            if timed_out:
                cpu = _wait(proc, None)
            if job is not None and cpu is not None:
                job.cpu = (job.cpu or 0.0) + cpu
            out, err = (_read(f) for f in (out_f, err_f))
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, out, err)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def run_script(self, script: Path, argv: list[str], timeout: float, function: str = "main",
                   cwd: str | os.PathLike = ROOT) -> subprocess.CompletedProcess:
        """``python SCRIPT ARGV...`` for a job (as :meth:`run`, whose result it returns), run as
        ``SCRIPT``'s ``function(argv)`` in a child forked from this worker's :class:`Forker`,
        which imported the script once: a fresh process each time, without its imports (~2.6
        CPU-s a page). Where no forker can serve it (a GPU is visible, ``PERFLAB_TEST_FORK=0``,
        the forker did not start or died), a fresh process runs it through :meth:`run`."""
        cmd = [sys.executable, str(script), *map(str, argv)]
        forker = self._forker()
        if forker is None:
            return self.run(cmd, timeout, cwd=cwd)
        job = getattr(self.local, "job", None)
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "out", Path(folder) / "err"
            try:
                pid = forker.start(dict(module=script.stem, function=function, argv=[str(a) for a in argv],
                                        script=str(script), env=self.env, cwd=str(cwd),
                                        out=str(out), err=str(err)))
            except OSError:
                forker.close()
                return self.run(cmd, timeout, cwd=cwd)
            child = _Child(pid)
            self._adopt(child)
            ended = forker.wait(timeout)
            timed_out = ended is None
            _killpg(pid)                # the group's leftovers (or, on timeout, all of it)
            if timed_out:
                ended = forker.wait(None)
            if ended is None or ended == "gone":    # the forker died: its child is killed above
                forker.close()
                child.returncode, cpu = -signal.SIGKILL, None
            else:
                child.returncode, cpu = ended
            if job is not None and cpu is not None:
                job.cpu = (job.cpu or 0.0) + cpu
            texts = [p.read_text(encoding="utf-8", errors="replace") if p.exists() else "" for p in (out, err)]
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, *texts)
        return subprocess.CompletedProcess(cmd, child.returncode, *texts)

    def _forker(self) -> Forker | None:
        """This worker thread's forker (started on first use), or None where none may serve."""
        if not FORK or not _no_gpu():
            return None
        forker = getattr(self.local, "forker", None)
        if forker is None:
            with self.cond:
                if self.closed:
                    return None
                forker = Forker(self.env)
                self.forkers.append(forker)
            self.local.forker = forker
        return forker if forker.alive else None

    def close(self) -> None:
        """Drop the queued jobs, kill the running ones' processes, wait for the workers."""
        with self.cond:
            self.closed = True
            self.queue.clear()
            running = self._running()
            self.cond.notify_all()
        for job in running:
            for proc in job.procs:
                _kill(proc)
        for t in self.threads:
            if t.is_alive():
                t.join(timeout=60)
        for forker in self.forkers:
            forker.close()


# Jobs forked from a process that imported their script once (tests/forker.py). Off with
# PERFLAB_TEST_FORK=0, and where a GPU is visible: a process that may have touched CUDA is not
# forked (the scripts check for a GPU; CI and laptops without one are where the imports cost).
PRELOAD = ("execute", "lab_runs")


@functools.lru_cache(maxsize=None)
def _no_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


FORK = os.environ.get("PERFLAB_TEST_FORK", "1") != "0" and hasattr(os, "fork")


class _Child:
    """A forked job as :meth:`Pool.close` and :func:`_kill` see a process: ``pid`` (its group
    too) and ``poll()`` (its exit status once ended, else None)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode


class Forker:
    """``python tests/forker.py PRELOAD...``: the modules of :data:`PRELOAD` imported once,
    then a child forked per job (the protocol: tests/forker.py). One job at a time, by the
    worker thread that owns it."""

    def __init__(self, env: dict[str, str]):
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forker.py"), *PRELOAD],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
        self.buf = b""
        self.alive = True

    def start(self, request: dict) -> int:
        """Send one job; its child's pid once forked.

        Raises:
            OSError: the forker is gone (the caller runs the job in a fresh process instead).
        """
        if not self.alive:
            raise OSError("the forker is closed")
        try:
            os.write(self.proc.stdin.fileno(), (json.dumps(request) + "\n").encode())
        except (BrokenPipeError, ValueError) as e:
            self.alive = False
            raise OSError("the forker is gone") from e
        line = self._line(None)
        if line is None or not line.startswith("pid "):
            self.alive = False
            raise OSError(f"the forker did not fork: {line!r}")
        return int(line.split()[1])

    def wait(self, timeout: float | None):
        """``(exit status, CPU seconds)`` of the running job; None when ``timeout`` seconds
        passed first; ``"gone"`` when the forker died meanwhile."""
        line = self._line(timeout)
        if line is None:
            return None if self.alive else "gone"
        if not line.startswith("exit "):
            self.alive = False
            return "gone"
        _, code, cpu = line.split()
        return int(code), float(cpu)

    def _line(self, timeout: float | None) -> str | None:
        """The next line from the forker; None on timeout or at its end (then not alive)."""
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                fd = self.proc.stdout.fileno()
                if not select.select([fd], [], [], left)[0]:
                    return None
                chunk = os.read(fd, 1 << 16)
            except (OSError, ValueError):   # closed by Pool.close meanwhile
                chunk = b""
            if not chunk:
                self.alive = False
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        """End the forker (its input closed; killed if it does not end within 10 s)."""
        self.alive = False
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                f.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# PERFLAB_TEST_JOBLOG=FILE appends one line per finished job (its key, when it started and how
# long it ran, in seconds from the session's start, whether it ran alone, and its CPU seconds
# where known): where a test run's time goes, which pytest's --durations hides behind the tests
# that wait.
_T0 = time.monotonic()
_JOBLOG = os.environ.get("PERFLAB_TEST_JOBLOG")


def _log(job: Job, began: float) -> None:
    log_span(job.key, began, "alone" if job.alone else "", job.cpu)


def log_span(key: str, began: float, tag: str = "", cpu: float | None = None) -> None:
    """One line of the job log: ``key`` ran from ``began`` (``time.monotonic()``) until now; a
    fifth column, where known, the CPU seconds (user + system) of the processes the job ran
    through :meth:`Pool.run` and of their descendants that were waited for (a job's wall time
    on a loaded 2-core machine says little of its own work). The test process logs each test
    module's span too (tag ``tests``, tests/conftest.py)."""
    if _JOBLOG:
        with open(_JOBLOG, "a", encoding="utf-8") as f:
            f.write(f"{key}\t{began - _T0:.1f}\t{time.monotonic() - began:.1f}\t{tag}"
                    f"\t{'' if cpu is None else f'{cpu:.1f}'}\n")


def _wait(proc: subprocess.Popen, timeout: float | None) -> float | None:
    """``proc.wait(timeout)`` that also returns the CPU seconds of the process and of the
    descendants it waited for (``os.wait4``), or None where another caller reaped it first."""
    end = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, 0 if end is None else os.WNOHANG)
        except ChildProcessError:       # reaped elsewhere (Popen.poll from close())
            proc.wait()
            return None
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= end:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(proc: subprocess.Popen | _Child) -> None:
    if proc.poll() is None:
        _killpg(proc.pid)


def _read(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


_POOL: Pool | None = None


#: jobs that take far longer than the others (seconds they ran in a whole session on a loaded
#: 2-core machine, 7 December), by the stem of the page or lab they run: a worker starts them
#: before the others, longest first (their ``priority``). Every job that runs beside others is
#: done before the first test that reads one (tests/conftest.py settles them), so the order of
#: those jobs changes only when the last of them ends: queued in the order of their readers, lab 9
#: (~10 minutes beside other work) started after the grader's tests and ran on for minutes after
#: every other job was done, one core idle and the test process waiting (lab 9: 635 s, then 828 s
#: on a CPU without bf16 instructions; ~110 s unloaded since its exercise 4 runs at width 128 on
#: a CPU). The queue itself stays in reader order, so a job still follows the jobs it comes after
#: (those submitted before it).
LONG_JOBS = {"09_advanced": 200, "09_advanced_optimizations": 162, "01_why_training_is_slow": 118,
             "04_profiling": 67, "04_measuring_and_profiling": 66}

#: jobs that mostly wait, run by a worker of their own beside the two slots (``light``), from the
#: session's start: the grader's two batches (tests/test_grade.py), ~80 s of CPU in ~200 s each
#: (kernels starting, submissions sleeping or held until their time limit). In a slot (until
#: 7 December) they held it ~420 s of a loaded 2-core session with a core mostly idle. They are
#: done when the grader's module starts (it waits for them before its first test).
LIGHT_JOBS = ("grade the attacks", "grade issue 44's attacks")


def expected_seconds(key: str) -> float:
    """A job's priority: its :data:`LONG_JOBS` seconds, by the stem of the path its key ends with
    (0 for any other job)."""
    return LONG_JOBS.get(Path(key.split(" ", 1)[1]).stem, 0) if " " in key else 0


def start(jobs: list[tuple[int, str, Callable[[], Any], bool, tuple[str, ...]]]) -> None:
    """Queue ``jobs`` (``(index of the first test that reads it, key, fn, alone, after)``) in the
    order of their first reader, each with its :func:`expected_seconds` as its priority, and start
    the workers."""
    global _POOL
    if SLOTS <= 0 or not jobs:
        return
    _POOL = Pool(SLOTS)
    for _, key, fn, alone, after in sorted(jobs, key=lambda j: j[0]):
        _POOL.submit(key, fn, alone=alone, after=after, priority=expected_seconds(key),
                     light=key in LIGHT_JOBS)
    _POOL.start()


def result(key: str) -> Job | None:
    """The finished job ``key`` (its ``value``, or the ``error`` it raised), or None when no
    session pool queued it: the caller then does the work itself."""
    return _POOL.result(key) if _POOL is not None else None


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run a job's process (see :meth:`Pool.run`); outside a pool, a plain captured run."""
    if _POOL is not None:
        return _POOL.run(cmd, timeout, **kwargs)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def run_script(script: Path, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGV...`` for a job, forked from a process that imported it (see
    :meth:`Pool.run_script`); outside a pool, a plain captured run."""
    if _POOL is not None:
        return _POOL.run_script(script, argv, timeout)
    return run([sys.executable, str(script), *map(str, argv)], timeout, cwd=ROOT)


def environ() -> dict[str, str]:
    """The environment a job's process starts from: the session's at its start (:class:`Pool`),
    or, outside a pool, this process's now."""
    return dict(_POOL.env if _POOL is not None else os.environ)


def settle() -> None:
    """Wait for every job not marked alone (:meth:`Pool.settle`); at once outside a pool."""
    if _POOL is not None:
        _POOL.settle()


def narrow(slots: int):
    """A block beside which at most ``slots`` jobs run (:meth:`Pool.narrow`)."""
    return _POOL.narrow(slots) if _POOL is not None else contextlib.nullcontext()


def quiet():
    """A block that runs with no job beside it (a test that times the CPU against itself, marked
    ``@pytest.mark.alone``; tests/conftest.py)."""
    return _POOL.quiet() if _POOL is not None else contextlib.nullcontext()


def stop() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


# ---------------------------------------------------------------------------------------------
# The jobs
# ---------------------------------------------------------------------------------------------

CEILINGS = "ceilings"
EXECUTE_TIMEOUT_S = 900          # scripts/execute.py's --timeout, per notebook, as the tests gave it


def ceilings_job(items) -> list:
    """Measure this machine's ceilings once, before the pages that read them run side by side
    (each page otherwise measures and writes them itself when the cache file is missing: two at
    once would both measure, and both write one file)."""
    return [(-1, CEILINGS, functools.partial(run, [sys.executable, "-m", "perflab.machine.ceilings"], 600,
                                             cwd=ROOT), False, ())]


def _execute(md: Path, out: Path) -> subprocess.CompletedProcess:
    import course_download   # it imports this module

    if course_download.from_download(md):   # chapter 8: run by the installed course download
        return course_download.execute(md, out, EXECUTE_TIMEOUT_S)
    return run_script(ROOT / "scripts" / "execute.py", [str(md), "--out", str(out), "--timeout",
                                                       str(EXECUTE_TIMEOUT_S)], EXECUTE_TIMEOUT_S + 300)


#: pages that build the same data into the clone's cache (``perflab.loading.datasets.cache_dir``,
#: written once and then reused): each runs after the first of them, never beside it, so that two
#: never write one file at once. Chapter 10's two pages, lab 10 and the pending multi-GPU page
#: read one GPT-2 corpus (text_corpus(max_bytes=300_000) on a CPU).
SHARED_DATA = {"10_gpt2_memory_ladder": "book/10_gpt2_case_study.md",
               "10_multi_gpu": "book/10_gpt2_case_study.md",
               "10_gpt2_speedrun": "book/10_gpt2_case_study.md"}


def after_shared_data(stem: str) -> tuple[str, ...]:
    """The job keys a page's job must follow (the ceilings; the first page that builds its data)."""
    first = SHARED_DATA.get(stem)
    return (CEILINGS,) + ((f"execute {ROOT / first}",) if first else ())


def executions(items, test_name: str, tmp_path_factory, alone: tuple[str, ...] = ()) -> list:
    """Jobs for the items of test ``test_name`` (parametrized by ``md``): each executes its page
    with ``scripts/execute.py --out`` into a folder of its own; the pages named in ``alone``
    (stems) run with nothing beside them."""
    jobs = []
    for i, item in enumerate(items):
        if getattr(item, "originalname", None) == test_name:
            md = item.callspec.params["md"]
            out = tmp_path_factory.mktemp(f"execute-{md.stem}")
            jobs.append((i, f"execute {md}", functools.partial(_execute, md, out), md.stem in alone,
                         after_shared_data(md.stem)))
    return jobs


def executed(md: Path, tmp_path: Path) -> int:
    """The exit status of ``scripts/execute.py md --out ...`` (its output printed): the job's, if
    one ran ahead, else executed here now into ``tmp_path``; a page of
    ``course_download.FROM_DOWNLOAD`` is executed by the installed course download."""
    job = result(f"execute {md}")
    if job is None:
        import course_download   # it imports this module
        import execute  # scripts/ (on sys.path in the test modules)

        if not course_download.from_download(md):
            return execute.main([str(md), "--out", str(tmp_path), "--timeout", str(EXECUTE_TIMEOUT_S)])
        proc = _execute(md, tmp_path)
    elif job.error is not None:
        raise job.error
    else:
        proc = job.value
    out = Path(proc.args[proc.args.index("--out") + 1])
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    if proc.returncode == 0:
        shutil.rmtree(out, ignore_errors=True)      # as a passing test's tmp_path
    else:
        print(f"(executed into {out})")
    return proc.returncode


#: planners of jobs that session fixtures read (``plan(items, tmp_path_factory) -> jobs``), and
#: module fixtures of a module that keeps its place among those that read no job (the grader's)
FIXTURE_PLANS: list = []
