"""Shared set-up of the unit tests: the repository root on sys.path and small CPU problem sizes.
(Caches and scratch files are kept inside the clone by the root conftest.py.)"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PERFLAB_FORCE_CPU_SIZES", "1")

# The built book (one build per session, shared by tests/test_book.py and tests/test_reader.py).
from book_site import build, rendered, server  # noqa: E402,F401

# Heavy, independent work (chapter executions, lab runs, book builds) starts when the session
# does, two pieces at a time, ahead of the tests that read it (tests/background.py). Each test
# module that has such work names it in ``background_jobs(items, tmp_path_factory)``.
import background  # noqa: E402
import pytest  # noqa: E402


#: fixtures whose values are background jobs' results (tests/book_site.py, tests/test_reader.py)
JOB_FIXTURES = {"build", "rendered", "server", "student_build"}

#: modules that run last, after every module that reads a background job, so that no job runs
#: beside them (where they stood when the jobs were done by the time the tests reached them): the
#: DataLoader's (worker processes timed against the cores). A module with a test marked ``alone``
#: joins them (that test would stop the jobs while they run; tests/test_lab05.py, whose module
#: fixture sets PERFLAB_DATA_DIR in this process's environment while its tests run: a job
#: started then would inherit it).
QUIET_TAIL = ("test_loading.py",)

#: modules that run beside fewer jobs than the pool's two: the grader's grades two submissions at
#: a time under time limits (a memory bomb must reach its limit within 30 s of cells on a loaded
#: machine): one job beside it, as much load as stress-ng's two processes gave it before, and the
#: core its sandboxes leave idle (kernel starts, sleeping submissions) does the job's work. Its two
#: large gradings (the ``graded`` fixtures) run earlier as jobs of their own, beside one job and
#: the test process (tests/test_grade.py): the module's own tests still run in this block.
#: The modules that start a Jupyter kernel in the test process (test_execute, test_plotting,
#: test_provenance: nbclient gives a kernel 60 s to answer) ran in the quiet tail from 6 December,
#: after test_execute's kernel did not answer in time beside two jobs on a machine loaded far
#: beyond CI's; there they kept a core idle for ~55 s of a CI run. Beside one job the machine is
#: as loaded as CI's two cores are by the test and one other process
NARROW = {"test_grade.py": 1, "test_execute.py": 1, "test_plotting.py": 1, "test_provenance.py": 1}


#: modules whose tests are placed one by one (:func:`pytest_collection_modifyitems`): they read
#: the book's jobs only through the fixtures of :data:`JOB_FIXTURES` (and their own jobs, the
#: course download's runs and the student build, only in tests that take ``build`` or
#: ``student_build``), so a test without those fixtures reads no job. Placed by module, every test
#: of tests/test_reader.py ran after the chapters and labs, one core idle: ~100 s of its ~120 s
#: were tests of small books of their own and of Chromium on a page of their own.
BY_TEST = ("test_reader.py", "test_book.py")


def _reads_jobs(module, items) -> bool:
    """Whether a test module reads a background job's result (a chapter, a lab, the book)."""
    lab_run = getattr(module, "lab_run", None)
    return (getattr(module, "background_jobs", None) is not None
            or getattr(lab_run, "__module__", None) == "lab_runs"
            or any(JOB_FIXTURES & set(getattr(item, "fixturenames", ())) for item in items))


SETTLE = pytest.StashKey[bool]()


def _group(module, its, item) -> int:
    """Where ``item`` (a test of ``module``, whose tests are ``its``) runs: 0, it reads no job;
    1, it reads only the book's jobs (:data:`JOB_FIXTURES`, a test of :data:`BY_TEST`); 2, its
    module reads a chapter's or a lab's run; 3, the quiet tail (:data:`QUIET_TAIL`, and a test
    marked ``alone``, with its module where the module is not placed test by test)."""
    name = Path(getattr(module, "__file__", "") or "").name
    if name in QUIET_TAIL:
        return 3
    if name in BY_TEST:
        if item.get_closest_marker("alone"):
            return 3
        return 1 if JOB_FIXTURES & set(getattr(item, "fixturenames", ())) else 0
    if any(i.get_closest_marker("alone") for i in its):
        return 3
    return 2 if _reads_jobs(module, its) else 0


def pytest_collection_modifyitems(session, config, items):
    """Tests in four groups, each in its usual (alphabetical) order of modules and each module's
    tests in theirs: those that read no background job first, while the jobs run beside them;
    then the tests that read only the book's jobs (built and rendered by then); then the modules
    that read a chapter's or a lab's run (the jobs that run beside others settle first: by then
    most are done); then :data:`QUIET_TAIL`, once every job is done.

    In file order the test process waited for the book and the chapters early on (about five
    minutes of the last unloaded run, the jobs on both cores) and ran the later, independent
    modules after the jobs had finished, one core idle: the same tests, in this order, keep both
    cores busy. Only the order of tests changes; no test's set-up or checks do. The modules of
    :data:`BY_TEST` are placed test by test (a module fixture of theirs may then be set up once
    per group); the others whole. The grader's module runs in the first group beside one job
    (:data:`NARROW`)."""
    if background.SLOTS <= 0:
        return
    modules: dict = {}
    for item in items:
        modules.setdefault(getattr(item, "module", None), []).append(item)
    placed = [(_group(module, its, item), item) for module, its in modules.items() for item in its]
    placed.sort(key=lambda gi: gi[0])       # stable: file order within a group
    items[:] = [item for _, item in placed]
    # the first test of the third and fourth groups settles the jobs (those of the second wait
    # for the book's jobs alone, through their fixtures)
    seen = set()
    for g, item in placed:
        if g >= 2 and g not in seen:
            seen.add(g)
            item.stash[SETTLE] = True


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    factory = session.config._tmp_path_factory
    jobs, seen = [], set()
    for plan in background.FIXTURE_PLANS:      # session fixtures' jobs (the book), then modules'
        jobs += plan(session.items, factory)
    for item in session.items:
        module = getattr(item, "module", None)
        plan = getattr(module, "background_jobs", None)
        if plan is not None and module not in seen:
            seen.add(module)
            jobs += plan(session.items, factory)
    if any(background.CEILINGS in after for *_, after in jobs):
        jobs += background.ceilings_job(session.items)
    background.start(jobs)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    try:
        return (yield)
    finally:
        _module_span(None)
        background.stop()


_SPAN: list = []        # the test module running now, and when its first test began


def _module_span(item) -> None:
    """Log the last module's span when the tests move on to another (PERFLAB_TEST_JOBLOG)."""
    module = getattr(item, "module", None)
    if _SPAN and (item is None or _SPAN[0] is not module):
        background.log_span(f"tests {Path(getattr(_SPAN[0], '__file__', '?')).name}", _SPAN[1], "tests")
        _SPAN.clear()
    if item is not None and not _SPAN:
        _SPAN[:] = [module, time.monotonic()]


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs with no background job beside it (tests/background.py)")


_NARROWED: list = []    # the module running beside fewer jobs, and its block (NARROW)


def _narrow(item) -> None:
    """Enter a NARROW module's block at its first test; leave it after its last (below)."""
    module = getattr(item, "module", None)
    slots = NARROW.get(Path(getattr(module, "__file__", "") or "").name)
    if slots is not None and not _NARROWED:
        block = background.narrow(slots)
        block.__enter__()
        _NARROWED[:] = [module, block]


def _widen(nextitem) -> None:
    """Leave the NARROW block once the next test is of another module (or none is left)."""
    if _NARROWED and getattr(nextitem, "module", None) is not _NARROWED[0]:
        _NARROWED.pop().__exit__(None, None, None)
        _NARROWED.clear()


_AWAITED: set = set()   # modules whose BACKGROUND_KEYS have been waited for


def _await_jobs(item) -> None:
    """Before a module's first test, wait for the background jobs it names in ``BACKGROUND_KEYS``
    (read by a module that stays in the first group: the grader's gradings, tests/test_grade.py),
    so that none of them still runs beside its tests, nor holds a slot of its narrow block."""
    module = getattr(item, "module", None)
    if module is not None and module not in _AWAITED:
        _AWAITED.add(module)
        for key in getattr(module, "BACKGROUND_KEYS", ()):
            background.result(key)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _module_span(item)
    _await_jobs(item)
    _narrow(item)
    try:
        return (yield from _protocol(item))
    finally:
        _widen(nextitem)


def _protocol(item):
    if item.stash.get(SETTLE, False):
        # the jobs that may run beside others finish first: the lab runs and chapters marked
        # alone, asked for next, then start one after another, none waiting for another job
        background.settle()
    if item.get_closest_marker("alone") is None:
        return (yield)
    with background.quiet():
        return (yield)
